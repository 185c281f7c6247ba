"""The two-GPU report of issue 14, from the measurements of record (no GPU needed):

    python benchmarks/two_gpu.py        # -> docs/benchmarks_2gpu.md

Inputs: benchmarks/results/trainer_sweep_h200.json (`trainer_sweep.py report`: AutoParallelTrainer on two
H200s, the s3 sweep), the plan files under benchmarks/results/trainer_sweep_plans/, and
benchmarks/results/h200_trainer_throughput_compiled.json (one H200, the trainer against plain loops).
MFU = (6N + 12 L h s) tokens/s / (GPUs x 989 TFLOP/s), the issue's definition (`trainer_sweep.mfu`).
The planner's default plan is recomputed here with the shipped h200 profile and compared with the plan
file each row ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as TS  # noqa: E402

ONE_GPU = ROOT / "benchmarks" / "results" / "h200_trainer_throughput_compiled.json"
DOC = ROOT / "docs" / "benchmarks_2gpu.md"
SAME_PLAN_FIELDS = ("dp", "tp", "pp", "vpp", "ep", "cp", "micro_batch", "zero", "sequence_parallel", "recompute",
                    "compile")


def default_plan(cfg: TS.SweepConfig):
    """The plan the trainer gets by default: the planner's, no pins, the shipped h200 profile."""
    from autoparallel.api import plan_result
    result, _ = plan_result(TS._meta_model(cfg), hardware=TS.PROFILE, gpus=cfg.gpus, global_batch=cfg.rows,
                            seq_len=cfg.seq, gpus_per_node=cfg.gpus, max_memory_per_gpu=TS.BUDGET)
    return result.plan


def main() -> int:
    from autoparallel.plan import Plan
    records = {r["name"]: r for r in json.loads(TS.RESULTS.read_text())["records"]}
    configs = {c.name: c for c in TS.CONFIGS}
    lines = ["# Two H200s: the trainer under every plan kind (issue 14)", "",
             "Command: `python benchmarks/two_gpu.py` (from `benchmarks/results/trainer_sweep_h200.json`, the "
             "s3 sweep of docs/trainer_sweep.md measured on a lent two-H200 VM, and "
             "`benchmarks/results/h200_trainer_throughput_compiled.json`). MFU = (6N + 12 L h s) tokens/s / "
             "(GPUs x 989 TFLOP/s).", ""]
    for model, rows, seq in (("llama-1.3b", 16, 2048), ("llama-7b", 8, 4096)):
        names = [n for n, c in configs.items() if c.model == model and c.gpus == 2 and n in records]
        if not names:
            continue
        cfg0 = configs[names[0]]
        default = default_plan(cfg0)
        lines += [f"## {model}, {rows} x {seq} per step", "",
                  "| configuration | plan | step | tokens/s | MFU | the default plan |", "|---|---|---:|---:|---:|---|"]
        fastest = min(names, key=lambda n: records[n]["measured"]["step_time_s"])
        for n in sorted(names, key=lambda n: records[n]["measured"]["step_time_s"]):
            r, cfg = records[n], configs[n]
            t = r["measured"]["step_time_s"]
            ran = Plan.load(cfg.plan_file)
            is_default = all(getattr(ran, f) == getattr(default, f) for f in SAME_PLAN_FIELDS)
            lines.append(f"| {n}{' (fastest)' if n == fastest else ''} | {r['plan']}{' compiled' if r['compile'] else ''} "
                         f"| {t * 1e3:.1f} ms | {rows * seq / t:,.0f} | {TS.mfu(cfg, t):.1%} | {'yes' if is_default else ''} |")
        lines.append("")
        if model == "llama-1.3b":
            step = {n: records[n]["measured"]["step_time_s"] for n in names}
            pairs = [("tp2 + SP, compiled", "2g-llama-tp2sp-compiled", "2g-llama-auto", 0.85),
                     ("tp2 + SP, eager", "2g-llama-tp2sp", "2g-llama-eager", 0.85),
                     ("pp2 1F1B, eager", "2g-llama-pp2-mb4", "2g-llama-eager", 0.9),
                     ("pp2 interleaved (vpp2), eager", "2g-llama-pp2-vpp2", "2g-llama-eager", 0.9)]
            lines += ["| throughput against dp2 at the same global batch | ratio | target |", "|---|---:|---:|"]
            for label, a, b, target in pairs:
                if a in step and b in step:
                    lines.append(f"| {label} ({a} / {b}) | {step[b] / step[a]:.2f}x | >= {target}x |")
            lines.append("")
    if ONE_GPU.is_file():
        one = json.loads(ONE_GPU.read_text())["rows"]
        lines += ["## One H200, one process, interleaved (1.3B llama, 8 x 2048)", "",
                  "| variant | step | MFU (flop counter) | vs plain eager | vs plain compiled |", "|---|---:|---:|---:|---:|"]
        for n, r in one.items():
            vc = r.get("tokens_per_s_vs_plain_compiled")
            lines.append(f"| {n} | {r['step_time_s'] * 1e3:.1f} ms | {r['mfu']:.1%} | {r['tokens_per_s_vs_plain']:.3f}x | "
                         f"{'' if vc is None else f'{vc:.3f}x'} |")
        lines.append("")
    DOC.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
