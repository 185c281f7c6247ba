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
from pathlib import Path

import pytest

from autoparallel.calibrate_trainer import (
    REFERENCE_KEY,
    SPEED_PROBES,
    fit_host_speed,
    load_records,
    reference_times,
    run_trainer_calibration,
    scale_host_terms,
)
from autoparallel.cli import main
from autoparallel.errors import UserError
from hardware_profiles import load_profile

RAW = Path(__file__).resolve().parents[1] / "benchmarks/results/raw"
S4, S8 = RAW / "trainer_probes_s4.jsonl", RAW / "trainer_probes_s8.jsonl"
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


def test_the_base_machines_own_probes_give_factor_one(h200):
    """h200's host_probe_ms are s4's speed-probe times rounded to 3 decimals."""
    ref = h200.calibration[REFERENCE_KEY]
    speed = fit_host_speed(load_records([str(S4)]), h200)
    assert set(speed.ratios) == set(SPEED_PROBES)
    for name, r in speed.ratios.items():
        assert r == pytest.approx(1, abs=5e-4 / ref[name]), name
    assert speed.factor == pytest.approx(1, abs=5e-4 / min(ref.values()))


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
