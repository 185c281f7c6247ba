"""Trace time against depth, with identical blocks traced once (default) and with every block traced.

    python benchmarks/trace_depth.py [--layers 10 100 1000 10000]

tiny-llama's block (width 64) repeated L times, seq 16, batch 1, in this process after one warm-up
trace (torch's first-call costs excluded). CPU seconds (time.process_time) of `trace()`; the full
trace is skipped above 1000 layers (minutes). Writes benchmarks/results/trace_depth.json and
docs/benchmarks_trace_depth.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL_UP_TO = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[10, 100, 1000, 10000])
    args = ap.parse_args()
    from autoparallel.specs import load_model_spec
    from autoparallel.tracer import trace

    trace("tiny-llama", seq_len=16)
    rows = []
    for L in args.layers:
        spec = load_model_spec("tiny-llama", num_layers=L)
        row: dict = {"layers": L}
        for mode, replicate in (("replicated", True), ("full", False)):
            if not replicate and L > FULL_UP_TO:
                continue
            t0 = time.process_time()
            g = trace(spec, seq_len=16, replicate_blocks=replicate)
            row[f"{mode}_s"] = round(time.process_time() - t0, 3)
            row["ops"] = g.g.number_of_nodes()
        print(json.dumps(row), flush=True)
        rows.append(row)
    (ROOT / "benchmarks" / "results" / "trace_depth.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["## Trace time against depth", "",
             f"Command: `python benchmarks/trace_depth.py --layers {' '.join(map(str, args.layers))}` "
             f"({platform.machine()}, {os.cpu_count()} cores shared with other work; CPU seconds of `trace()`, "
             "tiny-llama's block repeated L times, seq 16).", "",
             "| layers | ops in graph | identical blocks traced once, s | every block traced, s | ratio |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        full = r.get("full_s")
        fast = r["replicated_s"]
        full_text, ratio = ("-", "-") if full is None else (f"{full:.2f}", f"{full / fast:.1f}x")
        lines.append(f"| {r['layers']:,} | {r['ops']:,} | {fast:.2f} | {full_text} | {ratio} |")
    lines += ["", "Tracing (running the step on meta tensors) covers five blocks whatever the depth; what still "
              "grows with L is building the model on the meta device and the per-op OpGraph itself (one "
              "networkx node per op, copied from the traced blocks), so time stays linear in L at about a "
              "quarter of the full trace's slope. A 100,000-layer model would hold ~19 million op nodes; "
              "a graph that stores each block class once is the step after this one.", ""]
    (ROOT / "docs" / "benchmarks_trace_depth.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
