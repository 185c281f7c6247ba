"""autoparallel calibrate: the fits recover known parameters from samples the cost model's own formulas
generate, the measuring code runs end to end (on the CPU, with tiny shapes), the written profile
validates, and a host without an accelerator gets one clear error line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from autoparallel import calibrate as cal
from autoparallel.cli import main as cli_main
from autoparallel.errors import UserError
from cost_models.comm import Link, all_gather_time, all_reduce_time, reduce_scatter_time
from cost_models.compute import op_times
from hardware_profiles import Efficiency, load_profile, profile_from_yaml, validate_profile_file

TINY = cal.CalibrationPlan(
    gemm_shapes=((32, 32, 32), (64, 64, 64), (128, 128, 128)), gemm_wgrad_shapes=((32, 64, 128),),
    other_dtype_shapes=((32, 32, 32),), bandwidth_bytes=(2**14, 2**18), attention_shapes=((1, 2, 1, 32, 16),),
    grouped_gemm_shapes=((4, 16, 32, 64),),
    collective_bytes=(1024,), reps=2, warmup=1, large_bandwidth_bytes=2**16, class_bytes=2**18,
    host_inner=1)


def _profile_with(gmax: float, half: float, mem: float, overhead: float):
    base = load_profile("h200")
    eff = dataclasses.replace(base.efficiency, gemm_max=gmax, gemm_half_flops=half, memory_bound=mem,
                              kernel_overhead_s=overhead)
    return dataclasses.replace(base, efficiency=eff)


def test_gemm_fit_recovers_the_cost_model_curve():
    truth = _profile_with(0.74, 3.2e9, 0.85, 2.5e-6)
    shapes = [(n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)] + [(8192, 768, 768), (16384, 4096, 11008)]
    flops = np.array([2.0 * m * n * k for m, n, k in shapes])
    moved = np.array([2.0 * (m * k + k * n + m * n) for m, n, k in shapes])
    seconds = op_times(flops, moved, np.ones(len(shapes), dtype=bool), truth, "bf16")
    g, h, rms = cal.fit_gemm_curve(flops, moved, seconds, truth.peak("bf16"), truth.memory_bandwidth, 0.85, 2.5e-6)
    assert g == pytest.approx(0.74, rel=0.01)
    assert h == pytest.approx(3.2e9, rel=0.03)
    assert rms < 0.01


def test_grouped_gemm_fit_recovers_the_cost_model_curve():
    """Samples timed by cost_models.compute.op_times with groups (per-group curve) fit back to its
    gemm_grouped_max / gemm_grouped_half_flops."""
    base = load_profile("h200")
    truth = dataclasses.replace(base, calibration={**base.calibration, "gemm_grouped_max": 0.66,
                                                   "gemm_grouped_half_flops": 7e8})
    from cost_models.compute import CLASS_CODE
    shapes = [(8, 4096, 2816, 1024), (8, 2048, 1024, 2816), (128, 256, 768, 2048), (128, 1024, 2048, 768),
              (64, 512, 1408, 2048), (8, 8192, 14336, 4096)]
    samples = []
    for g, m, n, k in shapes:
        s = cal.GroupedGemmSample(g, m, n, k, "fwd", 0.0)
        t = op_times(np.array([s.flops]), np.array([s.bytes]), np.array([True]), truth, "bf16",
                     np.array([CLASS_CODE["gemm_grouped"]], dtype=np.int8), groups=np.array([float(g)]))
        samples.append(dataclasses.replace(s, seconds=float(t[0])))
    copy = cal.BandwidthSample("copy", 2**30, 2**30 / (truth.memory_bandwidth * truth.efficiency.memory_bound))
    meas = cal.Measurements("cuda:0", "H200", "x", "today", gemm=[cal.GemmSample(4096, 4096, 4096, "bf16", "nn", 2e-4),
                                                                  cal.GemmSample(1024, 1024, 1024, "bf16", "nn", 1e-5)],
                            grouped_gemm=samples, bandwidth=[copy], launch_graph_s=truth.efficiency.kernel_overhead_s)
    f = cal.fit(meas, truth, TINY)
    assert f.gemm_grouped == pytest.approx(0.66, abs=0.01)
    assert f.gemm_grouped_half == pytest.approx(7e8, rel=0.1)


def _attention_profile(fwd: list[float], bwd: list[float]):
    base = load_profile("h200")
    causal_only = {k: v for k, v in base.calibration.items() if not k.startswith("attention_masked")}
    return dataclasses.replace(base, calibration={**causal_only, "attention_fwd_terms": fwd,
                                                  "attention_bwd_terms": bwd})


def _attention_samples(truth) -> list:
    """Times of cal.ATTENTION_SHAPES as compute.attention_times prices them, from each shape's FLOPs, key
    length and head dimension (the cost model's reading of a traced op), not from the shape's element counts
    the fit uses: a round trip between the two."""
    from cost_models.compute import attention_times
    out = []
    for b, h, hkv, s, d in cal.ATTENTION_SHAPES:
        ff, fb = cal._sdpa_flops((b, h, s, d), (b, hkv, s, d))
        tf = attention_times(np.array([ff]), "fwd", s, d, truth, "bf16")[0]
        tb = attention_times(np.array([fb]), "bwd", s, d, truth, "bf16")[0]
        out.append(cal.AttentionSample(b, h, hkv, s, d, ff, fb, float(tf), float(tb), "default"))
    return out


def test_attention_fit_recovers_the_cost_model_terms():
    fwd, bwd = [2.1, 0.16, 3.7, 19.0], [1.6, 0.34, 31.0, 48.0]
    truth = _attention_profile(fwd, bwd)
    samples = _attention_samples(truth)
    peak, bw = truth.peak("bf16"), truth.memory_bandwidth
    # exact data, a well-posed linear least squares: recovered to rounding
    assert cal.fit_attention_terms(samples, "fwd", peak, bw) == pytest.approx(fwd, rel=1e-6)
    assert cal.fit_attention_terms(samples, "bwd", peak, bw) == pytest.approx(bwd, rel=1e-6)
    # and what calibrate writes is what the cost model reads back
    meas = cal.Measurements("cuda:0", "H200", "x", "today", gemm=[cal.GemmSample(4096, 4096, 4096, "bf16", "nn", 2e-4),
                                                                  cal.GemmSample(1024, 1024, 1024, "bf16", "nn", 1e-5)],
                            attention=samples, launch_graph_s=truth.efficiency.kernel_overhead_s,
                            bandwidth=[cal.BandwidthSample("copy", 2**30, 2**30 / (bw * 0.8))])
    f = cal.fit(meas, truth, TINY)
    extra = cal.profile_extra(truth, meas, f)
    assert extra["calibration"]["attention_fwd_terms"] == pytest.approx(fwd, rel=1e-3)  # 4 significant digits
    assert extra["calibration"]["attention_bwd_terms"] == pytest.approx(bwd, rel=1e-3)


def test_heads_between_tiles_are_fitted_at_the_width_their_kernel_computes():
    """Shapes at heads of 80 and 96 priced by the cost model (which pads them to the 128-wide tile: h200's
    attention_head_dim_tile) beside the calibration's 64- and 128-wide ones: fitted at their padded width
    (cal.padded_samples) the terms come back to rounding; at the traced width the same times fit worse."""
    from cost_models.compute import attention_times
    fwd, bwd = [2.1, 0.16, 3.7, 19.0], [1.6, 0.34, 31.0, 48.0]
    truth = _attention_profile(fwd, bwd)
    samples = _attention_samples(truth)
    for b, h, s, d in ((2, 32, 2048, 80), (8, 32, 2048, 80), (4, 32, 4096, 96), (2, 32, 2048, 96)):
        ff, fb = cal._sdpa_flops((b, h, s, d), (b, h, s, d))
        tf, tb = (float(attention_times(np.array([f]), ph, s, d, truth, "bf16")[0])
                  for f, ph in ((ff, "fwd"), (fb, "bwd")))
        samples.append(cal.AttentionSample(b, h, h, s, d, ff, fb, tf, tb, "default"))
    peak, bw = truth.peak("bf16"), truth.memory_bandwidth
    padded = cal.padded_samples(samples, truth)
    assert {x.head_dim for x in padded} == {64, 128}
    assert cal.fit_attention_terms(padded, "fwd", peak, bw) == pytest.approx(fwd, rel=1e-6)
    assert cal.fit_attention_terms(padded, "bwd", peak, bw) == pytest.approx(bwd, rel=1e-6)
    assert cal.fit_attention_terms(samples, "fwd", peak, bw) != pytest.approx(fwd, rel=1e-3)

def test_masked_attention_terms_round_trip_and_price_only_masked_ops():
    """Masked samples (causal through an additive mask) fit terms of their own, written as
    attention_masked_*_terms, while the causal terms still come from the causal samples alone; the cost model
    then prices an op by its kind. Without masked terms a masked op costs the causal terms with the FLOP and
    score terms doubled (a kernel that cannot skip the masked half), which here is 2x minus the row and fixed
    terms' share."""
    from cost_models.compute import attention_times

    fwd, bwd = [2.1, 0.16, 3.7, 19.0], [1.6, 0.34, 31.0, 48.0]
    mfwd, mbwd = [0.44, 0.25, 5.6, 19.0], [0.31, 0.05, 27.0, 37.0]
    truth = _attention_profile(fwd, bwd)
    masked_truth = _attention_profile(mfwd, mbwd)
    samples = _attention_samples(truth) + [dataclasses.replace(x, masked=True)
                                           for x in _attention_samples(masked_truth)]
    meas = cal.Measurements("cuda:0", "H200", "x", "today", gemm=[cal.GemmSample(4096, 4096, 4096, "bf16", "nn", 2e-4),
                                                                  cal.GemmSample(1024, 1024, 1024, "bf16", "nn", 1e-5)],
                            attention=samples, launch_graph_s=truth.efficiency.kernel_overhead_s,
                            bandwidth=[cal.BandwidthSample("copy", 2**30, 2**30 / (truth.memory_bandwidth * 0.8))])
    cal_keys = cal.profile_extra(truth, meas, cal.fit(meas, truth, TINY))["calibration"]
    assert cal_keys["attention_fwd_terms"] == pytest.approx(fwd, rel=1e-3)
    assert cal_keys["attention_masked_fwd_terms"] == pytest.approx(mfwd, rel=1e-3)
    assert cal_keys["attention_masked_bwd_terms"] == pytest.approx(mbwd, rel=1e-3)

    prof = dataclasses.replace(truth, calibration={**truth.calibration, **{k: v for k, v in cal_keys.items()
                                                                            if k.startswith("attention_masked")}})
    flops = np.array([4.4e12, 4.4e12])  # one 8192-token, 32-head, 128-dim call each way
    kinds = np.array([False, True])
    both = attention_times(flops, "fwd", 8192, 128, prof, "bf16", kinds)
    assert both[0] == pytest.approx(attention_times(flops[:1], "fwd", 8192, 128, truth, "bf16")[0], rel=1e-12)
    assert both[1] == pytest.approx(attention_times(flops[:1], "fwd", 8192, 128, masked_truth, "bf16")[0], rel=1e-3)
    fallback = attention_times(flops, "fwd", 8192, 128, truth, "bf16", kinds)
    scores = flops[0] / (4 * 128)
    doubled = (flops[0] / (truth.peak("bf16") * fwd[0]) + scores * fwd[1] * 1e-12) * 2 \
        + scores * 128 / 8192 * fwd[2] / truth.memory_bandwidth + fwd[3] * 1e-6
    assert fallback[1] == pytest.approx(doubled, rel=1e-12) and fallback[0] == both[0]


def test_attention_fit_drops_a_term_that_would_be_negative():
    """Times with no per-row cost and 1% noise (seed 0) under which the unconstrained least squares puts
    that coefficient below zero: the term is dropped (exactly 0) and the other three refit, recovering the
    truth to a few times the noise (0.1 relative: the noise's 1% over 26 shapes, amplified by the
    near-collinearity of FLOPs and scores, which differ only through the head dimension)."""
    truth = _attention_profile([2.0, 0.2, 0.0, 20.0], [1.6, 0.3, 0.0, 50.0])
    samples = _attention_samples(truth)
    rng = np.random.default_rng(0)
    noisy = [dataclasses.replace(x, fwd_seconds=x.fwd_seconds * (1 + 0.01 * rng.standard_normal()))
             for x in samples]
    t = np.array([x.fwd_seconds for x in noisy])
    cols = np.array([[x.fwd_flops, x.batch * x.heads * x.seq ** 2, x.batch * x.heads * x.seq * x.head_dim, 1.0]
                     for x in noisy])
    unconstrained, *_ = np.linalg.lstsq(cols / t[:, None], np.ones_like(t), rcond=None)
    assert unconstrained[2] < 0  # the case under test
    flop_max, score_ps, row_bytes, fixed_us = cal.fit_attention_terms(noisy, "fwd", truth.peak("bf16"),
                                                                      truth.memory_bandwidth)
    assert row_bytes == 0.0
    assert flop_max == pytest.approx(2.0, rel=0.1) and score_ps == pytest.approx(0.2, rel=0.1)
    assert fixed_us == pytest.approx(20.0, rel=0.1)


def test_gemm_fit_is_robust_to_noise_and_reports_it():
    truth = _profile_with(0.80, 6.3e9, 0.8, 4e-6)
    rng = np.random.default_rng(0)
    sizes = np.array([128, 256, 512, 1024, 2048, 4096, 6144, 8192], dtype=float)
    flops, moved = 2 * sizes**3, 6 * sizes**2
    seconds = op_times(flops, moved, np.ones(len(sizes), dtype=bool), truth, "bf16") * np.exp(rng.normal(0, 0.03, 8))
    g, _, rms = cal.fit_gemm_curve(flops, moved, seconds, truth.peak("bf16"), truth.memory_bandwidth, 0.8, 4e-6)
    assert g == pytest.approx(0.80, abs=0.04)
    assert 0.005 < rms < 0.06


def test_memory_bound_is_the_median_of_the_large_kernels():
    samples = [cal.BandwidthSample("copy", 1e6, 1e-5),   # small: overhead-dominated, ignored
               cal.BandwidthSample("copy", 1e9, 1e9 / (4.8e12 * 0.80)),
               cal.BandwidthSample("add", 1.5e9, 1.5e9 / (4.8e12 * 0.84)),
               cal.BandwidthSample("cast", 1.2e9, 1.2e9 / (4.8e12 * 0.70))]
    assert cal.fit_memory_bound(samples, 4.8e12, 2e8) == pytest.approx(0.80)


def test_collective_fit_recovers_efficiency_and_latency():
    link = Link(bandwidth=450e9, latency=4e-6, efficiency=0.8)
    samples = []
    for n in (2, 8):
        for size in (1e6, 1e7, 1e8, 1e9):
            samples.append(cal.CollectiveSample("all_reduce", size, n, all_reduce_time(size, n, link)))
            samples.append(cal.CollectiveSample("all_gather", size, n, all_gather_time(size, n, link)))
            samples.append(cal.CollectiveSample("reduce_scatter", size, n, reduce_scatter_time(size, n, link)))
    eff, lat = cal.fit_collectives(samples, 450e9)
    assert eff == pytest.approx(0.8, rel=1e-6)
    assert lat == pytest.approx(4e-6, rel=1e-6)


def test_calibrate_end_to_end_on_cpu_writes_a_valid_profile():
    base = load_profile("h200")
    lines: list[str] = []
    text, meas, fit = cal.calibrate(torch.device("cpu"), base, TINY, say=lines.append)
    prof = profile_from_yaml(text)
    assert isinstance(prof.efficiency, Efficiency)
    assert prof.efficiency.memory_bound == pytest.approx(fit.memory_bound, rel=1e-3)
    assert prof.efficiency.gemm_max == pytest.approx(fit.gemm_max, rel=1e-3)
    assert prof.efficiency.kernel_overhead_s == pytest.approx(fit.kernel_overhead_s, rel=1e-3)
    assert prof.calibration["device"] == "cpu"
    assert prof.calibration["collectives"].startswith("not measured")
    assert len(meas.gemm) == 3 + 1 + 3 and {s.dtype for s in meas.gemm} == {"bf16", "fp16", "tf32", "fp32"}
    assert {s.op for s in meas.bandwidth} == {"copy", "add", "scale", "silu", "cast"}
    assert meas.attention and meas.attention[0].fwd_flops == 4 * 2 * 32 * 32 * 16
    # every kernel family the cost model distinguishes was measured, and its fraction written
    from cost_models.compute import MEMORY_CLASSES
    assert set(MEMORY_CLASSES) <= set(meas.kernel_classes)
    assert set(MEMORY_CLASSES) | {"broadcast_copy"} <= set(prof.calibration["memory_fraction"])
    assert meas.host_fwd_s > 0 and prof.calibration["host_us_per_op"] > 0
    assert prof.calibration["host_us_per_op_moe"] > 0 and prof.calibration["host_us_per_new_gemm_shape"] > 0
    assert 0 < prof.calibration["attention_fwd_max"] <= cal.CAUSAL_MAX_FRACTION  # causal FLOPs counted as full
    assert [(s.layout, s.flops) for s in meas.grouped_gemm] == [("fwd", 2 * 4 * 16 * 32 * 64),
                                                                ("wgrad", 2 * 4 * 16 * 32 * 64)]
    assert 0 < prof.calibration["gemm_grouped_max"] <= 1
    assert any(line.startswith("gemm 1/7") for line in lines) and any("collectives: skipped" in x for x in lines)
    again = cal.Measurements.from_dict(json.loads(json.dumps(meas.to_dict())))
    assert again == meas
    # the unchanged parts of the base profile survive
    assert prof.peak_flops == base.peak_flops and prof.memory_bytes == base.memory_bytes


def test_run_calibration_writes_profile_and_measurements(tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "detect_accelerator", lambda: torch.device("cpu"))
    monkeypatch.setattr(cal.CalibrationPlan, "quick", classmethod(lambda cls: TINY))
    out = tmp_path / "cal.yaml"
    prof = cal.run_calibration(base="h200", output=str(out), quick=True)
    assert validate_profile_file(out) == prof
    raw = json.loads((tmp_path / "cal.measurements.json").read_text())
    assert len(raw["gemm"]) == 7 and raw["device_name"] == "cpu"
    assert "Efficiencies fitted by `autoparallel calibrate` on cpu" in prof.notes
    # refit the saved measurements without measuring (no accelerator needed): the same profile
    monkeypatch.setattr(cal, "detect_accelerator", lambda: None)
    again = tmp_path / "refit.yaml"
    assert cli_main(["calibrate", "--from-measurements", str(tmp_path / "cal.measurements.json"), "--base", "h200",
                     "--output", str(again)]) == 0
    refit = validate_profile_file(again)
    assert refit.efficiency == prof.efficiency and refit.calibration["gemm_grouped_max"] == \
        prof.calibration["gemm_grouped_max"]


def test_refit_of_a_bad_measurements_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert cli_main(["calibrate", "--from-measurements", str(bad), "--base", "h200",
                     "--output", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a calibration measurements file" in err[0]
    assert cli_main(["calibrate", "--from-measurements", str(tmp_path / "missing.json"), "--base", "h200"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_no_accelerator_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(cal, "detect_accelerator", lambda: None)
    with pytest.raises(UserError, match="no accelerator found"):
        cal.run_calibration(output="never-written.yaml")
    assert cli_main(["calibrate", "--output", "never-written.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: calibrate: no accelerator found")


def test_undetectable_device_asks_for_base(monkeypatch):
    monkeypatch.setattr(cal, "detect_accelerator", lambda: torch.device("cpu"))
    with pytest.raises(UserError, match="pass --base"):
        cal.run_calibration(output="never-written.yaml")


def test_base_profile_matching():
    """torch's device names (nvidia-smi's) against the shipped profiles: the form factor a name states wins over
    the capacity (an H100 PCIe reports the same 81559 MiB as the SXM part, at 350 W and 2 TB/s)."""
    from hardware_profiles import match_device

    assert match_device("NVIDIA H200", 143771 * 2**20) == "h200"
    assert match_device("NVIDIA H100 80GB HBM3", 81559 * 2**20) == "h100-sxm"
    assert match_device("NVIDIA H100 PCIe", 81559 * 2**20) == "h100-pcie"
    assert match_device("NVIDIA A100-SXM4-40GB", 40 * 2**30) == "a100-sxm-40gb"
    assert match_device("NVIDIA A100-SXM4-80GB", 80 * 2**30) == "a100-sxm-80gb"
    assert match_device("Some Unknown Accelerator", 1) is None
