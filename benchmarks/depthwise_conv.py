"""The bandwidth fraction of PyTorch's depthwise convolution kernels, read off profiled trainer steps (CPU).

    PYTHONPATH=/tmp/tf517 python benchmarks/depthwise_conv.py --doc docs/depthwise_conv.md

A short convolution (LFM2's, and the causal conv1d before a linear-attention layer in Qwen3-Next, Mamba and
their hybrids) has one input channel a group. PyTorch runs it, a conv1d too, in conv_depthwise2d's kernels,
which move their bytes at a few percent of an H200's bandwidth: Qwen3-Next's (4 x 8192 channels x 2048 tokens,
kernel 4) took 0.71 ms forward and 1.02 ms backward, where the FLOP curve the cost model gave every
convolution said 0.13 ms. The profiled steps of the sweep record each aten op's own device time
(benchmarks/trainer_sweep.py `_profiled_step`): per record, the fraction is the bytes the tracer counts for the
depthwise ops the step ran (inputs read, outputs written; `aten::_conv_depthwise2d` forward and replayed,
`aten::convolution_backward` backward) over the bandwidth times their measured time. An op's self time leaves out
the kernels of the ops it calls (the transposed input's contiguous copy), so these fractions are upper bounds:
calibrate's own kernel family (forward and backward over a transposed activation) measured 0.0551 on an H200
(s100, benchmarks/results/raw/conv_depthwise_h200_s100.json), which h200's `memory_fraction.conv_depthwise`
(cost_models.compute: class conv_depthwise) carries.
Run with transformers 5.17 on the path (as on the device: the traces must be the ones the rows ran).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as TS  # noqa: E402

RAWS = ("trainer_sweep_families25_s69.jsonl", "trainer_sweep_families26_s70.jsonl",
        "trainer_sweep_families27b_s96.jsonl")


def conv_bytes(cfg: TS.SweepConfig) -> dict[str, float]:
    """Bytes one call of the model's depthwise convolutions moves at the plan's micro-batch, per phase
    (the tracer's count: inputs read and outputs written, weights once)."""
    from cost_models.compute import moved_bytes
    plan = TS._plan(cfg.plan_file, cfg.plan_file.stat().st_mtime_ns)
    graph, _ = TS._graph(cfg.model, cfg.seq, cfg.padded)
    out: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for _, a in graph.g.nodes(data=True):
        if a.get("depthwise"):
            act = max(moved_bytes(a) - a.get("param_bytes", 0), 0) * plan.micro_batch / max(graph.batch, 1)
            out[a["phase"]].append(act + a.get("param_bytes", 0))
    return {k: statistics.mean(v) for k, v in out.items() if v}


def records() -> list[dict]:
    rows = []
    for raw in RAWS:
        for line in (ROOT / "benchmarks/results/raw" / raw).read_text().splitlines():
            r = json.loads(line)
            ops = (r.get("profile") or {}).get("ops", {})
            if "aten::_conv_depthwise2d" not in ops:
                continue
            cfg = next(c for c in TS.CONFIGS if c.name == r["name"])
            per_call = conv_bytes(cfg)
            fwd, bwd = ops["aten::_conv_depthwise2d"], ops["aten::convolution_backward"]
            moved = fwd[0] * per_call["fwd"] + bwd[0] * per_call["bwd"]
            rows.append({"name": r["name"], "raw": raw, "fwd_calls": fwd[0], "fwd_ms": 1e3 * fwd[1],
                         "bwd_calls": bwd[0], "bwd_ms": 1e3 * bwd[1], "gb": moved / 1e9,
                         "seconds": fwd[1] + bwd[1]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--doc", type=Path, default=None)
    args = ap.parse_args()
    from hardware_profiles import load_profile
    bw = load_profile(args.profile).memory_bandwidth
    rows = records()
    for r in rows:
        r["fraction"] = r["gb"] * 1e9 / (bw * r["seconds"])
    median = statistics.median(r["fraction"] for r in rows)
    lines = ["| row | raw | forward calls | ms | backward calls | ms | GB moved (traced) | fraction of bandwidth |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['raw']} | {r['fwd_calls']} | {r['fwd_ms']:.2f} | {r['bwd_calls']} | "
              f"{r['bwd_ms']:.2f} | {r['gb']:.2f} | {r['fraction']:.4f} |" for r in rows]
    lines.append(f"\nthe median of {len(rows)} profiled steps: {median:.4f} of the bandwidth (an upper bound)")
    text = "\n".join(lines)
    print(text)
    if args.doc is not None:
        cmd = "PYTHONPATH=/tmp/tf517 python benchmarks/depthwise_conv.py --doc " + str(args.doc)
        intro = __doc__.split("\n\n", 2)[2].rsplit("\nRun with", 1)[0]
        args.doc.write_text(f"# Depthwise convolutions (H200)\n\nCommand: `{cmd}`\n\n{intro}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
