"""Context parallelism (plan field cp, ring attention) on CPU/gloo in fp32: cp2 x dp2 and cp2 x tp2 (+SP)
training equals a plain single-process loop (per-step losses within LOSS_RTOL, final parameters within
PARAM_ATOL, the tolerances derived in trainer_helpers), plus the plan checks and refusals.

Why the derived tolerances hold under cp too: a cp rank computes its tokens' attention as cp partial
softmaxes merged through their log-sum-exp (torch's _SDPAMerger, in fp32): with cp = 2 each output gets
at most one merge, out - sigmoid(lse_b - lse) * (out - out_b), a handful of roundings (<= 4 u relative),
and the tokens' gradients are summed over dp*cp ranks instead of dp: the same 128 token positions in
another order, which the depth-7 pairwise bound GRAD_NOISE already covers. The test can fail: with the
positions left unbalanced (rope rotated as if each rank held positions 0..S/cp-1) the cp2 x dp2 loss
left LOSS_RTOL at step 2 (1.4e-5 relative on this tiny model, where rope matters little).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.errors import UserError
from autoparallel.plan import Plan
from cost_models.compute import attention_terms

CP4 = [
    Config("llama-cp2xdp2", "tiny-llama", {"cp": 2, "dp": 2, "micro_batch": 2}),
    Config("llama-cp2xtp2-sp", "tiny-llama", {"cp": 2, "tp": 2, "sp": True, "micro_batch": 4}),
    Config("llama-cp2xtp2-zero3", "tiny-llama", {"cp": 2, "tp": 2, "zero": 3, "micro_batch": 2}),
    Config("gpt-cp2xdp2-zero3", "tiny-gpt", {"cp": 2, "dp": 2, "zero": 3, "micro_batch": 4}),
    Config("moe-cp2xep2", "tiny-moe", {"cp": 2, "ep": 2, "micro_batch": 2}),
    Config("llama-cp2xpp2", "tiny-llama", {"cp": 2, "pp": 2, "micro_batch": 2}),
    Config("gpt-cp2xpp2-interleaved", "tiny-gpt", {"cp": 2, "pp": 2, "vpp": 2, "micro_batch": 2}),
]


@functools.cache
def reference(model: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    return H.reference(model)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp4")
    H.run_spawned(4, CP4, out)
    return out


@pytest.mark.parametrize("cfg", CP4, ids=lambda c: c.name)
def test_cp_equals_one_process(cfg, world4):
    res = H.result(world4, cfg.name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    per_rank = [H.result_of_rank(world4, cfg.name, r)["losses"] for r in range(4)]
    assert all(losses == per_rank[0] for losses in per_rank), f"ranks disagree on the loss: {per_rank}"
    ref_losses, ref_params = reference(cfg.model)
    for step, (a, b) in enumerate(zip(res["losses"], ref_losses, strict=True)):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b), f"step {step}: loss {a} != single-process {b}"
    params = H.gathered_params(world4, cfg.name)
    assert set(params) == set(ref_params)
    for name, ref in ref_params.items():
        diff = (params[name] - ref).abs().max().item()
        assert diff <= H.PARAM_ATOL, f"{name}: max |param - single-process| = {diff:.2e}"


def _plan(**kw) -> Plan:
    base = dict(model="m", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=64)
    base.update(kw)
    return Plan(**base)


def test_plan_cp_field_validation_and_round_trip(tmp_path):
    p = _plan(dp=2, cp=2, tp=2)
    assert p.mesh_shape == {"pp": 1, "dp": 2, "cp": 2, "ep": 1, "tp": 2}
    assert (p.dense_dp, p.expert_dp, p.num_micro_batches) == (4, 4, 4)  # cp ranks share rows
    assert "cp=2 (intra)" in str(p) and "cp=" not in str(_plan(dp=8))
    p.save(tmp_path / "p.yaml")
    assert Plan.load(tmp_path / "p.yaml") == p
    with pytest.raises(UserError, match="does not equal gpus"):
        _plan(dp=4, cp=4).validate()
    with pytest.raises(UserError, match=r"seq_len 64 is not divisible by 2\*cp = 128"):
        _plan(gpus=64, dp=1, cp=64).validate()


def test_trainer_refuses_what_cp_cannot_run():
    from autoparallel.trainer.context_parallel import check_cp_model

    check_cp_model(H.build("tiny-llama"), False, 2)  # our models take positions
    with pytest.raises(UserError, match="accept `positions`"):
        check_cp_model(H.build("mha"), False, 2)
    with pytest.raises(UserError, match="Hugging Face"):
        check_cp_model(H.build("tiny-llama"), True, 2)


# ---- cost model and planner ------------------------------------------------------------------------
def test_ring_attention_time_overlaps_each_step():
    from cost_models.comm import Link, ring_attention_time, send_recv_time

    link = Link(bandwidth=1e9, latency=0.0, efficiency=1.0)   # 1 GB/s: a 1 MB chunk takes 1 ms
    t_kv = send_recv_time(1e6, link)
    assert ring_attention_time(8e-3, 1e6, 1, link) == 8e-3      # no ring
    # compute-bound: 4 steps of 2 ms, each hides its 1 ms exchange -> no exposed time
    assert ring_attention_time(8e-3, 1e6, 4, link) == pytest.approx(8e-3)
    # comm-bound: 4 steps of 0.1 ms; the first runs alone, the other 3 wait for their 1 ms exchange
    assert ring_attention_time(0.4e-3, 1e6, 4, link) == pytest.approx(0.1e-3 + 3 * t_kv)
    # backward's last gradient return is never hidden
    assert ring_attention_time(8e-3, 1e6, 4, link, tail_bytes=1e6) == pytest.approx(8e-3 + t_kv)


@pytest.fixture(scope="module")
def llama_ctx():
    from autoparallel.api import context

    return context("llama3-8b", "h100-sxm", 16, 32768)


def test_cost_model_splits_tokens_over_cp(llama_ctx):
    cm = llama_ctx.cost_model
    base = dict(model="llama3-8b", hardware="h100-sxm", gpus=16, gpus_per_node=8, global_batch=8, seq_len=32768,
                micro_batch=1, zero=3, recompute=("none",) * 32)
    dp = cm.estimate(Plan(dp=16, global_batch=16, **{k: v for k, v in base.items() if k != "global_batch"}))
    cp = cm.estimate(Plan(dp=8, cp=2, **base))
    # a cp2 rank holds half a sequence where a dp rank holds a whole one: half the per-token work, bytes and
    # activations and, load-balanced, half the sequence's causal attention, except the attention's per-query
    # cost, which the ring pays at each of its cp steps (each rank's S/cp queries against every K/V chunk: B H
    # S D query elements per sequence either way, compute.attention_times' row term); weight reads and the
    # per-op host floor do not halve either (0.3% of the compute here, so 1% bounds it)
    prof = llama_ctx.cost_model.profile
    heads, seq, head_dim, layers = 32, 32768, 128, 32
    rows = sum(heads * seq * head_dim * attention_terms(prof, phase)[2] for phase in ("fwd", "bwd")) * layers
    ring = rows / prof.memory_bandwidth
    assert cp.breakdown["compute_s"] == pytest.approx(dp.breakdown["compute_s"] / 2 + ring / 2, rel=0.01)
    assert cp.memory_breakdown_gib[0]["activations"] == pytest.approx(dp.memory_breakdown_gib[0]["activations"] / 2)
    assert cp.memory_breakdown_gib[0]["params"] == pytest.approx(dp.memory_breakdown_gib[0]["params"])  # dp*cp=16
    # the ring runs intra-node, hidden behind 8k-token attention steps
    assert 0 <= cp.breakdown["cp_comm_s"] < 0.01 * cp.step_time_s
    # across nodes at cp16 the 2k-token steps no longer hide the exchanges: the ring shows
    wide = Plan(dp=1, cp=16, **base)
    w = cm.estimate(replace(wide, gpus_per_node=1))
    assert w.breakdown["cp_comm_s"] > 0


def test_plan_reports_what_cp_bought(llama_ctx):
    """`plan`/`compare` say what cp bought against the same plan with its ranks as data parallelism
    (each holding whole sequences); a batch that cannot split over the wider dp reports nothing."""
    from autoparallel.report import choice_gains

    cm = llama_ctx.cost_model
    base = dict(model="llama3-8b", hardware="h100-sxm", gpus=16, gpus_per_node=8, seq_len=32768, micro_batch=1,
                zero=3, recompute=("none",) * 32)
    plan = Plan(dp=8, cp=2, global_batch=16, **base)
    est = cm.estimate(plan)
    as_dp = cm.estimate(Plan(dp=16, global_batch=16, **base))
    assert choice_gains(cm, plan, est)["cp"] == pytest.approx(est.step_time_s / as_dp.step_time_s - 1)
    odd = Plan(dp=8, cp=2, global_batch=8, **base)   # 8 sequences do not split over 16 dp ranks
    assert "cp" not in choice_gains(cm, odd, cm.estimate(odd))


def test_plan_says_when_cp_was_bought_to_fit(llama_ctx):
    """A choice that costs step time may be what makes the plan fit its budget: the report says so, with the peak
    of the plan without it (the gain alone read as a loss: Llama 4 Scout's text model on 64 H200s showed "cp: +4%
    step time" where the same plan without cp needs 160.6 of 132.8 GiB)."""
    from autoparallel.report import _gains_line, _undone, choice_gains, choices_to_fit

    cm = llama_ctx.cost_model
    base = dict(model="llama3-8b", hardware="h100-sxm", gpus=16, gpus_per_node=8, seq_len=32768, micro_batch=1,
                zero=3, recompute=("none",) * 32)
    plan = Plan(dp=8, cp=2, global_batch=16, **base)
    est, as_dp = cm.estimate(plan), cm.estimate(Plan(dp=16, global_batch=16, **base))
    assert est.peak_memory_gib < as_dp.peak_memory_gib
    between = (est.peak_memory_gib + as_dp.peak_memory_gib) / 2 * 2**30
    undone = _undone(cm, plan, between)
    to_fit = choices_to_fit(undone)
    assert to_fit == {"cp": pytest.approx(as_dp.peak_memory_gib)}
    line = _gains_line(choice_gains(cm, plan, cm.estimate(plan, between), undone), to_fit)
    assert f"and fitting ({as_dp.peak_memory_gib:.1f} GiB without it)" in line


def test_planner_searches_and_pins_cp(llama_ctx):
    from autoparallel.planner import Planner

    pl = Planner(llama_ctx.graph, llama_ctx.cluster, 8, 32768, fix={"cp": 2}, cost_model=llama_ctx.cost_model)
    assert {c.cp for c in pl.mesh_configs()} == {2}
    free = Planner(llama_ctx.graph, llama_ctx.cluster, 8, 32768, cost_model=llama_ctx.cost_model)
    assert {c.cp for c in free.mesh_configs()} == {1, 2, 4, 8}   # 32768 / cp >= MIN_CP_TOKENS (4096)
    with pytest.raises(UserError, match="not divisible by 2\\*cp"):
        Planner(llama_ctx.graph, llama_ctx.cluster, 8, 32770, fix={"cp": 4}, cost_model=llama_ctx.cost_model)


def test_cli_pins_and_shows_cp(capsys):
    from autoparallel.cli import main

    argv = ["llama3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--global-batch", "8", "--seq-len", "32768"]
    assert main(["plan", *argv, "--fix", "cp=2,tp=2,pp=1", "--top", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "cp=2 (inside node)" in out and "dp=4" in out
    assert main(["estimate", *argv, "--cp", "3"]) == 2      # 16 GPUs: one clear line, no traceback
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--cp 3" in err and "Traceback" not in err


def test_trainer_refuses_batches_cp_cannot_split():
    from autoparallel.trainer.batch import Batch
    from autoparallel.trainer.trainer import AutoParallelTrainer

    plan = _plan(dp=2, cp=2, tp=2, sequence_parallel=True, seq_len=24)
    tokens = torch.zeros(8, 24, dtype=torch.long)
    check = AutoParallelTrainer._check_cp_batch
    check(Batch(tokens[:, :16], tokens[:, :16]), plan)        # 16 = 4 chunks of 4; 8 tokens per rank / tp2
    with pytest.raises(UserError, match="attention_mask"):
        check(Batch(tokens, tokens, torch.ones_like(tokens)), plan)
    with pytest.raises(UserError, match=r"not divisible by 2\*cp = 4"):
        check(Batch(tokens[:, :18], tokens[:, :18]), plan)
    with pytest.raises(UserError, match="must divide tp=4"):  # 12 tokens: 6 per cp rank, not a multiple of 4
        check(Batch(tokens[:, :12], tokens[:, :12]), _plan(dp=1, cp=2, tp=4, sequence_parallel=True, seq_len=24))


def test_int8_reduction_over_cp_ranks_needs_zero():
    """cp ranks reduce dense gradients like dp ranks (dense_dp = dp * cp * ep): ZeRO-0's all-reduce has no
    int8 hook there either, so the plan is refused rather than silently reduced in fp32."""
    plan = Plan(model="m", hardware="h200", gpus=2, gpus_per_node=2, global_batch=1, seq_len=64, cp=2,
                grad_reduce_dtype="int8", zero=0)
    with pytest.raises(UserError, match="int8 needs zero >= 1"):
        plan.check_runnable()
    replace(plan, zero=1).check_runnable()
