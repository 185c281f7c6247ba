"""Where a host-bound trainer step's spread comes from: Python's garbage collector, the VM, or neither.

For each named configuration of benchmarks/trainer_sweep.py (same models, plans and initial weights),
AutoParallelTrainer.step is timed for many steps between device synchronizations, and for each step
this records the collector's pauses by generation (gc.callbacks) and the host's steal time
(/proc/stat: CPU time the hypervisor gave to other guests). Each configuration runs twice, with the
collector as the process has it and with it held off for the timed steps (gc.disable(), then a
collection of the young generations between steps as torchtitan's GarbageCollection does), so the
two medians and spreads can be compared on the same trainer.

    python benchmarks/step_jitter.py --only 1g-gpt-eager,1g-gpt-mb4x2 --steps 30 --out $OUT/jitter.jsonl

Output: one JSON line per configuration and mode (step times, pauses, steal), read by `summary`:

    python benchmarks/step_jitter.py summary --raw benchmarks/results/raw/step_jitter_h200.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as ts  # noqa: E402


def _steal_ticks() -> int:
    """Total steal ticks of all CPUs (/proc/stat's 8th field of the "cpu" line); 0 where unreadable."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return 0


class GcPauses:
    """Sum of the collector's pause time per generation while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.total = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            g = int(info.get("generation", 0))
            self.total[g] += time.perf_counter() - self._t0
            self.count[g] += 1

    def take(self) -> tuple[list[float], list[int]]:
        out = (self.total, self.count)
        self.total, self.count = [0.0, 0.0, 0.0], [0, 0, 0]
        return out


def time_steps(trainer: Any, batches: list[Any], steps: int, hold_gc: bool) -> dict[str, Any]:
    import torch
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    rec: dict[str, list] = {"step_s": [], "gc_s": [], "gc_s_by_generation": [], "gc_count": [], "steal_ticks": []}
    was_enabled = gc.isenabled()
    try:
        for i in range(steps):
            if hold_gc:
                gc.collect(1)  # between steps, as torchtitan's GarbageCollection.collect(generation=1)
                gc.disable()
            torch.cuda.synchronize()
            pauses.take()
            steal = _steal_ticks()
            t = time.perf_counter()
            trainer.step(batches[i % len(batches)])
            torch.cuda.synchronize()
            rec["step_s"].append(time.perf_counter() - t)
            rec["steal_ticks"].append(_steal_ticks() - steal)
            total, count = pauses.take()
            rec["gc_s"].append(sum(total))
            rec["gc_s_by_generation"].append(total)
            rec["gc_count"].append(count)
    finally:
        gc.callbacks.remove(pauses)
        if was_enabled:
            gc.enable()
    return rec


def cmd_measure(args: argparse.Namespace) -> int:

    shared: dict[str, Any] = {}
    out = Path(args.out)
    for cfg in ts._selected(args.only):
        if cfg.gpus != 1:
            continue
        trainer, batches, _ = ts.sweep_trainer(cfg, shared)
        for _ in range(args.warmup):
            trainer.step(batches[0])
        for mode in ("gc", "held", "gc", "held"):  # interleaved: a drift of the VM hits both modes
            rec = {"name": cfg.name, "mode": mode, "objects": len(gc.get_objects()),
                   **time_steps(trainer, batches, args.steps, mode == "held")}
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            s = rec["step_s"]
            print(f"{cfg.name} {mode}: median {statistics.median(s) * 1e3:.1f} ms, min {min(s) * 1e3:.1f}, "
                  f"max {max(s) * 1e3:.1f}, gc {sum(rec['gc_s']) * 1e3:.1f} ms in {len(s)} steps, "
                  f"steal {sum(rec['steal_ticks'])} ticks", flush=True)
        del trainer
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    rows: dict[tuple[str, str], list[dict]] = {}
    for line in Path(args.raw).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows.setdefault((r["name"], r["mode"]), []).append(r)
    print("| configuration | collector | steps | median ms | p10-p90 ms | collector ms/step | "
          "steps with a gen-2 pause | steal ticks/step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, mode), rs in rows.items():
        s = sorted(x * 1e3 for r in rs for x in r["step_s"])
        gcs = [x for r in rs for x in r["gc_s"]]
        gen2 = sum(1 for r in rs for c in r["gc_count"] if c[2])
        steal = [x for r in rs for x in r["steal_ticks"]]
        p10, p90 = s[len(s) // 10], s[(9 * len(s)) // 10]
        print(f"| {name} | {'as the process has it' if mode == 'gc' else 'held off in steps'} | {len(s)} | "
              f"{statistics.median(s):.1f} | {p10:.1f}-{p90:.1f} | {statistics.mean(gcs) * 1e3:.2f} | {gen2} | "
              f"{statistics.mean(steal):.1f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("summary")
    s.add_argument("--raw", required=True)
    p.add_argument("--only", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default="step_jitter.jsonl")
    args = p.parse_args(argv)
    return cmd_summary(args) if args.cmd == "summary" else cmd_measure(args)


if __name__ == "__main__":
    sys.exit(main())
