"""Host time of a view op against a kernel op, forward under autograd and backward, on the device.

    python benchmarks/host_op_kinds.py --out $OUT/host_op_kinds.json

The cost model's eager host floor is a rate per traced aten op (compute.host_floor), views included, fitted on
blocks whose ops are about half views. A linear-attention layer's torch fallback (Qwen3-Next's DeltaNet: 847 of
1416 forward ops views) ran GPU-paced where that rate paced it by the host (s96). This times chains of one op
kind on tiny bf16 CUDA tensors that need gradients (the GPU never paces them): per op, the forward's host time
(dispatch and autograd recording) and the backward's (autograd engine), for views (transpose, view, a slice,
unsqueeze) and for kernels (mul, add, a cast, silu). Each number is the median of `--repeats` chains.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

CHAIN = 400


def _ops() -> dict[str, Callable]:
    import torch
    import torch.nn.functional as F
    return {
        "transpose": lambda y: y.transpose(0, 1),
        "view": lambda y: y.view(y.shape[1], y.shape[0]),
        "slice": lambda y: y[:, : y.shape[1]],
        "unsqueeze": lambda y: y.unsqueeze(0)[0],
        "mul": lambda y: y * 1.0001,
        "add": lambda y: y + 1.0,
        "cast": lambda y: y.float().to(torch.bfloat16),
        "silu": F.silu,
    }


VIEWS = ("transpose", "view", "slice", "unsqueeze")


def time_chain(op: Callable, repeats: int) -> tuple[float, float]:
    """(forward, backward) host seconds per op of a CHAIN-long chain of `op` (cast: two ops a link)."""
    import torch
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = [], []
    for _ in range(repeats + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = x
        for _ in range(CHAIN):
            y = op(y)
        t1 = time.perf_counter()
        loss = y.float().sum()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        fwd.append((t1 - t0) / CHAIN)
        bwd.append((t3 - t2) / CHAIN)
    return statistics.median(fwd[2:]), statistics.median(bwd[2:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import torch
    rows = {}
    for name, op in _ops().items():
        f, b = time_chain(op, args.repeats)
        rows[name] = {"kind": "view" if name in VIEWS else "kernel", "fwd_us": 1e6 * f, "bwd_us": 1e6 * b}
        print(f"{name:10s} {rows[name]['kind']:6s} fwd {1e6 * f:6.2f} us  bwd {1e6 * b:6.2f} us a link", flush=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "chain": CHAIN, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
