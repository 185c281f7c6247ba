"""Zero-bubble pipeline schedule on two H200s (issue 14): the 1.3B llama, 16 x 2048 per step, eager, under
dp2 (the reference), pp2 1F1B and pp2 zero bubble with 4 micro-batches of 4, and the interleaved (vpp2)
pair; each plan's measured step next to the cost model's prediction of that exact plan.

    torchrun --nproc-per-node 2 benchmarks/zero_bubble_h200.py --out $OUT/zero_bubble.jsonl

Every rank plans the same pins with this checkout's planner and the shipped h200 profile (deterministic),
then AutoParallelTrainer runs the plan: 3 warm-up steps, 10 timed between device synchronizations (the
timing of benchmarks/trainer_sweep.py). Rank 0 appends one JSON line per configuration.
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

from h200_trainer_throughput import LLAMA_1_3B  # noqa: E402

ROWS, SEQ, BUDGET = 16, 2048, "140GB"
CONFIGS = {  # name -> planner pins
    "dp2-zero2-mb8": {"dp": 2, "zero": 2, "micro_batch": 8, "compile": 0},
    "pp2-1f1b-mb4": {"pp": 2, "vpp": 1, "micro_batch": 4, "compile": 0, "schedule": "1f1b"},
    "pp2-zb-mb4": {"pp": 2, "vpp": 1, "micro_batch": 4, "schedule": "zero_bubble"},
    "pp2-1f1b-mb2": {"pp": 2, "vpp": 1, "micro_batch": 2, "compile": 0, "schedule": "1f1b"},
    "pp2-zb-mb2": {"pp": 2, "vpp": 1, "micro_batch": 2, "schedule": "zero_bubble"},
    "pp2-vpp2-1f1b-mb4": {"pp": 2, "vpp": 2, "micro_batch": 4, "compile": 0, "schedule": "1f1b"},
    "pp2-vpp2-zb-mb4": {"pp": 2, "vpp": 2, "micro_batch": 4, "schedule": "zero_bubble"},
    # compiled pipelines (torch's zero-bubble schedules refuse compiled stages) against compiled dp2
    "dp2-zero2-mb8-compiled": {"dp": 2, "zero": 2, "micro_batch": 8, "compile": 1},
    "pp2-1f1b-mb4-compiled": {"pp": 2, "vpp": 1, "micro_batch": 4, "compile": 1, "schedule": "1f1b"},
    "pp2-vpp2-1f1b-mb2-compiled": {"pp": 2, "vpp": 2, "micro_batch": 2, "compile": 1, "schedule": "1f1b"},
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="comma-separated configuration names")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    import torch

    from autoparallel import AutoParallelTrainer
    from autoparallel.api import context, plan_model
    from autoparallel.calibrate_trainer import time_trainer_steps
    from autoparallel.models import build_model, load_model_spec

    rank = int(os.environ.get("RANK", "0"))
    spec = load_model_spec(LLAMA_1_3B)
    names = args.only.split(",") if args.only else list(CONFIGS)
    for name in names:
        rec: dict = {"name": name, "fix": CONFIGS[name]}
        try:
            gc.collect()
            torch._dynamo.reset()  # each compiled configuration compiles afresh, within the recompile limit
            gc.collect()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            with torch.device("meta"):
                model = build_model(spec)
            plan = plan_model(model, hardware="h200", gpus=2, gpus_per_node=2, global_batch=ROWS, seq_len=SEQ,
                              max_memory_per_gpu=BUDGET, fix=CONFIGS[name])
            ctx = context(model, "h200", 2, SEQ, 2, BUDGET)
            est = ctx.cost_model.estimate(plan, ctx.budget_bytes)
            rec["plan"] = plan.to_dict()
            rec["predicted"] = {"step_time_s": est.step_time_s, "pipeline_bubble_s": est.breakdown["pipeline_bubble_s"]}
            trainer = AutoParallelTrainer(model, optimizer=None, plan=plan)
            rec["schedule_class"] = type(getattr(trainer, "_schedule", None)).__name__
            gen = torch.Generator().manual_seed(0)
            batches = [torch.randint(0, spec.vocab_size, (ROWS, SEQ + 1), generator=gen) for _ in range(4)]
            timing = time_trainer_steps(trainer, batches, args.warmup, args.steps, base)
            rec["measured"] = {"step_time_s": timing.step_time_s, "step_times_s": timing.step_times_s,
                               "peak_memory_gib": timing.peak_memory_gib}
            rec["losses"] = timing.losses
            del trainer
        except Exception as ex:  # one configuration's failure must not lose the others
            rec["error"] = repr(ex)[:500]
            rec["traceback"] = traceback.format_exc()[-2000:]
        if rank == 0:
            brief = {k: rec.get(k) for k in ("name", "schedule_class", "predicted", "measured", "error")}
            print(json.dumps(brief)[:800], flush=True)
            with Path(args.out).open("a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
