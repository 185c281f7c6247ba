"""`autoparallel calibrate --trainer --rescale` (autoparallel/calibrate_trainer.py): one factor, the geometric
mean of the SPEED_PROBES' step-time ratios against the profile's `host_probe_ms`, moves every host_us_*
term.

Tolerances: written values are rounded to 3 decimals, so each is within half a unit of the third decimal
(5e-4) of the exact product, and a stored probe time m (ms) is within 5e-4 / m relative of the measured
one."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pytest

from autoparallel.calibrate_trainer import (
    REFERENCE_KEY,
    SPEED_PROBES,
    fit_host_speed,
    load_records,
    pool_machines,
    reference_times,
    run_trainer_calibration,
    scale_host_terms,
)
from autoparallel.cli import main
from autoparallel.errors import UserError
from hardware_profiles import load_profile

RAW = Path(__file__).resolve().parents[1] / "benchmarks/results/raw"
RESULTS = RAW.parent
S4, S8, S12 = (RAW / f"trainer_probes_{vm}.jsonl" for vm in ("s4", "s8", "s12"))
HALF = 5e-4 + 1e-9  # round(x, 3) moves x by at most 5e-4; 1e-9 absorbs the float error of the product


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def h200():
    return load_profile("h200")


def write_probes(path: Path, ms: dict[str, float]) -> str:
    """Probe records (the plans of s4's records) with the given step times in ms."""
    recs = {r["probe"]: r for r in map(json.loads, S4.read_text().splitlines())}
    path.write_text("".join(json.dumps({**recs[name], "measured": {"step_time_s": t / 1e3}}) + "\n"
                            for name, t in ms.items()))
    return str(path)


def scaled_reference(profile, k: float) -> dict[str, float]:
    return {name: k * float(t) for name, t in profile.calibration[REFERENCE_KEY].items()}


def assert_host_terms_scaled(got: dict, shipped: dict, k: float, tol: float) -> None:
    for key, v in shipped.items():
        if key.startswith("host_us_"):
            want = [u * k for u in v] if isinstance(v, list) else v * k
            assert got[key] == pytest.approx(want, abs=tol), key


def test_scale_host_terms_scales_every_host_entry_and_returns_nothing_else(h200):
    cal = {"host_us_per_op": 10.0, "host_us_per_op_fwd_bwd": [1.0, 2.0], "host_us_per_new_gemm_shape": 230.0,
           "fsdp_copy_fraction": 0.5, REFERENCE_KEY: {"llama-m1": 60.0}, "gemm_bf16_best_tflops": 817.6}
    assert scale_host_terms(cal, 2.5) == {"host_us_per_op": 25.0, "host_us_per_op_fwd_bwd": [2.5, 5.0],
                                          "host_us_per_new_gemm_shape": 575.0}
    shipped = h200.calibration
    out = scale_host_terms(shipped, 1.7)
    assert set(out) == {k for k in shipped if k.startswith("host_us_")}
    assert_host_terms_scaled(out, shipped, 1.7, HALF)


def test_factor_is_the_geometric_mean_over_speed_probes_in_both(h200, tmp_path):
    ref = scaled_reference(h200, 1.0)
    ms = {"llama-m1": 2 * ref["llama-m1"], "llama-m4": 3 * ref["llama-m4"], "moe-m2": 4.5 * ref["moe-m2"],
          "llama-m4-full": 1e6}  # not a speed probe: its wild time must not move the factor
    records = load_records([write_probes(tmp_path / "p.jsonl", ms)])
    speed = fit_host_speed(records, h200)
    assert speed.ratios == pytest.approx({"llama-m1": 2, "llama-m4": 3, "moe-m2": 4.5}, rel=1e-12)
    assert speed.factor == pytest.approx((2 * 3 * 4.5) ** (1 / 3), rel=1e-12)
    # a probe the profile's reference lacks is left out, and so is a reference time of a non-speed probe
    no_moe = {k: v for k, v in h200.calibration[REFERENCE_KEY].items() if k != "moe-m2"}
    ref = {**no_moe, "llama-m4-full": 1.0}
    base = dataclasses.replace(h200, calibration={**h200.calibration, REFERENCE_KEY: ref})
    assert fit_host_speed(records, base).factor == pytest.approx(math.sqrt(6), rel=1e-12)


def test_the_fitting_machines_own_probes_give_factor_one():
    """A fit writes its records' speed-probe times (3 decimals) as the profile's reference: s12's fit file
    (`trainer_sweep.py fit`), rescaled by s12's own probes, stays where it is."""
    fitted = load_profile(str(RESULTS / "h200_trainer_fit_s12.yaml"))
    ref = fitted.calibration[REFERENCE_KEY]
    speed = fit_host_speed(load_records([str(S12)]), fitted)
    assert set(speed.ratios) == set(SPEED_PROBES)
    for name, r in speed.ratios.items():
        assert r == pytest.approx(1, abs=5e-4 / ref[name]), name
    assert speed.factor == pytest.approx(1, abs=5e-4 / min(ref.values()))


def test_pooled_machines_are_brought_to_one_host_speed_then_take_each_probes_median():
    """pool_machines: the reference is each speed probe's geometric mean over the machines; each machine's
    times are divided by its factor against it; a probe's pooled time is the median over the machines."""
    machines = [load_records([str(f)]) for f in (S4, S8, S12)]
    pooled, ref = pool_machines(machines)
    times = [{r.probe.name: r.measured_s for r in m} for m in machines]
    exact = {name: 1e3 * math.prod(t[name] for t in times) ** (1 / 3) for name in SPEED_PROBES}
    assert ref == pytest.approx(exact, abs=HALF)
    factors = [math.prod(t[p] * 1e3 / exact[p] for p in SPEED_PROBES) ** (1 / 3) for t in times]
    by_name = {r.probe.name: r for r in pooled}
    for name, rec in by_name.items():
        expected = statistics.median(t[name] / f for t, f in zip(times, factors, strict=True) if name in t)
        assert rec.measured_s == pytest.approx(expected, rel=1e-12), name
    # a probe only s4 measured (two-GPU ones) keeps s4's time at the pooled speed
    assert by_name["llama-tp2-m2"].measured_s == pytest.approx(times[0]["llama-tp2-m2"] / factors[0], rel=1e-12)
    # each machine, brought to the pooled speed, is at factor 1 against the pooled reference; the pooled
    # probes (medians of those) lie between the machines' normalized ratios
    h200 = load_profile("h200")
    base = dataclasses.replace(h200, calibration={**h200.calibration, REFERENCE_KEY: exact})
    for m, f in zip(machines, factors, strict=True):
        normalized = [dataclasses.replace(r, measured_s=r.measured_s / f) for r in m]
        assert fit_host_speed(normalized, base).factor == pytest.approx(1, rel=1e-12)
    ratios = [t[p] * 1e3 / f / exact[p] for t, f in zip(times, factors, strict=True) for p in SPEED_PROBES]
    assert min(ratios) <= fit_host_speed([by_name[n] for n in SPEED_PROBES], base).factor <= max(ratios)


def test_pooling_refuses_a_machine_without_speed_probes_or_with_other_plans():
    s4, s8 = load_records([str(S4)]), load_records([str(S8)])
    with pytest.raises(UserError, match="lacks the speed probes"):
        pool_machines([s4, [r for r in s8 if r.probe.name != "moe-m2"]])
    other = load_records([str(S4)])
    changed = [dataclasses.replace(r, plan=dataclasses.replace(r.plan, micro_batch=2)) if r.probe.name == "llama-m4"
               else r for r in other]
    with pytest.raises(UserError, match="different plans"):
        pool_machines([s8, changed])


def test_uniform_k_gives_k_and_a_profile_with_every_host_term_times_k(h200, tmp_path):
    k = 1.2345  # not a round number: a factor rounded on the way would show
    probes = write_probes(tmp_path / "p.jsonl", scaled_reference(h200, k))
    assert fit_host_speed(load_records([probes]), h200).factor == pytest.approx(k, rel=1e-12)
    out = tmp_path / "here.yaml"
    assert run_trainer_calibration(base="h200", output=str(out), raw=None, fit=[probes], say=quiet,
                                   rescale=True) == 0
    got, shipped = load_profile(str(out)), h200.calibration
    assert_host_terms_scaled(got.calibration, shipped, k, HALF)
    assert got.calibration[REFERENCE_KEY] == pytest.approx(scaled_reference(h200, k), abs=HALF)
    assert set(got.calibration) == set(shipped) | {"host_speed"}  # the note on where the terms came from
    for key, v in shipped.items():
        if not key.startswith("host_us_") and key != REFERENCE_KEY:
            assert got.calibration[key] == v, key
    same = {"calibration": None, "path": None}  # the rest of the profile is the base's
    assert dataclasses.replace(got, **same) == dataclasses.replace(h200, **same)


def test_a_profile_without_fitted_host_terms_or_probe_times_is_refused(h200, tmp_path):
    records = load_records([write_probes(tmp_path / "p.jsonl", scaled_reference(h200, 2))])
    no_ref = dataclasses.replace(h200, calibration={k: v for k, v in h200.calibration.items()
                                                    if k != REFERENCE_KEY})
    for base in (load_profile("a100-sxm-80gb"), no_ref):
        with pytest.raises(UserError, match=REFERENCE_KEY):
            fit_host_speed(records, base)
    others = load_records([write_probes(tmp_path / "q.jsonl", {"llama-m4-full": 250.0, "wide-m4": 55.0})])
    with pytest.raises(UserError, match="none of the probes"):
        fit_host_speed(others, h200)


@pytest.mark.parametrize("args, message", [
    (["calibrate", "--trainer", "--rescale", "--fit", "{probes}", "--base", "a100-sxm-80gb"], REFERENCE_KEY),
    (["calibrate", "--rescale"], "belong to --trainer"),
    (["calibrate", "--rescale", "--fit", "{probes}", "--base", "h200"], "belong to --trainer"),
    # measuring into a file that holds records (any machine's) would take their medians with this one's
    (["calibrate", "--trainer", "--rescale", "--raw", "{probes}", "--base", "h200"], "already holds records"),
])
def test_bad_rescale_input_is_one_error_line(args, message, h200, tmp_path, capsys):
    probes = write_probes(tmp_path / "p.jsonl", scaled_reference(h200, 2))
    out = tmp_path / "x.yaml"
    assert main([a.format(probes=probes) for a in args] + ["--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not out.exists()


def test_rescaling_a_rescaled_profile_composes(h200, tmp_path):
    twice, thrice = tmp_path / "x2.yaml", tmp_path / "x3.yaml"
    run_trainer_calibration(base="h200", output=str(twice), raw=None, say=quiet, rescale=True,
                            fit=[write_probes(tmp_path / "p2.jsonl", scaled_reference(h200, 2))])
    probes3 = write_probes(tmp_path / "p3.jsonl", scaled_reference(h200, 3))
    mid = load_profile(str(twice))
    ref2 = mid.calibration[REFERENCE_KEY]
    factor = fit_host_speed(load_records([probes3]), mid).factor
    assert factor == pytest.approx(1.5, abs=1.5 * 5e-4 / min(ref2.values()))
    run_trainer_calibration(base=str(twice), output=str(thrice), raw=None, fit=[probes3], say=quiet,
                            rescale=True)
    # two roundings: the first one's error is scaled by 1.5, then the second adds its own
    assert_host_terms_scaled(load_profile(str(thrice)).calibration, h200.calibration, 3, 1.5 * HALF + HALF)


def test_full_fit_records_its_speed_probe_times(tmp_path):
    out = tmp_path / "fitted.yaml"
    assert run_trainer_calibration(base="h200", output=str(out), raw=None, fit=[str(S8)], say=quiet) == 0
    ref = load_profile(str(out)).calibration[REFERENCE_KEY]
    assert ref == reference_times(load_records([str(S8)]))
    assert set(ref) == set(SPEED_PROBES)
