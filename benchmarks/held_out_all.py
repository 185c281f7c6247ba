"""Every one-GPU held-out sweep row of every VM against one base profile, each VM's rows predicted with the
base rescaled by that VM's own speed probes (`calibrate --trainer --rescale`'s factor, trainer_speed_sN.jsonl).
The one number a cost-model change is judged by across VMs, on CPU in several minutes (Hugging Face rows with
transformers 5.17 on the path, as the device ran them):

    python benchmarks/held_out_all.py                        # the shipped h200 profile
    python benchmarks/held_out_all.py --base CANDIDATE.yaml --rows
    python benchmarks/held_out_all.py --around               # each VM's probes before and after its sweep pooled

Groups: the VMs s19-s35 (153 rows), s37 (the one-GPU sweep on a fresh VM), and each family run since; the H100 VMs
(s118, s119) against the profile derived for that card. Rows the base took from a sweep (its `sweep_fit_configs`)
are left out. Prints mean |error|, the count within 10% and the
largest per VM and group (host_transfer's summary), and the peak memory's mean |error|, count within 5% and
largest; `--rows` each row's errors; `--spread` each configuration measured on five VMs or more: its signed error's
mean and standard deviation across them (a bias of the model against the VMs' scatter).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import host_transfer as ht  # noqa: E402
import trainer_sweep as ts  # noqa: E402

from autoparallel.calibrate_trainer import fit_host_speed, rescaled  # noqa: E402

RAW = ht.RAW
# VM -> its sweep files (one GPU); its speed probes are trainer_speed_<vm>.jsonl
VMS = {"s19": ["single"], "s20": ["single"], "s21": ["single", "wide"], "s22": ["families"], "s23": ["families2"],
       "s26": ["families3"], "s28": ["single"], "s29": ["families4"], "s30": ["families5"], "s31": ["selective_hf"],
       "s33": ["families6"], "s34": ["families6b"], "s35": ["families7"], "s37": ["single"], "s40": ["compiled_hf"],
       "s41": ["families8"], "s43": ["families9"], "s45": ["families10"], "s46": ["single"],
       "s47": ["families11"], "s48": ["families12"], "s49": ["single"], "s50": ["families13"], "s51": ["families14"],
       "s53": ["families15"], "s54": ["families16"], "s57": ["families17"], "s58": ["families18"], "s59": ["padded"],
       "s60": ["families19"], "s61": ["families19b"], "s62": ["families20"], "s63": ["families21"], "s64": ["families22"],
       "s65": ["families23a", "families23b"], "s66": ["single"], "s67": ["families24"], "s68": ["families24b"],
       "s69": ["families25"], "s70": ["families26"], "s72": ["single"], "s80": ["compiled_check"], "s82": ["moe_compiled"], "s84": ["accumulate_check"], "s85": ["single_check"],
       "s88": ["single_check"], "s89": ["moe_replay"], "s90": ["moe_check"],
       "s91": ["single_check"], "s93": ["moe_replay"], "s95": ["families27a"], "s96": ["families27b"],
       "s97": ["families28"], "s98": ["families28"], "s99": ["single_check"],
       "s101": ["single_probed_a", "single_probed_b"], "s101c": ["families29"],
       "s102": ["single_probed_a", "single_probed_b"], "s103": ["families30"],
       "s105": ["families31"], "s107": ["alloc_default"], "s108": ["carry_check"], "s109": ["families32"], "s110": ["families33"],
       "s112": ["families34"], "s114": ["families35"], "s115": ["families36"], "s117": ["clip38"]}
# VMs with an H100 (nvidia-h100-x1): their rows predicted with --h100-base (h100-sxm, derived from the shipped h200)
H100_VMS = {"s118": ["single_check_h100"], "s119": ["hf_h100"]}
VMS.update(H100_VMS)
POOLED = {f"s{n}" for n in (19, 20, 21, 22, 23, 26, 28, 29, 30, 31, 33, 34, 35)}  # reported together


def vm_profile(base, vm: str, around: bool = False):
    """`base` rescaled to the VM `vm` by its own speed probes (trainer_speed_<vm>.jsonl; `around`: with those
    after its sweep, host_transfer.speed_records)."""
    return rescaled(base, fit_host_speed(ht.speed_records(vm, around), base).factor)


def errors(base, vm: str, around: bool = False) -> list[tuple[str, float, float]]:
    """(configuration, predicted / measured - 1 of the step time, of the peak memory) of `vm`'s held-out rows
    under `base` rescaled to the VM."""
    fit = set(base.calibration.get(ts.SWEEP_FIT_KEY, ts.SWEEP_FIT_DEFAULT))
    profile = vm_profile(base, vm, around)
    configs = {c.name: c for c in ts.CONFIGS}
    measured = ts._measured([str(RAW / f"trainer_sweep_{k}_{vm}.jsonl") for k in VMS[vm]])
    out = []
    for name, m in measured.items():
        if name in configs and "measured" in m and name not in fit:
            pred, _ = ts.predict(configs[name], profile, raw=m)
            out.append((name, pred["step_time_s"] / m["measured"]["step_time_s"] - 1,
                        pred["peak_memory_gib"] / m["measured"]["peak_memory_gib"] - 1))
    return out


def _memory_summary(errors: list[float]) -> str:
    return f"memory {sum(errors) / len(errors):.1%} mean, {sum(e <= 0.05 for e in errors)} within 5%, max {max(errors):.1%}"


def main() -> int:
    from hardware_profiles import load_profile
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="h200", help="profile name or YAML file (default: the shipped h200)")
    ap.add_argument("--h100-base", default="h100-sxm", help="the profile of the H100 VMs (default: %(default)s)")
    ap.add_argument("--rows", action="store_true", help="print each row's error")
    ap.add_argument("--around", action="store_true",
                    help="each VM's speed from its probes before and after its sweep, where both ran")
    ap.add_argument("--spread", action="store_true",
                    help="per configuration measured on >= 5 VMs: the signed error's mean and spread across them")
    args = ap.parse_args()
    base, h100 = load_profile(args.base), load_profile(args.h100_base)
    groups: dict[str, list[tuple[float, float]]] = {}
    by_config: dict[str, list[float]] = {}
    for vm in VMS:
        errs = errors(h100 if vm in H100_VMS else base, vm, args.around)
        for name, t, _ in errs:
            by_config.setdefault(name, []).append(t)
        print(f"{vm}: {ht._summary([abs(t) for _, t, _ in errs])}; {_memory_summary([abs(m) for _, _, m in errs])}",
              flush=True)
        if args.rows:
            for name, t, m in errs:
                print(f"    {name:32s} {t:+.1%}  memory {m:+.1%}")
        label = "s19-s35" if vm in POOLED else f"{vm} (H100)" if vm in H100_VMS else vm
        groups.setdefault(label, []).extend((abs(t), abs(m)) for _, t, m in errs)
    for label, errs in groups.items():
        print(f"== {label}: {ht._summary([t for t, _ in errs])}; {_memory_summary([m for _, m in errs])}")
    every = [e for errs in groups.values() for e in errs]
    print(f"== all {len(every)} rows: {ht._summary([t for t, _ in every])}; {_memory_summary([m for _, m in every])}")
    if args.spread:
        print("configuration (VMs): signed error mean, standard deviation, min, max")
        for name, ts_ in sorted(((n, e) for n, e in by_config.items() if len(e) >= 5),
                                key=lambda kv: -statistics.pstdev(kv[1])):
            print(f"    {name:32s} ({len(ts_):2d}) {statistics.mean(ts_):+6.1%} {statistics.pstdev(ts_):5.1%} "
                  f"{min(ts_):+6.1%} {max(ts_):+6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
