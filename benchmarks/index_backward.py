"""The GPU time of a row gather's backward: `w.new_zeros(R, D).index_put_((idx,), g, accumulate=True)`, the op
autograd runs for `w[idx]` (aten index's backward), across destination rows R, gathered rows N and row widths D
(device run).

    python benchmarks/index_backward.py --out $OUT/index_backward.json                  # on a GPU
    python benchmarks/index_backward.py fit --raw benchmarks/results/raw/index_backward_h200_s57.json

CUDA's accumulating index_put sorts the indices and gives each distinct destination row to one warp, which adds
that row's duplicates one after another: with N/R duplicates a row (an MoE's expert biases gathered per routed
token, R = 32 experts, N = 16384 token-slots, gpt-oss's) the time follows the duplicates, not the bytes. These
rows, timed as the GPU spends them (`calibrate._device_seconds`), are what the index_put class's terms are fitted
from (cost_models.compute, calibration.index_put_terms).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (R destination rows, N gathered rows, D features): expert tables (R 8-128) and token rows (R 2048-16384, N = top-k
# x R), widths of 512-5760
SHAPES = tuple((r, n, d) for r in (8, 32, 128, 2048, 8192) for n in (4096, 16384, 65536) for d in (512, 2880, 5760)
               if n >= r and r * d * 2 <= 2 ** 31)


def time_shape(r: int, n: int, d: int, plan) -> dict:
    import torch

    from autoparallel.calibrate import _device_seconds

    device = torch.device("cuda")
    g = torch.randn(n, d, device=device, dtype=torch.bfloat16)
    idx = torch.randint(0, r, (n,), device=device, generator=torch.Generator(device).manual_seed(0))
    seconds = _device_seconds(lambda: g.new_zeros(r, d).index_put_((idx,), g, accumulate=True), device, plan)
    return {"rows": r, "gathered": n, "width": d, "bytes": (2 * n * d + 2 * r * d + 8 * n), "seconds": seconds}


def measure(out: Path) -> int:
    import torch

    from autoparallel.calibrate import CalibrationPlan

    plan = CalibrationPlan.quick()
    rows = []
    for r, n, d in SHAPES:
        try:
            rec = time_shape(r, n, d, plan)
        except RuntimeError as e:  # one shape's failure must not lose the others
            rec = {"rows": r, "gathered": n, "width": d, "error": str(e).splitlines()[0][:200]}
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1) + "\n")
    return 0


def fit(raw: Path, bandwidth: float) -> dict[str, float]:
    """calibration.index_put_terms from measured rows: t = bytes / (fraction x bandwidth) + duplicate_us x N / R +
    fixed_us, least squares of the relative error (each row weighs alike, microseconds or milliseconds)."""
    import numpy as np

    rows = [r for r in json.loads(raw.read_text())["rows"] if "seconds" in r]
    t = np.array([r["seconds"] for r in rows])
    x = np.array([[r["bytes"], r["gathered"] / r["rows"], 1.0] for r in rows])
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones(len(t)), rcond=None)
    err = np.abs(x @ coef / t - 1)
    print(f"{len(rows)} shapes: mean |error| {err.mean():.1%}, max {err.max():.1%}")
    return {"fraction": round(float(1 / (coef[0] * bandwidth)), 3), "duplicate_us": round(float(coef[1] * 1e6), 3),
            "fixed_us": round(float(coef[2] * 1e6), 1)}


def main() -> int:
    if sys.argv[1:2] == ["fit"]:
        ap = argparse.ArgumentParser(description="fit calibration.index_put_terms from a measured JSON")
        ap.add_argument("--raw", type=Path, required=True)
        ap.add_argument("--profile", default="h200", help="whose memory bandwidth the fraction is of")
        args = ap.parse_args(sys.argv[2:])
        from hardware_profiles import load_profile
        print(f"index_put_terms: {fit(args.raw, load_profile(args.profile).memory_bandwidth)}")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="measure on this machine's GPU, write JSON here")
    return measure(ap.parse_args().out)


if __name__ == "__main__":
    sys.exit(main())
