"""benchmarks/trainer_sweep.py's reading of raw records: several passes of one configuration become one
record whose step time is their median (the passes listed) and whose peak memory is their largest; a
failed pass does not hide a measured one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trainer_sweep as ts  # noqa: E402


def test_passes_of_a_configuration_become_its_median(tmp_path):
    raw = tmp_path / "single.jsonl"
    recs = [{"name": "a", "gpus": 1, "pass": k, "measured": {"step_time_s": t, "peak_memory_gib": g}}
            for k, (t, g) in enumerate([(0.30, 10.0), (0.90, 10.5), (0.31, 10.2)])]
    recs.append({"name": "a", "gpus": 1, "pass": 3, "error": "RuntimeError('x')"})
    recs.append({"name": "b", "gpus": 1, "pass": 0, "measured": {"step_time_s": 0.5, "peak_memory_gib": 3.0}})
    recs.append({"name": "c", "gpus": 1, "pass": 0, "error": "RuntimeError('y')"})
    raw.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = ts._measured([str(raw)])
    assert out["a"]["measured"]["step_time_s"] == pytest.approx(0.31)
    assert out["a"]["measured"]["peak_memory_gib"] == pytest.approx(10.5)
    assert out["a"]["measured"]["passes"] == [0.30, 0.90, 0.31]
    assert out["b"]["measured"] == {"step_time_s": 0.5, "peak_memory_gib": 3.0}  # one pass: as measured
    assert "error" in out["c"] and "measured" not in out["c"]


def test_a_rows_host_factor_is_the_probes_around_its_passes_against_the_base(tmp_path):
    """row_speed: each speed probe's geometric mean over the times before and after every pass of the row,
    against the base's reference times, then the geometric mean over the probes (fit_host_speed). Probes at
    k x the reference before a pass and k' x after it give sqrt(k k'); a second pass at k'' enters the same
    per-probe mean. Tolerance: float rounding of a few products and roots (1e-12)."""
    from hardware_profiles import load_profile
    base = load_profile("h200")
    ref = base.calibration["host_probe_ms"]

    def at(k: float) -> dict[str, float]:
        return {name: ms * k for name, ms in ref.items()}

    one = {"name": "a", "measured": {"step_time_s": 0.3, "peak_memory_gib": 1.0},
           "host_probes_ms": [{"before": at(0.64), "after": at(1.0)}]}
    assert ts.row_speed(one, base) == pytest.approx(0.8, rel=1e-12)
    assert ts.row_speed({"name": "b", "measured": one["measured"]}, base) is None  # measured without probes
    two = dict(one, host_probes_ms=[{"before": at(0.5), "after": at(0.5)}])
    raw = tmp_path / "single.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in (one, two)))
    merged = ts._measured([str(raw)])["a"]
    assert ts.row_speed(merged, base) == pytest.approx((0.64 * 1.0 * 0.5 * 0.5) ** 0.25, rel=1e-12)
    # the probes interleaved with the timed steps (measure --interleave-probes) are a side of their own
    stepped = dict(one, host_probes_ms=[{"before": at(0.64), "after": at(1.0), "steps": at(0.9)}])
    assert ts.row_speed(stepped, base, ["steps"]) == pytest.approx(0.9, rel=1e-12)
    assert ts.row_speed(stepped, base) == pytest.approx(0.8, rel=1e-12)


def test_host_probes_between_timed_steps_leave_the_rows_peak_memory_statistics_alone(monkeypatch):
    """measure --interleave-probes runs HostProbes.once between a configuration's timed steps, after
    time_trainer_steps reset the device's peak-memory statistics: once must not reset them (the row's measured peak
    would lose its earlier steps), while time, which runs outside the rows, does (as calibrate's probes do). On CPU,
    the CUDA calls stubbed: the three speed probes' trainers are built and stepped for real."""
    import torch

    from autoparallel.calibrate_trainer import SPEED_PROBES
    resets = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: resets.append(1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    probes = ts.HostProbes(warmup=0, steps=1)
    assert set(probes.runs) == set(SPEED_PROBES)
    before = len(resets)
    once = probes.once()
    assert set(once) == set(SPEED_PROBES) and all(ms > 0 for ms in once.values())
    assert len(resets) == before
    probes.time()
    assert len(resets) == before + len(SPEED_PROBES)


def test_sweep_terms_are_recovered_from_the_step_times_they_produce():
    """fit_sweep_terms bisects each FIT term until its configuration is predicted exactly: step times
    predicted at known fractions give those fractions back. Tolerance: the bisection's interval after 30
    halvings of FIT_RANGE (<= 1e-9) plus the 3-decimal rounding of the result (5e-4)."""
    import dataclasses

    from hardware_profiles import load_profile
    base = load_profile("h200")
    truth = {"compiled_fused_fraction": 0.55}
    prof = dataclasses.replace(base, calibration={**base.calibration, **truth})
    configs = {c.name: c for c in ts.CONFIGS}
    measured = {name: {"measured": {"step_time_s": ts.predict(configs[name], prof)[0]["step_time_s"]}}
                for key, name in ts.FIT.items() if key in truth}
    fitted, used = ts.fit_sweep_terms(base, measured, skip=["host_us_per_compiled_call"], say=lambda _: None)
    assert used == [ts.FIT[k] for k in truth]
    assert fitted == pytest.approx(truth, abs=5e-4 + 1e-9)


def test_host_anchor_is_recovered_across_machines_of_different_host_speed():
    """fit_host_anchors bisects each HOST_ANCHOR term until its configuration, predicted with every host
    term rescaled to each machine's factor, matches the machines' times in geometric mean: times predicted
    at a known term on two machines (factors 0.8 and 1.25) give it back. Tolerance: 30 halvings of the
    range (5000 us / 2^30 < 1e-5) plus the 3-decimal rounding (5e-4)."""
    import dataclasses

    from autoparallel.calibrate_trainer import rescaled
    from hardware_profiles import load_profile
    base = load_profile("h200")
    (key, (name, _)), = ts.HOST_ANCHOR.items()
    truth = 700.0
    cfg = next(c for c in ts.CONFIGS if c.name == name)
    prof = dataclasses.replace(base, calibration={**base.calibration, key: truth})
    runs = [(f, {name: {"measured": {"step_time_s": ts.predict(cfg, rescaled(prof, f))[0]["step_time_s"]}}})
            for f in (0.8, 1.25)]
    fitted, used = ts.fit_host_anchors(base, runs + [(1.0, {})], say=lambda _: None)
    assert used == [name]
    assert fitted[key] == pytest.approx(truth, abs=5e-4 + 1e-5)
    assert ts.fit_host_anchors(base, [(1.0, {})], say=lambda _: None) == ({}, [])  # none measured: the probes'


def test_update_rates_read_the_fractions_from_profiled_kernels():
    """update_rates: AdamW's fraction from every model's kernel time (28 B a parameter), the copies' from
    the unshard and reduction spans (10 + 18 B a parameter at d = 1) of the models whose mean tensor
    outlasts FSDP's per-tensor host work; a small-tensor model's slower spans are left out. Times built at
    known fractions give them back to float precision (the medians of equal values)."""
    from hardware_profiles import load_profile
    prof = load_profile("h200")
    bw = prof.memory_bandwidth
    configs = {c.name: c for c in ts.CONFIGS}
    records = []
    for name, copy_fraction in (("1g-mixtral-eager", 0.8), ("1g-llama-eager", 0.3)):
        n = sum(p.numel() for p in ts._meta(configs[name].model).parameters())
        records.append({"name": name, "profile": {"ops": {
            "aten::_fused_adamw_": [2, n * 28 / (bw * 0.7), 0.0],
            "FSDP::pre_forward (layers.0)": [1, n * 6 / (bw * copy_fraction), 0.0],
            "FSDP::pre_forward": [1, n * 4 / (bw * copy_fraction), 0.0],
            "FSDP::post_backward_reduce (layers.0)": [2, n * 18 / (bw * copy_fraction), 0.0]}}})
    rows, fractions = ts.update_rates(records, prof)
    assert [r["large"] for r in rows] == [True, False]  # 138M against 5.5M parameters a tensor
    assert fractions["adamw"] == pytest.approx(0.7, rel=1e-9)
    assert fractions["fsdp_copy_fraction"] == pytest.approx(0.8, rel=1e-9)


def test_shipping_fitted_terms_keeps_the_held_per_op_checkpointing_terms():
    """`ship` writes a fit's terms into h200.yaml: every term the profile reads stays (per-op checkpointing's
    HELD_TERMS had been dropped as stale, silently pricing its host work at nothing) and takes the fit's
    value; a term no longer read is dropped; other lines are kept."""
    import yaml

    from cost_models.host import HELD_TERMS, HOST_TERMS
    text = (Path(ts.ROOT) / "hardware_profiles" / "h200.yaml").read_text()
    shipped = yaml.safe_load(text)["calibration"]
    keys = ("compiled_fused_fraction", *HOST_TERMS, *HELD_TERMS, "host_us_per_op", "host_us_per_op_moe",
            "host_us_per_op_fwd_bwd", "host_us_per_op_moe_fwd_bwd", ts.REFERENCE_KEY)
    fitted = {k: ([x * 2 for x in shipped[k]] if isinstance(shipped[k], list) else shipped[k] if isinstance(
        shipped[k], dict) else shipped[k] * 2) for k in keys}
    stale = text.replace("  host_us_per_step:", "  host_us_per_gone: 1.0\n  host_us_per_step:", 1)
    out = ts.shipped_text(stale, fitted)
    cal = yaml.safe_load(out)["calibration"]
    for k in keys:
        assert cal[k] == fitted[k], k
    assert "host_us_per_gone" not in cal
    assert cal["memory_fraction"] == shipped["memory_fraction"]
    assert out.count("\n") == text.count("\n")


def test_repeated_measurements_are_scored_each_and_by_their_median(tmp_path, monkeypatch):
    """`repeats`: every measurement of a configuration against one prediction, the median's error, and each
    measurement's distance from the configuration's own mean; a configuration measured once is left out.
    With the prediction fixed at 0.2 s and measurements 0.2, 0.25, 0.15 s: errors 0, 20%, 33.3%; the median
    0.2 s (error 0); distances from the mean 0.2: 0, 25%, 25%."""
    raw = tmp_path / "r.jsonl"
    names = [c.name for c in ts.CONFIGS[:2]]
    recs = [{"name": names[0], "measured": {"step_time_s": t, "peak_memory_gib": 1.0}, "isolated": i}
            for t, i in ((0.2, False), (0.25, True), (0.15, False))]
    recs.append({"name": names[1], "measured": {"step_time_s": 0.3, "peak_memory_gib": 1.0}})
    raw.write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(ts, "predict", lambda cfg, profile, raw=None: ({"step_time_s": 0.2}, None))
    lines, totals = ts.repeat_rows([str(raw)], profile=None)
    assert len(lines) == 3 and names[0] in lines[2] and "250.0 i" in lines[2]
    assert totals["measurements"] == 3 and totals["rows"] == 1
    assert totals["error_mean"] == pytest.approx((0 + 0.2 + 1 / 3) / 3)
    assert totals["within_10"] == 1 and totals["medians_within_10"] == 1
    assert totals["median_error_mean"] == pytest.approx(0.0)
    assert totals["own_mean_distance"] == pytest.approx((0 + 0.25 + 0.25) / 3)


def test_launch_regions_counts_each_compiled_calls_launches_and_names_their_kernels():
    """profile_timeline.launch_regions: per compiled region kind, the median call's host time and launches (the
    runtime's and the driver's launch calls inside the call on its thread), and the kernels those launches issued,
    matched by correlation id; a launch on another thread or outside the call is not the call's."""
    import profile_timeline as pt

    def x(name, cat, ts_, dur, tid, corr=None):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts_, "dur": dur, "tid": tid,
                **({"args": {"correlation": corr}} if corr is not None else {})}
    events = [x("Torch-Compiled Region: 0/0", "cpu_op", 0, 100, 1), x("Torch-Compiled Region: 0/0", "cpu_op", 200, 50, 1),
              x("cudaLaunchKernel", "cuda_runtime", 10, 5, 1, 7), x("cuLaunchKernel", "cuda_driver", 20, 5, 1, 8),
              x("cuLaunchKernel", "cuda_driver", 20, 5, 2, 9),      # another thread
              x("cudaLaunchKernel", "cuda_runtime", 150, 5, 1, 10),  # between the calls
              x("cudaLaunchKernel", "cuda_runtime", 210, 5, 1, 11),
              x("nvjet_gemm", "kernel", 15, 5, 9, 7), x("triton_poi_fused_0", "kernel", 30, 5, 9, 8),
              x("triton_red_fused_1", "kernel", 220, 5, 9, 11)]
    got = pt.launch_regions({"traceEvents": events})["Torch-Compiled Region"]
    assert got["calls"] == 2 and got["host_us"] == 75 and got["launches"] == 1.5
    assert got["kernels"] == ["triton_red_fused_1"]  # the lower median call: one launch
