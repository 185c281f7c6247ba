"""The sweep's loss matching (benchmarks/trainer_sweep.py `losses`, docs/loss_matching.md): the
comparison logic on synthetic records, the step-1 bound's formula, the null's estimator and its
false-alarm probability on synthetic null draws, the power to fail a plan that breaks the arithmetic,
the CPU-noise fallback, and the premise on CPU: two plans from the shared init give the same first loss
within the step-1 bound."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as ts  # noqa: E402

LLAMA = ts.MODELS["llama-1.3b"]
TOKENS = 16 * 2048
CONFIGS = [
    ts._c("1g-ref", "llama-1.3b", 1, 16, fix={"compile": 0}),
    ts._c("1g-compiled", "llama-1.3b", 1, 16, fix={"compile": 1}),  # never a reference: compiled
    ts._c("2g-a", "llama-1.3b", 2, 16, fix={"dp": 2}),
    ts._c("2g-b", "llama-1.3b", 2, 16, fix={"tp": 2}),
    ts._c("2g-c", "llama-1.3b", 2, 16, fix={"pp": 2}),
    ts._c("2g-other-batch", "llama-1.3b", 2, 8, fix={"dp": 2}),   # no one-GPU run at 8 rows here
]
RAW = ROOT / "benchmarks" / "results" / "raw"
REF = [10.78, 10.77, 10.70, 10.60, 10.50, 10.40, 10.30, 10.20, 10.10]


def _rec(name: str, losses: list[float], init: str = "seed0", **kw: object) -> dict:
    return {"name": name, "gpus": 2, "init": init, "losses": losses, **kw}


def _scaled(rel: list[float]) -> list[float]:
    return [r * (1 + d) for r, d in zip(REF, rel, strict=False)]


def _by_name(matches: list[ts.LossMatch]) -> dict[str, ts.LossMatch]:
    return {m.name: m for m in matches}


def test_step1_bound_is_the_derived_formula() -> None:
    # by hand: sigma = 0.02 sqrt(2048), eps = 2 u sqrt(1 + 2 * 26), B = 2 eps sqrt(2 ln V) sigma,
    # Hoeffding factor sqrt(2 ln(2e6) / N), L0 = ln V + sigma^2 / 2
    sigma = 0.02 * math.sqrt(2048)
    eps = 2 * 2**-8 * math.sqrt(53)
    bound = 2 * eps * math.sqrt(2 * math.log(32000)) * sigma * math.sqrt(2 * math.log(2e6) / TOKENS)
    assert ts.step1_rtol(LLAMA, TOKENS) == pytest.approx(bound / (math.log(32000) + sigma**2 / 2), rel=1e-12)
    # L0 is the loss every earlier run measured at step 1 (10.78 for the 1.3B llama, to 0.1%)
    assert math.log(32000) + sigma**2 / 2 == pytest.approx(10.78, rel=1e-3)
    # more tokens average more rounding errors: the bound shrinks as 1 / sqrt(N)
    assert ts.step1_rtol(LLAMA, 4 * TOKENS) == pytest.approx(ts.step1_rtol(LLAMA, TOKENS) / 2, rel=1e-12)


def test_fallback_tolerance_grows_by_the_per_step_term() -> None:
    tols = [ts.loss_rtol(LLAMA, TOKENS, k) for k in range(1, 10)]
    assert tols[0] == ts.step1_rtol(LLAMA, TOKENS)
    assert all(b - a == pytest.approx(ts.LOSS_GROWTH_PER_STEP) for a, b in zip(tols, tols[1:], strict=False))
    assert ts.LOSS_GROWTH_PER_STEP == ts.SCALE_MARGIN * ts.NOISE_GROWTH_CPU


def test_noise_growth_constant_covers_the_committed_experiment() -> None:
    import json
    noise = json.loads(ts.NOISE_RESULTS.read_text())
    growth, _, _ = ts.noise_growth(noise["runs"]["bf16"])
    assert 0 < growth <= ts.NOISE_GROWTH_CPU < 1.1 * growth  # rounded up, not padded


def test_reference_is_the_eager_one_gpu_run_of_the_same_model_and_batch() -> None:
    assert ts.reference_of(CONFIGS[2], CONFIGS).name == "1g-ref"
    assert ts.reference_of(CONFIGS[5], CONFIGS) is None
    # the sweep's own: every two-GPU configuration has one, the 7B's at its 8 x 4096 (full recompute)
    refs = {c.name: ts.reference_of(c, ts.CONFIGS) for c in ts.CONFIGS if c.gpus == 2}
    assert {r.name for r in refs.values() if r is not None} == {"1g-llama-b16", "1g-gpt-b16", "1g-moe-b16",
                                                                "1g-llama7b-b8"}
    assert [n for n, r in refs.items() if r is None] == []
    assert {refs[c.name].name for c in ts.CONFIGS if c.model == "llama-7b" and c.gpus == 2} == {"1g-llama7b-b8"}


def test_pass_fail_per_step() -> None:
    tol = [ts.loss_rtol(LLAMA, TOKENS, k) for k in range(1, 10)]
    inside = [0.5 * t for t in tol]
    # step 1 is outside its bound though later steps would allow it: the per-step tolerance applies
    early = [1.2 * tol[0]] + inside[1:]
    late = inside[:8] + [1.5 * tol[8]]
    records = {"1g-ref": _rec("1g-ref", REF), "2g-a": _rec("2g-a", _scaled(inside)),
               "2g-b": _rec("2g-b", _scaled(early)), "2g-c": _rec("2g-c", _scaled([-d for d in late]))}
    report = ts.judge_losses(records, CONFIGS)
    m = _by_name(report.matches)
    # no null run (1g-compiled) in the records: the model falls back to the CPU-noise rule, and says so
    assert not report.nulls["llama-1.3b"].fitted and report.comparisons == 0
    assert report.nulls["llama-1.3b"].problem == "no null runs in the raw files"
    assert {m[n].rule for n in ("2g-a", "2g-b", "2g-c")} == {"CPU-noise fallback"}
    assert m["2g-a"].status == "pass" and m["2g-a"].worst_ratio == pytest.approx(0.5)
    assert m["2g-a"].max_rel_diff == pytest.approx(inside[-1])
    assert m["2g-b"].status == "fail" and m["2g-b"].worst_ratio == pytest.approx(1.2)
    assert m["2g-c"].status == "fail" and m["2g-c"].worst_ratio == pytest.approx(1.5)  # |.|: below fails too
    assert m["2g-other-batch"].status == "no reference"
    assert "1g-compiled" not in m  # one-GPU runs are references, not compared


def test_records_that_cannot_be_compared() -> None:
    records = {"1g-ref": _rec("1g-ref", REF), "2g-a": _rec("2g-a", REF, init="per-run"),
               "2g-b": {"name": "2g-b", "gpus": 2, "error": "OOM"}}
    old = {k: v for k, v in _rec("2g-c", REF).items() if k != "init"}  # before the shared init: no key
    m = _by_name(ts.match_losses({**records, "2g-c": old}, CONFIGS))
    assert (m["2g-a"].status, m["2g-b"].status, m["2g-c"].status) == ("per-run init", "error", "per-run init")
    m = _by_name(ts.match_losses({"2g-a": _rec("2g-a", REF)}, CONFIGS))
    assert m["2g-a"].status == "reference: not measured" and not m["2g-a"].rel_diffs
    m = _by_name(ts.match_losses({"1g-ref": _rec("1g-ref", REF, init="seed1"), "2g-a": _rec("2g-a", REF)},
                                 CONFIGS))
    assert m["2g-a"].status == "init differs"


def test_nan_loss_fails_and_length_mismatch_is_noted() -> None:
    nan = REF[:4] + [float("nan")] + REF[5:]
    records = {"1g-ref": _rec("1g-ref", REF), "2g-a": _rec("2g-a", nan), "2g-b": _rec("2g-b", REF[:7])}
    m = _by_name(ts.match_losses(records, CONFIGS))
    assert m["2g-a"].status == "fail"
    assert m["2g-b"].status == "pass" and len(m["2g-b"].rel_diffs) == 7 and "common 7" in m["2g-b"].note


def test_doc_states_command_results_and_derivation() -> None:
    tol = [ts.loss_rtol(LLAMA, TOKENS, k) for k in range(1, 10)]
    records = {"1g-ref": _rec("1g-ref", REF), "2g-a": _rec("2g-a", _scaled([0.5 * t for t in tol])),
               "2g-b": _rec("2g-b", _scaled([2 * t for t in tol]))}
    doc = ts.loss_doc(ts.judge_losses(records, CONFIGS), "python benchmarks/trainer_sweep.py losses --raw x",
                      None)
    lines = doc.splitlines()
    assert lines[2].startswith("Command: `python benchmarks/trainer_sweep.py losses --raw x`")
    assert "1 of 2 compared two-GPU configurations within the tolerance" in doc
    assert "by the CPU-noise fallback for llama-1.3b (no null runs)" in doc
    row = next(line for line in lines if line.startswith("| 2g-b | 1g-ref |"))
    assert row.endswith("| 2.00 | fail; later steps by the CPU-noise fallback (no null) |")
    assert "**llama-1.3b** (reference 1g-ref): no null runs in the raw files" in doc
    assert "| llama-1.3b | 2048 | 32000 | 26 | 0.057 | 1.3e-03 | CPU-noise fallback: no null runs" in doc
    assert "## The tolerance" in doc and "Hoeffding" in doc
    assert f"{ts.step1_rtol(LLAMA, TOKENS):.1e}" in doc


def test_shared_init_is_one_host_model_per_process(monkeypatch) -> None:
    assert ts.init_label("llama-1.3b") == "seed0" and ts.init_label("llama-7b") == "seed0"
    monkeypatch.setattr(ts, "PER_RUN_INIT", {"llama-7b"})  # how the 7B's earlier records were labelled
    assert ts.init_label("llama-7b") == "per-run"
    ts.MODELS["tiny-llama-test"] = ts.noise_model_spec()
    try:
        cache: dict = {}
        a = ts._shared_init_model("tiny-llama-test", cache)
        assert ts._shared_init_model("tiny-llama-test", cache) is a
        assert all(p.device.type == "cpu" for p in a.parameters())
        # the same numbers as an independent draw: per-parameter generators seeded by (seed, name)
        b = ts._shared_init_model("tiny-llama-test", {})
        assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters(), strict=True))
    finally:
        del ts.MODELS["tiny-llama-test"]


def test_premise_two_plans_from_the_shared_init_match_at_step_one() -> None:
    """dp2 and tp2 (2 gloo processes, FSDP2 bf16 as on the GPUs) from init_weights(seed=0): the first
    losses agree within the step-1 bound."""
    runs = {"ref": (2, {"dp": 2, "zero": 2, "micro_batch": 4}), "tp2": (2, {"tp": 2, "micro_batch": 8})}
    losses = ts.noise_losses(runs, steps=1)
    bound = ts.step1_rtol(ts.noise_model_spec(), ts.NOISE_ROWS * ts.NOISE_SEQ)
    assert ts.rel_diffs(losses["tp2"], losses["ref"])[0] <= bound
    assert abs(losses["ref"][0] - 6.29) < 0.01  # L0 = ln V + sigma^2 / 2 of the tiny llama


# ---------------------------------------------------------------------------- the null at scale
NULL_STEPS = list(range(2, 10))     # the fit's steps (9 measured, step 1 has its own bound)
# llama-like nulls, log s_k = log s0 + b x_k: 1e-5 at the covariate's zero, about 1e-2 by step 9
TRUE = {"power": (1e-5, 3.2), "exponential": (1e-5, math.log(2.5))}


def _sd(k: np.ndarray | int, law: str | None = None) -> np.ndarray:
    log_s0, b = TRUE[law or ts.NULL_LAW]
    return np.exp(math.log(log_s0) + b * ts.null_covariate(k, law))


def _null_draws(rng: np.random.Generator, rows: int, runs: int, law: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(covariates, |e|) of `rows` independent nulls of `runs` runs each under the model and TRUE[law]."""
    steps = np.array(NULL_STEPS * runs)
    return ts.null_covariate(steps, law), _sd(steps, law) * np.abs(rng.standard_normal((rows, steps.size)))


def _null_records(rng: np.random.Generator, names: list[str]) -> dict[str, dict]:
    """One-GPU null records around REF: relative differences drawn from the model, random signs."""
    out = {}
    for name in names:
        e = [0.0] + [float(_sd(k)) * rng.standard_normal() for k in NULL_STEPS]
        out[name] = {**_rec(name, _scaled(e)), "gpus": 1}
    return out


def test_null_law_is_the_power_law_the_data_pick() -> None:
    """NULL_LAW is "power" because the committed two-GPU llama plans, each 4 of them as the null and the other
    12 judged, fail in about FALSE_ALARM of the subsets under it, and in far more under the exponential."""
    assert ts.NULL_LAW == "power"
    recs = ts._measured([str(RAW / "loss_single.jsonl"), str(RAW / "loss_dist.jsonl")])
    ref = recs["1g-llama-b16"]["losses"]
    diffs = {n: ts.rel_diffs(r["losses"], ref) for n, r in recs.items() if n.startswith("2g-llama-")}
    floor = ts.step1_rtol(LLAMA, TOKENS)
    subsets, power = ts.subset_check(diffs, 4, floor, "power")
    _, exponential = ts.subset_check(diffs, 4, floor, "exponential")
    assert subsets == 1820 and power <= ts.FALSE_ALARM * subsets < exponential


def test_null_runs_are_the_one_gpu_equals_of_each_reference() -> None:
    cfgs = {c.name: c for c in ts.CONFIGS}
    got = {ref: [c.name for c in ts.null_runs_of(cfgs[ref], ts.CONFIGS)]
           for ref in ("1g-llama-b16", "1g-gpt-b16", "1g-moe-b16")}
    # the planner's H100 picks (-h100auto) are one-GPU runs of the same model and batch too
    assert got == {"1g-llama-b16": ["1g-llama-b16-mb8x2", "1g-llama-b16-mb4x4", "1g-llama-b16-full",
                                    "1g-llama-b16-compiled", "1g-llama-b16-h100auto"],
                   "1g-gpt-b16": ["1g-gpt-b16-mb8x2", "1g-gpt-b16-compiled", "1g-gpt-b16-h100auto"],
                   "1g-moe-b16": ["1g-moe-b16-mb8x2", "1g-moe-b16-compiled", "1g-moe-b16-h100auto"]}
    # the compiled one-GPU run of the test configurations is a null run, never the reference
    assert [c.name for c in ts.null_runs_of(CONFIGS[0], CONFIGS)] == ["1g-compiled"]


def test_erfc_is_the_standard_function() -> None:
    x = np.linspace(-3, 8, 221)
    # Numerical Recipes' bound on the fit's fractional error: 1.2e-7
    assert np.allclose(ts.erfc(x), [math.erfc(v) for v in x], rtol=1.2e-7, atol=0)


@pytest.mark.parametrize("law", ["power", "exponential"])
def test_estimator_recovers_a_known_growth_and_scale(law: str) -> None:
    """500 runs x 8 steps under the model. Fisher information of log s per draw of N(0, s^2) is 2, so the
    MLE's standard errors are 1 / sqrt(2 Sxx) for b and 1 / sqrt(2 n) for log s at the mean covariate;
    4 standard errors: a seeded draw outside them would have probability below 1e-4."""
    x, d = _null_draws(np.random.default_rng(3), 1, 500, law)
    log_s0, b = ts.halfnormal_fit(x, d[0])
    true_s0, true_b = TRUE[law]
    sxx = float(((x - x.mean()) ** 2).sum())
    assert abs(float(b) - true_b) <= 4 / math.sqrt(2 * sxx)
    centre = float(log_s0 + b * x.mean())
    assert abs(centre - (math.log(true_s0) + true_b * x.mean())) <= 4 / math.sqrt(2 * x.size)
    # zero draws (losses equal at fp32 resolution) weigh nothing: the fit stays finite and close
    d0 = d[0].copy()
    d0[::50] = 0.0
    log_s0z, bz = ts.halfnormal_fit(x, d0)
    assert math.isfinite(float(log_s0z)) and abs(float(bz) - true_b) <= 4 / math.sqrt(2 * sxx)


@pytest.mark.parametrize("law", ["power", "exponential"])
def test_false_alarm_rate_per_comparison_is_the_stated_one(law: str) -> None:
    """The pivot's quantile on 20000 independent synthetic nulls (4 runs x 8 steps, like the llama's) and
    a fresh null draw per step: at alpha = 0.02 a false fail occurs at most alpha N + 4 binomial standard
    deviations times per step (expected 400, bound 479). The bound has power: ignoring the fit's sampling
    error (the normal quantile on the fitted sd) fails more than that at every step."""
    alpha, n = 0.02, 20000
    qs = ts.pivot_quantiles(NULL_STEPS * 4, NULL_STEPS, alpha, law=law)
    rng = np.random.default_rng(1)  # not the Monte Carlo's seed: independent of the quantile's own draws
    x, d = _null_draws(rng, n, 4, law)
    log_s0, b = ts.halfnormal_fit(x, d)
    bound = alpha * n + 4 * math.sqrt(alpha * (1 - alpha) * n)
    z = 2.3263  # the normal's two-sided 0.02 quantile
    for k in NULL_STEPS:
        new = _sd(k, law) * np.abs(rng.standard_normal(n))
        fitted = np.exp(log_s0 + b * ts.null_covariate(k, law))
        assert (new > qs[k][0] * fitted).sum() <= bound
        assert (new > z * fitted).sum() > bound
        assert qs[k][1] * ts.NULL_MC_SE < 0.1 * alpha  # the Monte Carlo's margin is small against alpha


def test_sweep_false_alarm_probability_is_at_most_the_stated_one() -> None:
    """FALSE_ALARM over a whole sweep: 16 rounding-only plans x 8 later steps judged against one null fit
    per sweep, 4000 sweeps; the fraction with any failure is at most FALSE_ALARM + 4 binomial standard
    deviations (Bonferroni makes it lower still)."""
    plans, n = 16, 4000
    qs = ts.pivot_quantiles(NULL_STEPS * 4, NULL_STEPS, ts.FALSE_ALARM / (plans * len(NULL_STEPS)))
    rng = np.random.default_rng(2)
    x, d = _null_draws(rng, n, 4)
    log_s0, b = ts.halfnormal_fit(x, d)
    ks = np.array(NULL_STEPS)
    tol = np.array([qs[k][0] for k in NULL_STEPS]) * np.exp(log_s0[:, None] + b[:, None] * ts.null_covariate(ks))
    new = _sd(ks) * np.abs(rng.standard_normal((n, plans, ks.size)))
    failed = (new > tol[:, None, :]).any(axis=(1, 2)).sum()
    assert failed <= ts.FALSE_ALARM * n + 4 * math.sqrt(ts.FALSE_ALARM * (1 - ts.FALSE_ALARM) * n)


NULL_CONFIGS = CONFIGS + [ts._c(f"1g-eq{i}", "llama-1.3b", 1, 16, fix={"micro_batch": 2**i, "compile": 0})
                          for i in range(3)]


def test_judge_uses_the_null_band_and_fails_a_broken_plan() -> None:
    """Null records drawn from the model; a plan drawn from it passes, a plan whose loss is 1% off (a
    missing gradient reduction moves it by far more) fails, and a difference only at a late step, far
    outside the null, fails too."""
    rng = np.random.default_rng(4)
    records = {"1g-ref": _rec("1g-ref", REF), **_null_records(rng, ["1g-compiled", "1g-eq0", "1g-eq1", "1g-eq2"])}
    like = [0.0] + [float(_sd(k)) * rng.standard_normal() for k in NULL_STEPS]
    late = [0.0] * 8 + [0.3]
    records |= {"2g-a": _rec("2g-a", _scaled(like)), "2g-b": _rec("2g-b", _scaled([0.01] * 9)),
                "2g-c": _rec("2g-c", _scaled(late))}
    report = ts.judge_losses(records, NULL_CONFIGS)
    null = report.nulls["llama-1.3b"]
    assert null.fitted and len(null.runs) == 4 and len(null.draws) == 32
    assert report.comparisons == 3 * 8 and null.alpha == pytest.approx(ts.FALSE_ALARM / 24)
    m = _by_name(report.matches)
    floor = ts.step1_rtol(LLAMA, TOKENS)
    assert m["2g-a"].tolerances[0] == floor
    for k in NULL_STEPS:
        assert m["2g-a"].tolerances[k - 1] == max(floor, null.quantiles[k] * null.sd(k))
    assert m["2g-a"].status == "pass" and m["2g-a"].rule == "null"
    assert m["2g-b"].status == "fail" and m["2g-c"].status == "fail"


def test_null_runs_that_are_no_draws() -> None:
    rng = np.random.default_rng(5)
    records = {"1g-ref": _rec("1g-ref", REF), **_null_records(rng, ["1g-compiled"]),
               "1g-eq0": {**_rec("1g-eq0", REF), "gpus": 1},                       # the reference's arithmetic
               "1g-eq2": {**_rec("1g-eq2", REF[:4] + [float("nan")] + REF[5:]), "gpus": 1},
               "2g-a": _rec("2g-a", REF)}
    records["1g-eq1"] = {**records["1g-compiled"], "name": "1g-eq1"}             # another run's arithmetic
    null = ts.judge_losses(records, NULL_CONFIGS).nulls["llama-1.3b"]
    assert list(null.runs) == ["1g-compiled"]
    assert null.excluded == {"1g-eq0": "losses identical to the reference",
                             "1g-eq1": "losses identical to 1g-compiled", "1g-eq2": "non-finite loss"}
    # a null whose only nonzero differences sit at one step has no growth to fit: the fallback judges
    one = {"1g-ref": _rec("1g-ref", REF), "1g-compiled": {**_rec("1g-compiled", _scaled([0] * 4 + [1e-4] + [0] * 4)),
                                                         "gpus": 1}, "2g-a": _rec("2g-a", REF)}
    report = ts.judge_losses(one, NULL_CONFIGS)
    assert "fewer than two steps" in report.nulls["llama-1.3b"].problem
    assert _by_name(report.matches)["2g-a"].rule == "CPU-noise fallback"


def test_committed_records_without_null_fall_back_to_the_cpu_rule() -> None:
    """The committed raw files hold no null runs yet: every model falls back, and the results are what
    the data fix: the GPT and MoE plans and 2g-llama-op pass, the other fifteen llama plans fail."""
    report = ts.judge_losses(ts._measured([str(RAW / "loss_single.jsonl"), str(RAW / "loss_dist.jsonl")]))
    assert all(not n.fitted for n in report.nulls.values()) and report.comparisons == 0
    passed = {m.name for m in report.matches if m.status == "pass"}
    failed = {m.name for m in report.matches if m.status == "fail"}
    assert passed == {"2g-llama-op", "2g-gpt-auto", "2g-gpt-tp2sp", "2g-gpt-dp2-eager", "2g-moe-ep2",
                      "2g-moe-dp2", "2g-moe-ep2-mb4x2"}
    assert len(failed) == 15 and all(n.startswith("2g-llama-") for n in failed)


def test_a_different_init_fails_even_a_null_as_wide_as_the_plans_spread() -> None:
    """The earlier sweep's two-GPU llama records (each from its own per-run init), compared as if they
    shared the committed reference's init, against a null made of the sixteen committed seed0 two-GPU
    llama plans (if rounding-only, draws of the null; wider than any one-GPU null should be). Eleven of
    twelve fail, fixed by these data; the twelfth (tp2sp) stays within 0.9 of the band: a different init
    is a larger difference than rounding at steps 2-5 for most runs, not for all, against a null this wide."""
    new = ts._measured([str(RAW / "loss_single.jsonl"), str(RAW / "loss_dist.jsonl")])
    old = ts._measured([str(RAW / "trainer_sweep_dist_final.jsonl")])
    stand_in = [n for n, r in new.items() if n.startswith("2g-llama-") and r.get("init") == "seed0"]
    olds = [n for n in old if n.startswith("2g-llama-")]
    assert len(stand_in) == 16 and len(olds) == 12
    configs = [ts._c("1g-llama-b16", "llama-1.3b", 1, 16, fix={"compile": 0})]
    configs += [ts._c(f"null-{n}", "llama-1.3b", 1, 16, fix={"compile": 0}) for n in stand_in]
    configs += [ts._c(f"old-{n}", "llama-1.3b", 2, 16) for n in olds]
    records = {"1g-llama-b16": new["1g-llama-b16"]}
    records |= {f"null-{n}": {**new[n], "gpus": 1} for n in stand_in}
    records |= {f"old-{n}": {**old[n], "init": "seed0"} for n in olds}
    report = ts.judge_losses(records, configs)
    assert report.nulls["llama-1.3b"].fitted and len(report.nulls["llama-1.3b"].runs) == 16
    m = _by_name(report.matches)
    assert [n for n, x in m.items() if x.status == "pass"] == ["old-2g-llama-tp2sp"]
    assert sorted(x.worst_ratio for x in m.values())[1] > 1.5  # the others fail clearly


def test_doc_reports_the_null_and_the_honest_comparison() -> None:
    rng = np.random.default_rng(4)
    records = {"1g-ref": _rec("1g-ref", REF), **_null_records(rng, ["1g-compiled", "1g-eq0"]),
               "2g-a": _rec("2g-a", _scaled([0.0] + [1e-5] * 8))}
    report = ts.judge_losses(records, NULL_CONFIGS)
    doc = ts.loss_doc(report, "cmd", None)
    null = report.nulls["llama-1.3b"]
    assert "later steps judged by the null measured at scale for llama-1.3b." in doc
    assert f"**llama-1.3b** (reference 1g-ref): 2 runs, 16 draws at steps 2-9; fitted s_k = {null.formula}" in doc
    assert any(line.startswith("| 1g-compiled | ") for line in doc.splitlines())
    assert "| *q_k* | - | " in doc
    nw = max(max(ds[1:]) for ds in null.runs.values())
    assert "Worst two-GPU difference 1.0e-05 (2g-a, step " in doc and f"against the null's worst {nw:.1e}" in doc
    assert f"M = {report.comparisons} later-step comparisons" in doc and "null (2 runs)" in doc
