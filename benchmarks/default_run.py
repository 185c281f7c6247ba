"""The trainer's default run on two GPUs (issue 14): AutoParallelTrainer planning for itself, no pins and
no plan, for the 1.3B llama at 16 x 2048 and the 7B at 8 x 4096 per step; MFU as benchmarks/trainer_sweep.py
defines it.

    torchrun --nproc-per-node 2 benchmarks/default_run.py --out $OUT/default_run.jsonl

The plan each rank makes is the one `autoparallel plan` prints for the same model, batch and profile (the
shipped h200 one) on this checkout; the record holds it. 3 warm-up and 10 timed steps
(calibrate_trainer.time_trainer_steps); rank 0 appends one JSON line per model.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as TS  # noqa: E402

RUNS = {"llama-1.3b": "2g-llama-auto", "llama-7b": "2g-llama7b-compiled"}  # model -> a sweep config (rows, seq)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="comma-separated models")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    import torch

    from autoparallel import AutoParallelTrainer
    from autoparallel.calibrate_trainer import time_trainer_steps
    rank = int(os.environ.get("RANK", "0"))
    for model in (args.only.split(",") if args.only else RUNS):
        cfg = next(c for c in TS.CONFIGS if c.name == RUNS[model])
        rec: dict = {"model": model, "rows": cfg.rows, "seq": cfg.seq, "gpus": 2}
        try:
            gc.collect()
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            trainer = AutoParallelTrainer(TS._meta_model(cfg), optimizer=None)  # plans on its first step
            gen = torch.Generator().manual_seed(0)
            vocab = TS.MODELS[cfg.model]["vocab_size"]
            batches = [torch.randint(0, vocab, (cfg.rows, cfg.seq + 1), generator=gen) for _ in range(4)]
            timing = time_trainer_steps(trainer, batches, args.warmup, args.steps, base)
            rec["plan"] = trainer.plan.to_dict()
            rec["described"] = TS._describe(trainer.plan) + (" compiled" if trainer.plan.compile else "")
            rec["measured"] = {"step_time_s": timing.step_time_s, "step_times_s": timing.step_times_s,
                               "peak_memory_gib": timing.peak_memory_gib}
            rec["mfu"] = TS.mfu(cfg, timing.step_time_s)
            rec["losses"] = timing.losses
            del trainer
        except Exception as ex:  # one model's failure must not lose the other
            rec["error"] = repr(ex)[:500]
            rec["traceback"] = traceback.format_exc()[-2000:]
        if rank == 0:
            print(json.dumps({k: rec.get(k) for k in ("model", "described", "measured", "mfu", "error")})[:600],
                  flush=True)
            with Path(args.out).open("a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
