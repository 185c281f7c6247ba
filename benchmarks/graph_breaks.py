"""Where Dynamo splits a compiled sweep configuration's blocks: its graph breaks, named, on the device.

    python benchmarks/graph_breaks.py --only 1g-moe-auto,1g-llama-auto --out $OUT/graph_breaks.jsonl

Each configuration of benchmarks/trainer_sweep.py named runs its plan file with AutoParallelTrainer for
`--steps` steps after a Dynamo reset, and one JSON line records Dynamo's counters: the graph breaks by reason
(`counters["graph_break"]`), the graphs compiled (`counters["stats"]["unique_graphs"]`), and the compiled
regions a step enters (the profiler's "Torch-Compiled Region" calls of one more step). The cost model prices
one graph call a compiled block and phase; a block that runs as several pays several calls' host time.
Run with TORCH_LOGS=graph_breaks for each break's user stack in the log.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as TS  # noqa: E402

REGION = "Torch-Compiled Region"


def breaks_of(cfg: Any, steps: int) -> dict[str, Any]:
    import torch
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    from autoparallel import AutoParallelTrainer
    gc.collect()
    torch._dynamo.reset()
    counters.clear()
    trainer = AutoParallelTrainer(TS._meta_model(cfg), optimizer=None, plan=cfg.plan_file)
    gen = torch.Generator().manual_seed(0)
    vocab = TS.MODELS[cfg.model]["vocab_size"]
    batch = torch.randint(0, vocab, (cfg.rows, cfg.seq + 1), generator=gen)
    for _ in range(steps):
        trainer.step(batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.step(batch)
    # "Torch-Compiled Region" on torch 2.11, "Torch-Compiled Region: <frame>/<recompile>" on later versions
    frames = Counter(e.name for e in prof.events() if e.name.startswith(REGION))
    del trainer
    return {"graph_breaks": dict(counters["graph_break"]), "unique_graphs": counters["stats"]["unique_graphs"],
            "regions_per_step": sum(frames.values()), "region_calls": dict(frames)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", required=True, help="comma-separated sweep configuration names")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    for cfg in TS._selected(args.only):
        rec: dict[str, Any] = {"name": cfg.name}
        try:
            rec.update(breaks_of(cfg, args.steps))
        except Exception as ex:  # one configuration's failure must not lose the others
            rec["error"] = repr(ex)[:500]
            rec["traceback"] = traceback.format_exc()[-2000:]
        print(json.dumps(rec)[:1500], flush=True)
        with Path(args.out).open("a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
