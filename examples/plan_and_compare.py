"""Plan a model with the Python API and compare accelerators (no GPU needed: everything is predicted).

    python examples/plan_and_compare.py [--model llama3-8b] [--gpus 64]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import autoparallel
from autoparallel.errors import exit_on_user_error
from autoparallel.plan import Plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=4096)
    args = ap.parse_args()

    plan = autoparallel.plan(args.model, hardware="h100-sxm", gpus=args.gpus, global_batch=args.global_batch,
                             seq_len=args.seq_len, max_memory_per_gpu="80GB")
    print(f"plan on h100-sxm: dp={plan.dp} tp={plan.tp} pp={plan.pp} vpp={plan.vpp} micro_batch={plan.micro_batch} "
          f"zero={plan.zero} sequence_parallel={plan.sequence_parallel}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.yaml"
        plan.save(path)                      # the file `AutoParallelTrainer(plan=...)` takes
        assert Plan.load(path) == plan

    rows = autoparallel.compare(args.model, hardware=["h100-sxm", "h200", "mi300x", "gaudi3", "ascend-910b"],
                                gpus=args.gpus, global_batch=args.global_batch, seq_len=args.seq_len)
    print(f"\n{'hardware':14s} {'plan':28s} {'step s':>8s} {'tokens/s':>12s} {'MFU':>6s}")
    for row in rows:
        r = row.result
        if r.plan is None:
            print(f"{row.hardware:14s} infeasible: {r.explanation}")
            continue
        p, e = r.plan, r.estimate
        desc = f"dp{p.dp} tp{p.tp} pp{p.pp} mb{p.micro_batch} zero{p.zero}"
        print(f"{row.hardware:14s} {desc:28s} {e.step_time_s:8.3f} {e.tokens_per_s:12,.0f} {e.mfu * 100:5.1f}%")


if __name__ == "__main__":
    exit_on_user_error(main)
