"""Host time per kernel a compiled graph launches (cost_models.host host_us_per_compiled_launch), apart from the
rest of a block: a torch.compile'd chain of `n` small linear layers with a ReLU (a cuBLAS GEMM and a Triton
kernel each forward and backward, their outputs allocated as in a block: a block's own mix of launches), on
tensors small enough that the GPU never paces the host. Each graph's kernels are counted in one profiled call (profile_timeline.launch_regions);
the host time per call against them (interleaved, medians) has the per-launch rate as its slope and the graph
call as its intercept; run beside `calibrate --trainer --rescale` to bring the rate to the base profile's host.

    python benchmarks/compiled_launch_rate.py --out $OUT/launch_rate.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

COUNTS = (2, 4, 8, 16, 32)


def chain(n: int, w: torch.Tensor):
    """n GEMMs, each followed by a ReLU: two kernels a layer forward, about three backward (s79 profiled 4n
    forward and 3n + 1 backward; `w` takes no gradient): the count a call launches is what `kernels` reads."""
    def f(x: torch.Tensor) -> torch.Tensor:
        for _ in range(n):
            x = torch.relu(x @ w)
        return x
    return f


def kernels(fn, x: torch.Tensor) -> tuple[float, float]:
    """Kernels one call of compiled `fn` launches in its forward graph and its backward graph (one profiled call)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_timeline import LAUNCH_REGIONS, regions_of_call
    regions = regions_of_call(lambda: fn(x).sum().backward())
    return tuple(regions.get(k, {}).get("launches", float("nan")) for k in LAUNCH_REGIONS[:2])


def measure(rounds: int, calls: int) -> list[dict]:
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    w = torch.randn(64, 64, device="cuda") / 8
    fns = {n: torch.compile(chain(n, w)) for n in COUNTS}
    for fn in fns.values():  # compile, warm up
        for _ in range(3):
            fn(x).sum().backward()
    torch.cuda.synchronize()
    counts = {n: kernels(fn, x) for n, fn in fns.items()}
    times: dict[int, dict[str, list[float]]] = {n: {"fwd": [], "bwd": []} for n in COUNTS}
    for _ in range(rounds):
        for n, fn in fns.items():  # interleaved: a drift of the host's speed lands on every n alike
            for _ in range(calls):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                y = fn(x)
                t1 = time.perf_counter()
                s = y.sum()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                s.backward()
                t3 = time.perf_counter()
                torch.cuda.synchronize()
                times[n]["fwd"].append(t1 - t0)
                # the backward's host: its graph call and launches, plus the sum's backward (one kernel, any n)
                times[n]["bwd"].append(t3 - t2)
    return [{"n": n, "fwd_kernels": counts[n][0], "bwd_kernels": counts[n][1],
             "fwd_us": 1e6 * statistics.median(t["fwd"]), "bwd_us": 1e6 * statistics.median(t["bwd"])}
            for n, t in times.items()]


def fit(records: list[dict], phase: str) -> tuple[float, float]:
    """(call, per-kernel) host microseconds: least squares over the counts."""
    n = np.array([r[f"{phase}_kernels"] for r in records], dtype=float)
    y = np.array([r[f"{phase}_us"] for r in records])
    slope, intercept = np.polyfit(n, y, 1)
    return float(intercept), float(slope)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    records = measure(args.rounds, args.calls)
    summary = {phase: dict(zip(("call_us", "per_kernel_us"), fit(records, phase))) for phase in ("fwd", "bwd")}
    with open(args.out, "a") as f:
        f.write(json.dumps({"records": records, "fit": summary}) + "\n")
    for r in records:
        print(f"n={r['n']}: forward {r['fwd_kernels']:g} kernels {r['fwd_us']:.1f} us, backward {r['bwd_kernels']:g} "
              f"kernels {r['bwd_us']:.1f} us")
    for phase, s in summary.items():
        print(f"{phase}: {s['call_us']:.1f} us a call + {s['per_kernel_us']:.2f} us a kernel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
