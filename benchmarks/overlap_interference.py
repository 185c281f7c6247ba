"""Fit the cost model's overlap interference (comm.dp_overlap_cost's kappa: compute seconds lost per second of
data-parallel collective running beside it) on the trainer's two-GPU steps of one VM, and report it held out on
the others. CPU only, from the raw sweeps (benchmarks/results/raw/trainer_sweep_dist_<vm>.jsonl), each VM's rows
predicted with the base profile rescaled by that VM's own speed probes (as benchmarks/held_out_all.py does):

    python benchmarks/overlap_interference.py                 # fit on s5, hold out s18 and s19 -> docs

Prints, for each kappa of a grid over [0, 1], the mean |error| of every VM's two-GPU rows, then the rows at the
fitted kappa, and writes docs/overlap_interference.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import held_out_all  # noqa: E402
import host_transfer as ht  # noqa: E402
import trainer_sweep as ts  # noqa: E402

GRID = [round(0.1 * i, 1) for i in range(11)]
DOC = ROOT / "docs" / "overlap_interference.md"


def rows(base, vm: str, kappa: float) -> list[tuple[str, float, float, float]]:
    """(configuration, predicted / measured - 1, hidden data-parallel collective [s], GPU idle [s]) of `vm`'s
    two-GPU rows under `base` rescaled to the VM with interference `kappa`."""
    profile = held_out_all.vm_profile(base, vm)
    profile = dataclasses.replace(profile, calibration={**profile.calibration, "overlap_interference": kappa})
    configs = {c.name: c for c in ts.CONFIGS}
    out = []
    for name, m in ts._measured([str(ht.RAW / f"trainer_sweep_dist_{vm}.jsonl")]).items():
        if name in configs and "measured" in m:
            pred, est = ts.predict(configs[name], profile, raw=m)
            b = est.breakdown
            out.append((name, pred["step_time_s"] / m["measured"]["step_time_s"] - 1,
                        b["dp_comm_total_s"] - b["dp_comm_exposed_s"], b["dp_interference_s"]))
    return out


def mean_abs(errs: list[float]) -> float:
    return sum(abs(e) for e in errs) / len(errs)


def main() -> int:
    from hardware_profiles import load_profile
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="h200")
    ap.add_argument("--fit", default="s5", help="the VM whose rows fit kappa")
    ap.add_argument("--held-out", nargs="+", default=["s18", "s19"])
    ap.add_argument("--doc", default=str(DOC))
    args = ap.parse_args()
    base = load_profile(args.base)
    vms = [args.fit, *args.held_out]
    table = {k: {vm: rows(base, vm, k) for vm in vms} for k in GRID}
    best = min(GRID, key=lambda k: (mean_abs([e for _, e, _, _ in table[k][args.fit]]), k))
    lines = ["# Overlap interference: the data-parallel collectives slow the work they hide behind", "",
             f"Command: `python benchmarks/overlap_interference.py` (base profile `{args.base}`, each VM's rows on it "
             "rescaled by that VM's speed probes; raw: `benchmarks/results/raw/trainer_sweep_dist_<vm>.jsonl`). "
             f"kappa is fitted on {args.fit}'s two-GPU rows (the smallest mean |error| over the grid; kappa <= 1, "
             "the form of comm.dp_overlap_cost) and reported held out on " + ", ".join(args.held_out) + ".", "",
             "Why: the cost model had taken a collective hidden behind the backward as free. On two H200s the "
             "trainer's dp2 steps of a 1.3B llama were 5-9% slower than predicted on both two-GPU VMs while its "
             "one-GPU steps at the same per-GPU batch were within 1-4%, and a kernel timeline of each "
             "(benchmarks/results/raw/timeline_h200_{a,b}.jsonl, 1g- against 2g-llama-auto on one VM) shows "
             "where: the same GEMM kernels took 183 ms a step beside FSDP2's collectives against 167-174 ms "
             "alone, 10-18 ms for 13.5 ms of modelled collectives (the NCCL kernels' own busy time was 47-62 "
             "ms). A collective's kernels hold SMs while they run (an all-gather's 24 CTAs of an H100's 132 "
             "push a one-wave GEMM into a second wave, forums.developer.nvidia.com/t/337991) and memory "
             "bandwidth; arXiv 2507.03114 measured a mean 18.9% (at most 40%) compute slowdown under overlap "
             "on A100, H100, MI250 and MI210. comm.dp_overlap_cost charges the hidden part min(T, W) kappa "
             "seconds per second, less the GPU's idle time in the stage (host-paced steps absorb it: the "
             "rows marked 0.0 ms below). The published runs, not fitted, are the wider check: "
             "docs/validation_published.md.", "",
             "| kappa | " + " | ".join(f"{vm} mean abs error" for vm in vms) + " |",
             "|---:|" + "---:|" * len(vms)]
    for k in GRID:
        lines.append(f"| {k:.1f}{' (fitted)' if k == best else ''} | "
                     + " | ".join(f"{mean_abs([e for _, e, _, _ in table[k][vm]]):.2%}" for vm in vms) + " |")
    lines += ["", f"Each row at kappa = 0 (the model before) and at the fitted {best:.1f}:", "",
              "| VM | configuration | error, kappa 0 | error, fitted | hidden collective | interference |",
              "|---|---|---:|---:|---:|---:|"]
    for vm in vms:
        for (name, e0, _, _), (_, e1, hid, inter) in zip(table[0.0][vm], table[best][vm]):
            lines.append(f"| {vm} | {name} | {e0:+.1%} | {e1:+.1%} | {hid * 1e3:.1f} ms | {inter * 1e3:.1f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.doc).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
