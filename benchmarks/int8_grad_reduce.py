"""Loss curves of int8 vs fp32 (and bf16) gradient reduction under dp4, on CPU with gloo.

    python benchmarks/int8_grad_reduce.py            # ~1 min on 2 cores; writes the CSV and prints the table
    python benchmarks/int8_grad_reduce.py --steps 50 --csv benchmarks/results/int8_grad_reduce.csv

Four processes train the tiny llama (tests/trainer_helpers: 4 blocks, hidden 64, AdamW lr 1e-3, eps 1e-4)
with AutoParallelTrainer under an explicit plan dp=4, ZeRO-2, fp32 parameters, one reduction dtype per
run: fp32, bf16 (FSDP2's own cast) and int8 (autoparallel.trainer.low_precision.Int8ReduceScatter:
block-scaled int8 all-to-all, fp32 accumulation). Every run starts from the same weights and sees the
same batch each step (8 x 16 tokens), so the loss falls steadily and the curves differ only by the
reduction. The table in docs/low_precision.md is this script's output.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import trainer_helpers as H  # noqa: E402

DTYPES = ("fp32", "bf16", "int8")
WORLD = 4


def _train(cfg: H.Config, out: Path, rank: int) -> dict:
    import torch

    from autoparallel.trainer import AutoParallelTrainer
    model = H.build(cfg.model)
    plan = dataclasses.replace(H.make_plan(model, dp=WORLD, zero=2), grad_reduce_dtype=cfg.name)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan)
    data = H.batches(cfg.model, 1) * cfg.steps
    return {"losses": [trainer.step(t) for t in data]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "results" / "int8_grad_reduce.csv"))
    ap.add_argument("--every", type=int, default=5, help="table rows: every k-th step (the CSV has all)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        configs = [H.Config(d, "tiny-llama", {}, steps=args.steps) for d in DTYPES]
        H.run_spawned(WORLD, configs, out, train=_train)
        curves = {}
        for d in DTYPES:
            r = H.result(out, d)
            if "error" in r:
                raise SystemExit(f"{d}: {r['error']}\n{r.get('traceback', '')}")
            curves[d] = r["losses"]
    path = Path(args.csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *DTYPES, "int8_minus_fp32", "bf16_minus_fp32"])
        for i in range(args.steps):
            a = curves["fp32"][i]
            w.writerow([i, *(f"{curves[d][i]:.6f}" for d in DTYPES), f"{curves['int8'][i] - a:+.2e}",
                        f"{curves['bf16'][i] - a:+.2e}"])
    print("| step | fp32 | bf16 | int8 | int8 - fp32 | bf16 - fp32 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i in sorted(set(range(0, args.steps, args.every)) | {args.steps - 1}):
        a = curves["fp32"][i]
        print(f"| {i} | {a:.4f} | {curves['bf16'][i]:.4f} | {curves['int8'][i]:.4f} | "
              f"{curves['int8'][i] - a:+.1e} | {curves['bf16'][i] - a:+.1e} |")
    worst = max(abs(x - y) for x, y in zip(curves["int8"], curves["fp32"]))
    progress = curves["fp32"][0] - curves["fp32"][-1]
    print(f"\nmax |int8 - fp32| = {worst:.2e} over {args.steps} steps ({worst / progress * 100:.3f}% of the loss "
          f"decrease {progress:.3f}); CSV: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
