"""Bandwidth fractions of the kernel families the trainer's update and the non-vectorized elementwise path
run, on one GPU (docs/trainer_sweep_notes.md, "Twelfth session"):

    python benchmarks/strided_kernels.py --out $OUT/strided_kernels.json

The `strided` and `adamw` families exactly as `autoparallel calibrate` measures them
(calibrate._class_kernels, with its default sizes), three neighbours for reference, and the four parts of
`strided` alone beside their dense counterparts: achieved bytes / s over the profile's bandwidth, the bytes
as the tracer counts them (inputs read + outputs written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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
    args = ap.parse_args()
    bw = load_profile(args.profile).memory_bandwidth
    plan = cal.CalibrationPlan()
    dev = torch.device("cuda")
    rows = max(1, plan.class_bytes // (2048 * 2))
    kernels = cal._class_kernels(rows, dev)
    res = {}
    for name in ("strided", "adamw", "broadcast_binary", "cast", "rms_norm"):
        fn, nbytes = kernels[name]
        res[name] = nbytes / cal.time_call(fn, dev, plan.reps, plan.warmup) / bw
    h = 2048
    gu = torch.randn(rows, 2 * h, device=dev, dtype=torch.bfloat16)
    gate, up = gu[:, :h], gu[:, h:]
    x = torch.randn(rows, h, device=dev, dtype=torch.bfloat16)
    heads = x.reshape(rows, 16, h // 16)
    parts = {"mul_halves": (lambda: gate * up, 3), "silu_half": (lambda: F.silu(gate), 2),
             "cat_halves": (lambda: torch.cat((up, gate), -1), 4),
             "transpose_copy": (lambda: heads.transpose(0, 1).contiguous(), 2),
             "mul_dense": (lambda: x * x, 3), "silu_dense": (lambda: F.silu(x), 2), "copy_dense": (lambda: x.clone(), 2)}
    for name, (fn, units) in parts.items():  # units: tensors of rows x h bf16 elements read + written
        res[name] = rows * h * 2.0 * units / cal.time_call(fn, dev, plan.reps, plan.warmup) / bw
    text = json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "fraction_of_bandwidth": {k: round(v, 3) for k, v in res.items()}})
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
