"""The GPU time of a row gather's backward: `w.new_zeros(R, D).index_put_((idx,), g, accumulate=True)`, the op
autograd runs for `w[idx]` (aten index's backward), across destination rows R, gathered rows N and row widths D
(device run).

    python benchmarks/index_backward.py --out $OUT/index_backward.json [--dtype fp32]    # on a GPU
    python benchmarks/index_backward.py fit --raw benchmarks/results/raw/index_backward_h200_s57.json
    python benchmarks/index_backward.py check --raw RAW.json [--profile h200]

`check` prices each measured row as the cost model prices the op in a trainer's step: its traced sizes (the
zero-filled destination read, the source and destination at the row's dtype) through compute.index_put_bytes and
compute.index_put_times. The terms were fitted on bf16 rows; fp32 rows (an MoE's expert outputs scattered back in
fp32) test the model's claim that the kernel's time follows elements, not bytes.

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


ELEMENT_BYTES = {"bf16": 2, "fp32": 4}


def time_shape(r: int, n: int, d: int, plan, dtype: str = "bf16") -> dict:
    import torch

    from autoparallel.calibrate import _device_seconds

    device = torch.device("cuda")
    g = torch.randn(n, d, device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    idx = torch.randint(0, r, (n,), device=device, generator=torch.Generator(device).manual_seed(0))
    seconds = _device_seconds(lambda: g.new_zeros(r, d).index_put_((idx,), g, accumulate=True), device, plan)
    # "bytes" in the fit's convention (2 bytes an element whatever the dtype: what fit() regresses on)
    return {"rows": r, "gathered": n, "width": d, "dtype": dtype, "bytes": (2 * n * d + 2 * r * d + 8 * n),
            "seconds": seconds}


def measure(out: Path, dtype: str = "bf16") -> int:
    import torch

    from autoparallel.calibrate import CalibrationPlan

    plan = CalibrationPlan.quick()
    rows = []
    for r, n, d in SHAPES:
        if r * d * ELEMENT_BYTES[dtype] > 2 ** 31:
            continue
        try:
            rec = time_shape(r, n, d, plan, dtype)
        except RuntimeError as e:  # one shape's failure must not lose the others
            rec = {"rows": r, "gathered": n, "width": d, "dtype": dtype, "error": str(e).splitlines()[0][:200]}
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1) + "\n")
    return 0


def fit(raw: Path, bandwidth: float) -> dict[str, float]:
    """calibration.index_put_terms from measured rows: t = bytes / (fraction x bandwidth) + duplicate_us x N / R +
    fixed_us, least squares of the relative error (each row weighs alike, microseconds or milliseconds)."""
    import numpy as np

    rows = [r for r in json.loads(raw.read_text())["rows"] if "seconds" in r and r.get("dtype", "bf16") == "bf16"]
    t = np.array([r["seconds"] for r in rows])
    x = np.array([[r["bytes"], r["gathered"] / r["rows"], 1.0] for r in rows])
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones(len(t)), rcond=None)
    err = np.abs(x @ coef / t - 1)
    print(f"{len(rows)} shapes: mean |error| {err.mean():.1%}, max {err.max():.1%}")
    return {"fraction": round(float(1 / (coef[0] * bandwidth)), 3), "duplicate_us": round(float(coef[1] * 1e6), 3),
            "fixed_us": round(float(coef[2] * 1e6), 1)}


def check(raw: Path, profile_name: str) -> list[dict]:
    """Each measured row against the cost model's price for the op at its traced sizes: (rows, dtype, gathered,
    width, measured us, priced us, error)."""
    import numpy as np

    from cost_models.compute import gathered_per_row, index_put_bytes, index_put_times
    from hardware_profiles import load_profile

    profile = load_profile(profile_name)
    out = []
    for r in json.loads(raw.read_text())["rows"]:
        if "seconds" not in r:
            continue
        elt = ELEMENT_BYTES[r.get("dtype", "bf16")]
        dest = r["rows"] * r["width"] * elt
        # as the tracer counts the op: it reads the zero-filled destination, the gathered rows and their indices
        read = dest + r["gathered"] * r["width"] * elt + 8 * r["gathered"]
        shape = (r["rows"], r["width"])
        moved = np.array([index_put_bytes(shape, dest, read)])
        per_row = np.array([gathered_per_row(shape, dest, read)])
        priced = float(index_put_times(moved, per_row, profile)[0])
        out.append({**r, "priced": priced, "error": priced / r["seconds"] - 1})
    return out


def main() -> int:
    if sys.argv[1:2] == ["check"]:
        ap = argparse.ArgumentParser(description="measured rows against the cost model's price")
        ap.add_argument("--raw", type=Path, required=True)
        ap.add_argument("--profile", default="h200")
        args = ap.parse_args(sys.argv[2:])
        rows = check(args.raw, args.profile)
        print("| dtype | R | N | D | measured us | priced us | error |\n|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r.get('dtype', 'bf16')} | {r['rows']} | {r['gathered']} | {r['width']} | {r['seconds'] * 1e6:.1f} "
                  f"| {r['priced'] * 1e6:.1f} | {r['error']:+.1%} |")
        for dtype in sorted({r.get("dtype", "bf16") for r in rows}):
            errs = [abs(r["error"]) for r in rows if r.get("dtype", "bf16") == dtype]
            print(f"{dtype}: {len(errs)} shapes, mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%}")
        return 0
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
    ap.add_argument("--dtype", choices=sorted(ELEMENT_BYTES), default="bf16", help="the gathered rows' dtype")
    args = ap.parse_args()
    return measure(args.out, args.dtype)


if __name__ == "__main__":
    sys.exit(main())
