"""Bandwidth fractions of the kernel families the trainer's update and the non-vectorized elementwise path
run, on one GPU (docs/trainer_sweep_notes.md, "Twelfth session"):

    python benchmarks/strided_kernels.py --out $OUT/strided_kernels.json

The `strided` family exactly as `autoparallel calibrate` measures it (calibrate._class_kernels, with its
default sizes), three neighbours for reference, the four parts of `strided` alone beside their dense
counterparts, products with a broadcast input by the dimension the broadcast runs along, and the fused AdamW kernel over fp32 tensors of several counts and sizes (called directly, and
through torch.optim.AdamW(fused=True)): achieved bytes / s over the profile's bandwidth, the bytes as the tracer
counts them (inputs read + outputs written; AdamW's 28 a parameter, cost_models.compute.ADAM_BYTES).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch
    import torch.nn.functional as F

    import autoparallel.calibrate as cal
    from hardware_profiles import load_profile
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shrink", type=int, default=1, help="divide the sizes (a smoke test on a CPU)")
    args = ap.parse_args()
    bw = load_profile(args.profile).memory_bandwidth
    # calibrate's default sizes (measure_kernel_classes' rows) and repeats
    rows = max(1, cal.CalibrationPlan.class_bytes // (2048 * 2) // args.shrink)
    reps, warmup = cal.CalibrationPlan.reps, cal.CalibrationPlan.warmup
    dev = torch.device(args.device)
    kernels = cal._class_kernels(rows, dev)
    res = {}
    for name in ("strided", "broadcast_binary", "broadcast_binary_fp32", "cast", "rms_norm"):
        fn, nbytes = kernels[name]
        res[name] = nbytes / cal.time_call(fn, dev, reps, warmup) / bw
    h = 2048
    gu = torch.randn(rows, 2 * h, device=dev, dtype=torch.bfloat16)
    gate, up = gu[:, :h], gu[:, h:]
    x = torch.randn(rows, h, device=dev, dtype=torch.bfloat16)
    heads = x.reshape(rows, 16, h // 16)
    parts = {"mul_halves": (lambda: gate * up, 3), "silu_half": (lambda: F.silu(gate), 2),
             "cat_halves": (lambda: torch.cat((up, gate), -1), 4),
             "transpose_copy": (lambda: heads.transpose(0, 1).contiguous(), 2),
             "mul_dense": (lambda: x * x, 3), "silu_dense": (lambda: F.silu(x), 2), "copy_dense": (lambda: x.clone(), 2)}
    # units: tensors of rows x h bf16 elements read + written as the tracer counts them (x * x: two reads of x,
    # which the kernel makes once, so its fraction reads 3/2 high)
    for name, (fn, units) in parts.items():
        res[name] = rows * h * 2.0 * units / cal.time_call(fn, dev, reps, warmup) / bw
    res.update(broadcast_fractions(rows, h, dev, bw, reps, warmup))
    res.update(adamw_fractions(dev, bw, reps, warmup, args.shrink))
    text = json.dumps({"device": torch.cuda.get_device_name() if dev.type == "cuda" else str(dev), "torch": torch.__version__,
                       "fraction_of_bandwidth": {k: round(v, 3) for k, v in res.items()}})
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def broadcast_fractions(rows: int, h: int, dev: Any, bw: float, reps: int, warmup: int) -> dict[str, float]:
    """Elementwise products with one input broadcast to the output, by where the broadcast runs: along the
    last dimension (a [rows, 1] column: a norm's x * rsqrt, routed tokens times their scores), along leading
    dimensions only (a [h] weight over every row: a norm's weight * x; a [seq, d] table over batch and heads:
    RoPE's x * cos), in bf16 and in the fp32 a Hugging Face RMSNorm computes in. Bytes as the tracer counts
    them: every input at its own size read once, the output written."""
    import torch

    import autoparallel.calibrate as cal
    bf, f32 = torch.bfloat16, torch.float32
    x, x32 = torch.randn(rows, h, device=dev, dtype=bf), torch.randn(rows, h, device=dev, dtype=f32)
    col, col32 = torch.randn(rows, 1, device=dev, dtype=bf), torch.rand(rows, 1, device=dev, dtype=f32)
    w, w32 = torch.randn(h, device=dev, dtype=bf), torch.randn(h, device=dev, dtype=f32)
    heads, d = 16, 128
    q = torch.randn(rows // 2048 or 1, heads, 2048, d, device=dev, dtype=bf)   # [b, heads, seq, d]
    cos = torch.randn(1, 1, 2048, d, device=dev, dtype=bf)
    cases = {"bcast_last_bf16": (lambda: x * col, (x, col)), "bcast_last_fp32": (lambda: x32 * col32, (x32, col32)),
             "bcast_lead_bf16": (lambda: x * w, (x, w)), "bcast_lead_fp32": (lambda: x32 * w32, (x32, w32)),
             "bcast_lead_bf16_fp32": (lambda: w * x32, (w, x32)), "bcast_lead_rope": (lambda: q * cos, (q, cos))}
    out = {}
    for name, (fn, ins) in cases.items():
        y = fn()
        nbytes = sum(t.numel() * t.element_size() for t in ins) + y.numel() * y.element_size()
        out[name] = nbytes / cal.time_call(fn, dev, reps, warmup) / bw
    return out


def adamw_fractions(dev: Any, bw: float, reps: int, warmup: int, shrink: int) -> dict[str, float]:
    """torch._fused_adamw_ over `count` fp32 tensors of `total` parameters together, and the same through
    torch.optim.AdamW(fused=True)."""
    import torch

    import autoparallel.calibrate as cal
    out = {}
    for count, total in ((8, 64 * 2**20), (64, 64 * 2**20), (8, 256 * 2**20), (237, 1300 * 10**6 // 4)):
        n = max(1, total // count // shrink)
        p, g, m = ([torch.randn(n, device=dev) for _ in range(count)] for _ in range(3))
        v = [torch.rand(n, device=dev) for _ in range(count)]
        steps = [torch.zeros((), device=dev) for _ in range(count)]

        def fused(p: list = p, g: list = g, m: list = m, v: list = v, steps: list = steps) -> None:
            torch._fused_adamw_(p, g, m, v, [], steps, lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8,
                                amsgrad=False, maximize=False)
        out[f"adamw_{count}x{n}"] = count * n * 28.0 / cal.time_call(fused, dev, reps, warmup) / bw
        params = [torch.nn.Parameter(x) for x in p]
        for x, grad in zip(params, g, strict=True):
            x.grad = grad
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        out[f"adamw_optim_{count}x{n}"] = count * n * 28.0 / cal.time_call(opt.step, dev, reps, warmup) / bw
        del p, g, m, v, params, opt
    return out


if __name__ == "__main__":
    sys.exit(main())
