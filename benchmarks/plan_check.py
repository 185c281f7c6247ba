"""The plan AutoParallelTrainer makes for itself for the 7B llama at 8 x 4096 on two H200s (plan_model with
the trainer's inputs: no pins, the local GPU's budget), here and on the device, whose torch differs: the
plan, its predicted step and peak, and the budget. An earlier planner picked another plan on the device
than on a CPU host (docs/trainer_sweep_notes.md, "The two-GPU pick").

    python benchmarks/plan_check.py [--budget BYTES]     # default: the local GPU's, as the trainer takes it
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    import torch
    import trainer_sweep as ts

    from autoparallel.api import context, plan_model
    from autoparallel.models import build_model, load_model_spec
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=None)
    args = p.parse_args()
    budget = args.budget
    if budget is None and torch.cuda.is_available():
        from autoparallel.trainer.hardware import local_budget
        budget = local_budget(torch.device("cuda", 0), "h200")
    with torch.device("meta"):
        model = build_model(load_model_spec(ts.MODELS["llama-7b"]))
    t = time.perf_counter()
    plan = plan_model(model, hardware="h200", gpus=2, gpus_per_node=2, global_batch=8, seq_len=4096,
                      max_memory_per_gpu=budget, fix={})
    wall = time.perf_counter() - t
    ctx = context(model, "h200", 2, 4096, gpus_per_node=2, max_memory_per_gpu=budget)
    est = ctx.cost_model.estimate(plan, ctx.budget_bytes)
    out = {"torch": torch.__version__, "budget": budget, "budget_bytes_ctx": ctx.budget_bytes, "plan_s": round(wall, 1),
           "plan": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "zero": plan.zero, "micro_batch": plan.micro_batch,
                    "compile": plan.compile, "recompute": sorted(set(plan.recompute)),
                    "recompute_counts": {m: plan.recompute.count(m) for m in set(plan.recompute)}},
           "step_s": est.step_time_s, "peak_gib": est.peak_memory_gib,
           "memory_breakdown_gib": est.memory_breakdown_gib[0]}
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
