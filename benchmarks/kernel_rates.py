"""The memory-bound kernel families' achieved rates on one GPU against what a derived profile prices for them.

A derived profile (`derive:` in its YAML: h100-sxm from h200) inherits its anchor's calibration, whose kernel
families are bandwidth fractions. Read as fractions of the derived part's own bandwidth they assume every family
is DRAM-bound; hardware_profiles.loader._rates_kept instead prices a family that ran below the DRAM ceiling there
as the ceiling's DRAM time plus the time its SMs spent on the anchor (the derived part has the same SMs), at the
derived part's clock. This script times calibrate's own kernel families (autoparallel.calibrate._class_kernels, the
same shapes and byte counts) on the device, then compares each family's rate with both readings.

    python benchmarks/kernel_rates.py measure --out $OUT/kernel_rates.json          # GPU, under a minute
    python benchmarks/kernel_rates.py compare --raw FILE --profile h100-sxm --doc docs/kernel_rates_h100.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cmd_measure(args: argparse.Namespace) -> int:
    import torch

    from autoparallel.calibrate import (
        CalibrationPlan,
        fit_memory_bound,
        measure_bandwidth,
        measure_kernel_classes,
    )
    from hardware_profiles import load_profile

    device = torch.device("cuda", 0)
    plan = CalibrationPlan.full()

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    classes = measure_kernel_classes(device, plan, say)
    samples = measure_bandwidth(device, plan, say)
    name = torch.cuda.get_device_name(device)
    bw = load_profile(args.profile).memory_bandwidth
    out = {"device": name, "torch": torch.__version__, "profile": args.profile,
           "bytes_per_s": classes, "memory_bound": fit_memory_bound(samples, bw, plan.large_bandwidth_bytes),
           "best_bytes_per_s": max(s.bytes / s.seconds for s in samples)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "bytes_per_s"}))
    return 0


def _measured_rate(rates: dict[str, float], cls: str) -> float | None:
    """A family's measured bytes per second; a cast is both directions' mean, as calibrate fits it."""
    if cls == "cast" and "cast_down" in rates:
        return statistics.mean([rates["cast"], rates["cast_down"]])
    return rates.get(cls)


def cmd_compare(args: argparse.Namespace) -> int:
    from hardware_profiles import load_profile

    raw = json.loads(Path(args.raw).read_text())
    derived = load_profile(args.profile)
    anchor = load_profile(args.anchor)
    bw, bw_a = derived.memory_bandwidth, anchor.memory_bandwidth
    lines = [f"# Kernel families on {raw['device']} against {args.profile} (derived from {args.anchor})", "",
             f"Command: `python benchmarks/kernel_rates.py compare --raw {_rel(args.raw)} --profile {args.profile} "
             f"--anchor {args.anchor} --doc {_rel(args.doc)}` (measured with `kernel_rates.py measure` on the device, "
             f"torch {raw['torch']}: calibrate's kernel families, its shapes and byte counts).", "",
             f"Bandwidth-bound copies here: memory_bound {raw['memory_bound']:.3f} of {bw / 1e12:g} TB/s, best "
             f"{raw['best_bytes_per_s'] / 1e9:.0f} GB/s; the derived profile's memory_bound (the ceiling "
             f"of _rates_kept) {derived.efficiency.memory_bound:.4f}.", "",
             f"| family | {args.anchor} GB/s (its calibration) | measured here GB/s | anchor's fraction of "
             f"{bw / 1e12:g} TB/s | error | SM time kept (loader._rates_kept) | error |", "|---|---:|---:|---:|---:|---:|---:|"]
    errs_lit, errs_kept = [], []
    for cls, f_anchor in sorted(anchor.calibration.get("memory_fraction", {}).items()):
        here = _measured_rate(raw["bytes_per_s"], cls)
        if here is None:
            continue
        lit = f_anchor * bw  # the anchor's fraction read as this part's
        kept = derived.calibration["memory_fraction"][cls] * bw
        e_lit, e_kept = lit / here - 1, kept / here - 1
        errs_lit.append(abs(math.log(lit / here)))
        errs_kept.append(abs(math.log(kept / here)))
        lines.append(f"| {cls} | {f_anchor * bw_a / 1e9:.0f} | {here / 1e9:.0f} | {lit / 1e9:.0f} | {e_lit:+.0%} | "
                     f"{kept / 1e9:.0f} | {e_kept:+.0%} |")
    lines += ["", f"{len(errs_lit)} families; geometric-mean |error| of the rate: anchor's fraction read as this "
              f"part's {math.expm1(statistics.mean(errs_lit)):.0%}, SM time kept {math.expm1(statistics.mean(errs_kept)):.0%}."]
    text = "\n".join(lines) + "\n"
    Path(args.doc).write_text(text)
    print(text)
    return 0


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--profile", default="h100-sxm", help="whose datasheet bandwidth memory_bound is a fraction of")
    c = sub.add_parser("compare")
    c.add_argument("--raw", required=True)
    c.add_argument("--profile", default="h100-sxm")
    c.add_argument("--anchor", default="h200")
    c.add_argument("--doc", required=True)
    args = ap.parse_args(argv)
    return {"measure": cmd_measure, "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
