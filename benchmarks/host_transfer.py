"""Do one machine's fitted host terms carry over to another machine, unscaled and with `--rescale`?

Every lent H200 VM that measured both the trainer's probes (`autoparallel calibrate --trainer --raw`) and
the sweep (`trainer_sweep.py measure`) is a held-out machine for a profile fitted elsewhere: its sweep
configurations are predicted with the base profile's host terms as they are, then scaled by the factor
`calibrate --trainer --rescale` fits from that VM's own SPEED_PROBES (`fit_host_speed`). Nothing of the
target VM but those three probes enters the prediction. CPU only:

    python benchmarks/host_transfer.py                       # base: the shipped h200 profile
    python benchmarks/host_transfer.py --base benchmarks/results/h200_trainer_fit_s11.yaml --fitted-on s11 \\
        --doc /tmp/host_transfer_s11.md --results /tmp/host_transfer_s11.json

`--slopes` writes docs/host_transfer_slopes.md: how each configuration's measured time follows the VMs'
host factors, against the model.
`--pooled` asks the same of a profile fitted on many VMs at once (calibrate_trainer.pool_machines: each
VM's probes brought to one host speed, then each probe's median): for each target VM the terms are fitted
on every *other* VM's probes (leave one VM out), then rescaled to it. `--write-pooled FILE` writes the fit of
all VMs (what `trainer_sweep.py ship` puts into hardware_profiles/h200.yaml).

Writes docs/host_transfer.md and benchmarks/results/host_transfer.json (one record per VM and
configuration: measured step time, predicted unscaled and rescaled). Configurations whose numbers the base
took from a sweep (its `sweep_fit_configs`, else trainer_sweep.SWEEP_FIT_DEFAULT) are left out on every VM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as ts  # noqa: E402

from autoparallel.calibrate_trainer import (  # noqa: E402
    REFERENCE_KEY,
    fit_host_speed,
    fit_host_terms,
    load_records,
    pool_machines,
    rescaled,
)

RAW = ROOT / "benchmarks" / "results" / "raw"
# VM -> its sweep files (every VM's probes are trainer_probes_<vm>.jsonl); s10 measured no sweep, s2-s3
# ran plans of an older planner
VMS = {"s4": ["single"], "s5": ["single", "dist"], "s6": ["single"], "s7": ["single"], "s8": ["single"],
       "s9": ["single"], "s11": ["single"], "s12": ["single"], "s13": ["single"], "s14": ["single"], "s15": ["single"],
       "s17": ["single"], "s18": ["dist"], "s19": ["single"], "s20": ["single"], "s21": ["single", "wide"],
       "s28": ["single"]}
# (s19's two-GPU MoE rows ran the experts in their block's FSDP unit under dp2, a runtime not shipped: left out)
# the VMs whose probes `--pooled` and `--write-pooled` pool: the shipped h200's; s13-s15 measured after
# (s14, s15 have no full probe set: `--rescale` before and after the sweep, trainer_speed[_after]_sN.jsonl)
PROBE_VMS = ("s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12")
DOC = ROOT / "docs" / "host_transfer.md"
RESULTS = ROOT / "benchmarks" / "results" / "host_transfer.json"
SLOPES_DOC = ROOT / "docs" / "host_transfer_slopes.md"


def _summary(errors: list[float]) -> str:
    return (f"{statistics.mean(errors):.1%} mean, {sum(e <= 0.10 for e in errors)} of {len(errors)} within 10%, "
            f"max {max(errors):.1%}")


def probes_of(vm: str) -> list:
    return load_records([str(RAW / f"trainer_probes_{vm}.jsonl")])


def sweep_files(vms: list[str]) -> list[str]:
    return [str(RAW / f"trainer_sweep_{k}_{vm}.jsonl") for vm in vms if vm in VMS for k in VMS[vm]]


def pooled_profile(base, vms: list[str]):
    """`base` with host terms fitted on the pooled probes of `vms` and their reference times, those of
    trainer_sweep.HOST_ANCHOR anchored on the VMs' sweeps (`fit_host_anchors`), then the sweep's runtime
    fractions (trainer_sweep.FIT) refitted under those terms from the configurations' median
    over the sweeps of `vms` (GPU-paced configurations: they repeat within 1-3% across VMs)."""
    records, reference = pool_machines([probes_of(vm) for vm in vms])
    fit = fit_host_terms(records, base)
    prof = dataclasses.replace(base, calibration={**base.calibration, **fit.terms, REFERENCE_KEY: reference})
    # host terms anchored on real-width runs, each VM's measurement at its own host factor
    runs = [(fit_host_speed(speed_records(vm), prof).factor, ts._measured(sweep_files([vm]))) for vm in vms if vm in VMS]
    anchors, anchor_configs = ts.fit_host_anchors(prof, runs, say=lambda _: None)
    prof = dataclasses.replace(prof, calibration={**prof.calibration, **anchors})
    fractions, configs = ts.fit_sweep_terms(prof, ts._measured(sweep_files(vms)),
                                            skip=[k for k in ts.FIT if fit.terms.get(k)], say=lambda _: None)
    return dataclasses.replace(prof, calibration={**prof.calibration, **fractions,
                                                  ts.SWEEP_FIT_KEY: anchor_configs + configs})


def speed_records(vm: str, around: bool = False) -> list:
    """The speed probes `calibrate --trainer --rescale` timed on the VM before its sweep, where it ran (s12
    on), else the VM's full probe set. `around`: with those it timed after the sweep too, where it did
    (trainer_speed_after_<vm>.jsonl), each probe's median over both (load_records)."""
    speed_file = RAW / f"trainer_speed_{vm}.jsonl"
    if not speed_file.exists():
        return probes_of(vm)
    after = RAW / f"trainer_speed_after_{vm}.jsonl"
    return load_records([str(speed_file)] + ([str(after)] if around and after.exists() else []))


def print_slopes(base, base_name: str = "h200") -> int:
    """Per one-GPU configuration: the least-squares slope of its measured step time against the VMs' host
    factors (ms per unit of factor; r the correlation), and the model's slope (its prediction at factors
    0.7 and 1.3). A model slope above the measured one: the model counts as host-paced work that the
    configuration's time does not follow from VM to VM."""
    factors = {vm: fit_host_speed(speed_records(vm), base).factor for vm in VMS if "single" in VMS[vm]}
    measured = {vm: ts._measured(sweep_files([vm])) for vm in factors}

    lo, hi = rescaled(base, 0.7), rescaled(base, 1.3)
    lines = ["| configuration | VMs | mean ms | measured slope (r) | model slope | model at factor 1 |",
             "|---|---:|---:|---:|---:|---:|"]
    for cfg in (c for c in ts.CONFIGS if c.gpus == 1):
        pts = [(f, measured[vm][cfg.name]["measured"]["step_time_s"] * 1e3) for vm, f in factors.items()
               if "measured" in measured[vm].get(cfg.name, {})]
        if len(pts) < 4:
            continue
        xs, ys = zip(*pts, strict=True)
        slope = statistics.linear_regression(xs, ys).slope
        model = [ts.predict(cfg, prof)[0]["step_time_s"] * 1e3 for prof in (lo, hi, base)]
        lines.append(f"| {cfg.name} | {len(pts)} | {statistics.mean(ys):.1f} | {slope:.1f} "
                     f"({statistics.correlation(xs, ys):+.2f}) | {(model[1] - model[0]) / 0.6:.1f} | {model[2]:.1f} |")
    print("\n".join(lines))
    SLOPES_DOC.write_text(
        "# How each configuration's step time follows the host factor\n\n"
        f"Command: `python benchmarks/host_transfer.py --slopes{'' if base_name == 'h200' else ' --base ' + base_name}` "
        f"(CPU; profile `{base_name}`). Per one-GPU sweep "
        "configuration: the least-squares slope of its measured step time (ms) against the VMs' host factors "
        "(`fit_host_speed` of each VM's speed probes against the profile's reference; r the correlation), and the "
        "model's slope: its prediction with the host terms scaled by 1.3 less that at 0.7, over 0.6. A model slope "
        "above the measured one: the model counts as host-paced work that the configuration's time does not "
        "follow from VM to VM (docs/trainer_sweep_notes.md, \"Host terms that travel\").\n\n"
        f"VM factors: {', '.join(f'{vm} {f:.3f}' for vm, f in factors.items())}.\n\n" + "\n".join(lines) + "\n")
    return 0


def main() -> int:
    from hardware_profiles import load_profile
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="h200", help="profile whose host terms travel (default: the shipped h200)")
    ap.add_argument("--fitted-on", default=None, choices=sorted(VMS),
                    help="the VM the base's host terms were fitted on, reported apart (h200: s4, its calibration says)")
    ap.add_argument("--pooled", action="store_true",
                    help="host terms fitted on the pooled probes of every other VM (leave one VM out)")
    ap.add_argument("--write-pooled", default=None, metavar="FILE",
                    help="write --base with the host terms of all VMs' pooled probes, and stop")
    ap.add_argument("--slopes", action="store_true",
                    help="print each one-GPU configuration's sensitivity to the host factor, measured across the "
                         "VMs against the model's, and stop")
    ap.add_argument("--power", type=float, default=1.0,
                    help="scale the host terms by factor ** POWER (a damped factor below 1; default 1: as shipped)")
    ap.add_argument("--doc", default=str(DOC))
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args()
    base = load_profile(args.base)
    if args.slopes:
        return print_slopes(base, args.base)
    if args.write_pooled:
        from hardware_profiles import profile_to_yaml
        prof = pooled_profile(base, list(PROBE_VMS))
        Path(args.write_pooled).write_text(profile_to_yaml(prof))
        print(f"wrote the host terms of {', '.join(PROBE_VMS)} pooled into {args.write_pooled}")
        return 0
    home = None if args.pooled else args.fitted_on or ("s4" if args.base == "h200" else None)
    fitted = set(base.calibration.get(ts.SWEEP_FIT_KEY, ts.SWEEP_FIT_DEFAULT))
    configs = {c.name: c for c in ts.CONFIGS}
    records, rows = [], []
    errors: dict[str, list[float]] = {"unscaled": [], "rescaled": []}
    for vm in VMS:
        probes = speed_records(vm)
        terms = pooled_profile(base, [v for v in PROBE_VMS if v != vm]) if args.pooled else base
        speed = fit_host_speed(probes, terms)
        scaled = rescaled(terms, speed.factor ** args.power)
        measured = ts._measured(sweep_files([vm]))
        vm_err: dict[str, list[float]] = {"unscaled": [], "rescaled": []}
        for name, m in measured.items():
            if name not in configs or "measured" not in m or name in fitted:
                continue
            t = m["measured"]["step_time_s"]
            pred = {lab: ts.predict(configs[name], prof, m)[0]["step_time_s"]
                    for lab, prof in (("unscaled", terms), ("rescaled", scaled))}
            records.append({"vm": vm, "name": name, "gpus": configs[name].gpus, "measured_s": t,
                            "predicted_s": pred, "factor": speed.factor})
            for lab in vm_err:
                vm_err[lab].append(abs(pred[lab] / t - 1))
        probe_ms = ", ".join(f"{r.probe.name} {r.measured_s * 1e3:.1f}" for r in probes
                             if r.probe.name in speed.ratios)
        rows.append(f"| {vm}{' (base fitted here)' if vm == home else ''} | {probe_ms} | {speed.factor:.3f} | {_summary(vm_err['unscaled'])} | "
                    f"{_summary(vm_err['rescaled'])} |")
        print(rows[-1], flush=True)
        if vm != home:
            for lab in errors:
                errors[lab] += vm_err[lab]
    held = [vm for vm in VMS if vm != home]
    summary = (f"Over the {len(held)} VMs the base was not fitted on ({', '.join(held)}; {len(errors['unscaled'])} "
               f"configurations): unscaled {_summary(errors['unscaled'])}; rescaled {_summary(errors['rescaled'])}.")
    print(summary)
    Path(args.results).write_text(json.dumps({"base": args.base, "records": records}, indent=1) + "\n")
    rel = " ".join(f"--{k} {Path(v).resolve().relative_to(ROOT) if Path(v).resolve().is_relative_to(ROOT) else v}"
                   for k, v, d in (("doc", args.doc, DOC), ("results", args.results, RESULTS))
                   if Path(v).resolve() != d.resolve())
    Path(args.doc).write_text(
        "# Host terms across machines: as fitted, and rescaled by three probes\n\n"
        f"Command: `python benchmarks/host_transfer.py{' --base ' + args.base if args.base != 'h200' else ''}"
        f"{' --fitted-on ' + args.fitted_on if args.fitted_on else ''}{' --pooled' if args.pooled else ''}"
        f"{f' --power {args.power:g}' if args.power != 1 else ''}"
        f"{' ' + rel if rel else ''}` (CPU; raw data: benchmarks/results/raw/trainer_probes_<vm>.jsonl and "
        "trainer_sweep_*_<vm>.jsonl; per-configuration records: "
        f"{Path(args.results).name}).\n\n"
        + (f"Host terms: fitted on the pooled probes of every VM of {', '.join(PROBE_VMS)} but the row's own "
           f"(leave one VM out; `pool_machines`), over `{args.base}`'s other numbers. " if args.pooled
           else f"Base profile: `{args.base}`. ")
        + "Each row is one lent H200 VM. Its trainer sweep is predicted with those "
        "host terms as they are (unscaled) and multiplied by the factor that `autoparallel calibrate --trainer "
        "--rescale` fits from the VM's own one-GPU probes (`SPEED_PROBES`, their median step times in ms below: "
        "from `--rescale`'s own run before the sweep where there is one (trainer_speed_<vm>.jsonl, s12 on), else "
        "from the VM's full probe set; "
        "autoparallel/calibrate_trainer.py `fit_host_speed`). Nothing else of the VM enters a prediction. "
        f"Left out everywhere: {', '.join(sorted(fitted))} (the base took numbers from them). "
        "Errors are |predicted / measured - 1| of the step time.\n\n"
        "| VM | probes (ms) | factor | unscaled | rescaled |\n|---|---|---:|---|---|\n" + "\n".join(rows)
        + f"\n\n{summary}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
