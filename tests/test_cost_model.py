"""Cost model: published formulas (ZeRO, Korthikanti activations, alpha-beta collectives, pipeline
bubble), plan validation, and every shipped hardware profile."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from autoparallel.api import context, estimate_plan
from autoparallel.errors import UserError
from autoparallel.placements import megatron_placements
from autoparallel.plan import Plan
from autoparallel.specs import load_model_spec
from cost_models.comm import (
    Link,
    all_gather_time,
    all_reduce_time,
    link_for,
    reduce_scatter_time,
    send_recv_time,
)
from cost_models.compute import CLASS_CODE, classify, host_floor, op_times, stretch_to
from cost_models.estimate import model_state_bytes
from hardware_profiles import list_profiles, load_profile


def test_zero_paper_model_states():
    """Rajbhandari et al.: psi = 7.5B, N_d = 64, 2+2+12 bytes: 120 -> 31.4 -> 16.6 -> 1.9 GB."""
    expected = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for zero, gb in expected.items():
        total = sum(model_state_bytes(7.5e9, zero, 64, param_bytes=2, grad_bytes=2)) / 1e9
        assert total == pytest.approx(gb, rel=0.02), zero


def test_roofline_formula():
    h100 = load_profile("h100-sxm")
    eff = h100.efficiency
    flops = np.array([1e12, 0.0])
    moved = np.array([1e6, 3.35e9])
    t = op_times(flops, moved, np.array([True, False]), h100, "bf16")
    e = eff.gemm_max * 1e12 / (1e12 + eff.gemm_half_flops)
    assert t[0] == pytest.approx(1e12 / (h100.peak("bf16") * e) + eff.kernel_overhead_s)
    assert t[1] == pytest.approx(3.35e9 / (h100.memory_bandwidth * eff.memory_bound) + eff.kernel_overhead_s)


def test_grouped_gemm_class_and_host_floor_of_expert_gemms():
    h200 = load_profile("h200")
    grouped = classify("aten._grouped_mm.default", [[4096, 2816]], 2.0 * 4096 * 2816 * 1024)
    assert grouped == CLASS_CODE["gemm_grouped"] and classify("aten.mm.default", [[64, 64]], 2.0 * 64**3) == 1
    # 128 groups: the curve at one group's FLOPs, t = (F + G F_half) / (P max)
    flops, moved, mm = np.array([1e11]), np.array([1e8]), np.array([True])
    t = op_times(flops, moved, mm, h200, "bf16", np.array([grouped], dtype=np.int8), groups=np.array([128.0]))
    g_max, g_half = h200.calibration["gemm_grouped_max"], h200.calibration["gemm_grouped_half_flops"]
    assert t[0] == pytest.approx((1e11 + 128 * g_half) / (h200.peak("bf16") * g_max) + h200.efficiency.kernel_overhead_s)
    one = op_times(flops, moved, mm, h200, "bf16", np.array([grouped], dtype=np.int8), groups=np.array([1.0]))
    assert one[0] < t[0]  # the same FLOPs in one group run faster than in 128 small ones
    # a phase of 10 tiny expert ops: the host sets the pace at that phase's calibrated rate; a per-expert
    # loop's data-dependent GEMMs (2 of them) pay the new-shape cost on top, grouped GEMMs do not
    cal = h200.calibration
    fwd_us, bwd_us = cal["host_us_per_op_moe_fwd_bwd"]
    times, expert = np.full(10, 1e-7), np.ones(10, dtype=bool)
    dynamic = np.zeros(10, dtype=bool)
    assert stretch_to(times, host_floor(len(times), h200, "fwd", expert, dynamic)).sum() == pytest.approx(10 * fwd_us * 1e-6)
    assert stretch_to(times, host_floor(len(times), h200, "bwd", expert, dynamic)).sum() == pytest.approx(10 * bwd_us * 1e-6)
    dense_fwd = cal["host_us_per_op_fwd_bwd"][0]
    assert stretch_to(times, host_floor(len(times), h200, "fwd")).sum() == pytest.approx(10 * dense_fwd * 1e-6)
    dynamic[:2] = True
    extra = 2 * (cal["host_us_per_new_gemm_shape"] - fwd_us) * 1e-6
    assert stretch_to(times, host_floor(len(times), h200, "fwd", expert, dynamic)).sum() == pytest.approx(10 * fwd_us * 1e-6 + extra)
    # device-bound phases keep their times; an uncalibrated profile has no floor
    slow = np.full(10, 1.0)
    assert np.array_equal(stretch_to(slow, host_floor(len(slow), h200, "bwd", expert, dynamic)), slow)
    assert np.array_equal(stretch_to(times, host_floor(len(times), load_profile("mi300x"), "fwd")), times)


def test_alpha_beta_collectives():
    link = Link(bandwidth=100e9, latency=5e-6, efficiency=0.8)
    assert all_reduce_time(1e9, 8, link) == pytest.approx(2 * 7 / 8 * 1e9 / 80e9 + 14 * 5e-6)
    assert all_gather_time(1e9, 8, link) == pytest.approx(7 / 8 * 1e9 / 80e9 + 7 * 5e-6)
    assert send_recv_time(1e9, link) == pytest.approx(1e9 / 80e9 + 5e-6)
    assert all_reduce_time(1e9, 1, link) == 0.0


def test_a_ring_across_nodes_uses_the_nics_of_its_ranks_on_each_node():
    """link_for('inter', g): g rings at once, one leaving through each rank's NIC, so g NICs' bandwidth
    per rank up to the node's link; one rank per node keeps its own NIC. The data-parallel sync of dp64 on
    8-GPU nodes then moves its bytes 8x as fast as that of dp8 with tp8 (one rank per node)."""
    prof = load_profile("h100-sxm")
    nic = prof.inter_bandwidth * prof.efficiency.collective_inter
    node = prof.intra_bandwidth * prof.efficiency.collective_intra
    assert link_for(prof, "inter").effective_bandwidth == pytest.approx(nic)
    assert link_for(prof, "inter", 4).effective_bandwidth == pytest.approx(min(4 * nic, node))
    assert link_for(prof, "inter", 8).effective_bandwidth == pytest.approx(min(8 * nic, node))
    assert link_for(prof, "intra", 8).effective_bandwidth == pytest.approx(node)
    ctx = context("tiny-llama", "h100-sxm", 64, 128)
    wide = Plan(model="tiny-llama", hardware="h100-sxm", gpus=64, gpus_per_node=8, global_batch=64, seq_len=128, dp=64)
    dense, _ = ctx.cost_model.data_parallel_links(wide)
    assert dense.effective_bandwidth == pytest.approx(min(8 * nic, node))
    dense, _ = ctx.cost_model.data_parallel_links(replace(wide, dp=8, tp=8))
    assert dense.effective_bandwidth == pytest.approx(nic)


def test_a_host_paced_phase_absorbs_its_collectives():
    """The trainer runs a phase's TP collectives in line with its kernels, so a phase takes max(host,
    kernels + collectives), not max(host, kernels) + collectives: for any collective time c the stretched
    kernels plus c come to max(host floor, unstretched kernels + c). The unstretched kernels are those of a
    call whose c exceeds the floor (nothing left to stretch)."""
    ctx = context("tiny-llama", "h200", 2, 128)
    cm = ctx.cost_model
    plan = Plan(model="tiny-llama", hardware="h200", gpus=2, gpus_per_node=2, global_batch=4, seq_len=128, tp=2,
                micro_batch=4, placements=megatron_placements(ctx.graph, 2))
    seg = cm.segments(cm.placements_for(plan), False)[cm.block_rep(0)]
    from cost_models.estimate import HostWork
    host = HostWork(per_op_s=cm.host.dtensor_op_s, extra_s=4 * cm.host.tp_collective_s)
    floor = cm._phase_times(seg.fwd, "fwd", 2, 1, False, 4.0, False, host)[3]
    assert floor > 0
    raw = float(cm._phase_times(seg.fwd, "fwd", 2, 1, False, 4.0, False, host, comm_s=2 * floor)[0].sum())
    assert raw < floor  # host-paced without collectives, kernel-paced with the largest c below
    for c in (0.0, 0.25 * floor, 0.5 * floor, floor):
        t = cm._phase_times(seg.fwd, "fwd", 2, 1, False, 4.0, False, host, comm_s=c)[0]
        assert float(t.sum()) + c == pytest.approx(max(floor, raw + c), rel=1e-12)


H, A, S, L, V = 1024, 16, 512, 2, 1024


def _gpt_spec():
    return load_model_spec({"model_type": "gpt2", "vocab_size": V, "n_positions": S, "n_embd": H, "n_layer": L,
                            "n_head": A, "attn_impl": "eager", "resid_pdrop": 0.1})


@pytest.fixture(scope="module")
def gpt_ctx():
    return context(_gpt_spec(), "h100-sxm", 8, S)


@pytest.fixture(scope="module")
def gpt_megatron_ctx():
    return context(_gpt_spec(), "h100-sxm", 8, S, runtime="megatron")


@pytest.mark.parametrize("tp,sp,rc,formula", [
    (1, False, "none", lambda t: S * H * (34 + 5 * A * S / H)),
    (2, False, "none", lambda t: S * H * (10 + 24 / t + 5 * A * S / (H * t))),
    (4, True, "none", lambda t: S * H / t * (34 + 5 * A * S / H)),
    (2, False, "selective", lambda t: S * H * (10 + 24 / t)),
    (4, True, "selective", lambda t: 34 * S * H / t),
    (1, False, "full", lambda t: 2 * S * H),
    (4, True, "full", lambda t: 2 * S * H / t),
])
@pytest.mark.parametrize("runtime", ["megatron", "trainer"])
def test_activation_bytes_match_korthikanti(gpt_ctx, gpt_megatron_ctx, tp, sp, rc, formula, runtime):
    """Per-layer activation bytes of a gpt block (eager attention, dropout, b=1) within 5% of
    ../shared/reference/formulas.md, for each parallel setting and recompute mode. Megatron's sequence
    parallelism saves each colwise input's 1/t shard (and gathers it again in backward); the trainer's
    (DTensor) saves the gathered input whole: two [s, h] bf16 tensors per block (attention, MLP) beyond
    the formula's 1/t share, 2 * 2SH(1 - 1/t), unless the mode recomputes them (full)."""
    cm = (gpt_megatron_ctx if runtime == "megatron" else gpt_ctx).cost_model
    plan = Plan(model="gpt", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=S, dp=8 // tp,
                tp=tp, micro_batch=1, sequence_parallel=sp, recompute=(rc,) * L)
    placements = cm.placements_for(plan)
    key = cm.segments_key(placements, sp)
    cost = cm.segment_cost(key, "layers.0", tp, 1, sp, 1, rc, "intra", "intra")
    gathered = 2 * 2 * S * H * (1 - 1 / tp) if runtime == "trainer" and sp and rc != "full" else 0.0
    assert cost.act_bytes == pytest.approx(formula(tp) + gathered, rel=0.05)


@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_are_megatrons_f_and_g(gpt_ctx, sp):
    """Forward: an all-reduce per rowwise/vocab output (g); backward: one per distinct colwise input (f).
    A vocab embedding has only the forward one, a colwise LM head only the backward one; a block has
    two each way (attention and MLP). Under SP: reduce-scatter + all-gather, the same both ways."""
    cm = gpt_ctx.cost_model
    tp = 2
    placements = megatron_placements(gpt_ctx.graph, sp)
    assert placements["tok_embeddings"] == "vocab" and placements["lm_head"] == "colwise"
    key = cm.segments_key(placements, sp)
    segs = cm.segments(placements, sp)
    act = S * H * 2  # one [s, h] bf16 tensor per sample
    link = link_for(cm.profile, "intra")
    pieces = (reduce_scatter_time(act, tp, link) + all_gather_time(act, tp, link)) if sp else None
    ar = all_reduce_time(act, tp, link)
    for name, fwd_n, bwd_n in (("pre", 1, 0), ("layers.0", 2, 2), ("post", 0, 1)):
        seg = segs[name]
        assert [pytest.approx(x) for x in seg.tp_collective_bytes] == [act] * fwd_n
        assert [pytest.approx(x) for x in seg.tp_col_input_bytes] == [act] * bwd_n
        cost = cm.segment_cost(key, name, tp, 1, sp, 1, "none", "intra", "intra")
        if sp:
            assert cost.tp_comm_s == pytest.approx(2 * (fwd_n * reduce_scatter_time(act, tp, link)
                                                        + bwd_n * all_gather_time(act, tp, link)))
            assert pieces == pytest.approx(ar)  # reduce-scatter + all-gather = all-reduce
        else:
            assert cost.tp_comm_s == pytest.approx((fwd_n + bwd_n) * ar)


def test_pipeline_bubble_fraction(gpt_ctx):
    """1F1B with balanced stages: bubble / ideal compute = (p - 1) / m (Narayanan et al.)."""
    cm = gpt_ctx.cost_model
    p, m = 2, 8
    plan = Plan(model="gpt", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=4 * m, seq_len=S, dp=4,
                pp=p, micro_batch=1, recompute=("none",) * L, stage_layers=(1, 1))
    placements = cm.placements_for(plan)
    plan = replace(plan, placements=placements)
    est = cm.estimate(plan)
    stages = cm.stage_costs(plan)
    t_max = max(s["time"] for s in stages)
    assert est.breakdown["pipeline_bubble_s"] > 0
    # t_pipe = m*Tmax + (sum T - Tmax): with near-equal stages the bubble is (p-1) stage-times
    assert est.breakdown["pipeline_bubble_s"] / (m * t_max) == pytest.approx((p - 1) / m, rel=0.35)


def test_recompute_costs_time_saves_memory(gpt_ctx):
    cm = gpt_ctx.cost_model
    base = Plan(model="gpt", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=S, dp=8,
                micro_batch=1)
    est = {rc: cm.estimate(replace(base, recompute=(rc,) * L)) for rc in ("none", "selective", "full")}
    assert est["none"].step_time_s < est["selective"].step_time_s < est["full"].step_time_s
    act = {rc: e.memory_breakdown_gib[0]["activations"] for rc, e in est.items()}
    assert act["none"] > act["selective"] > act["full"]
    # at 512 tokens a micro-batch the backward's end (every gradient, a unit's reduce buffer) is this model's
    # floor (CostModel.reduce_peak): recompute lowers the peak down to it, not below
    assert est["none"].peak_memory_gib >= est["selective"].peak_memory_gib >= est["full"].peak_memory_gib
    assert est["full"].memory_breakdown_gib[0]["reduce"] > 0
    assert est["full"].hardware_tflops_per_gpu > est["full"].model_tflops_per_gpu


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_the_backward_end_holds_every_gradient_and_the_largest_units_reduce_buffer(gpt_ctx, gpt_megatron_ctx, zero):
    """CostModel.reduce_peak, term by term: with one micro-batch (no gradient in the activation peak) and full
    recompute at 512 tokens, this GPT's step peaks as its backward ends, at the parameter and optimizer states with
    every gradient (fp32, sharded as ZeRO shards them) plus ZeRO-3's gathered blocks plus FSDP2's reduce-scatter
    input of the largest unit: its parameters in fp32, unsharded (a block here, wider than the root unit's
    embedding and head). Megatron-LM's gradients live in one buffer reduced in place: no such term."""
    from cost_models.estimate import GRAD_STATE_BYTES, model_state_bytes
    cm = gpt_ctx.cost_model
    plan = Plan(model="gpt", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=S, dp=8,
                micro_batch=1, zero=zero, recompute=("full",) * L)
    mem = cm.estimate(plan).memory_breakdown_gib[0]
    assert mem["grads"] == 0 and mem["reduce"] > 0
    n = cm.graph.parameters
    states = sum(model_state_bytes(n, cm.held_zero(plan), 8, cm.param_state_bytes(plan), 4))
    segs = cm.segments(cm.placements_for(plan), False)
    root = sum(segs[s].dense_params + segs[s].tp_params for s in ("pre", "post"))
    block = cm.max_block_params(plan)
    assert block > root
    end = states + cm.gathered_bytes(plan) + GRAD_STATE_BYTES["fp32"] * block
    assert sum(v for k, v in mem.items() if k != "allocator") * 2**30 == pytest.approx(end, rel=1e-12)
    megatron = gpt_megatron_ctx.cost_model.estimate(plan).memory_breakdown_gib[0]
    assert megatron["reduce"] == 0


def _without_host_terms(profile):
    """The profile with the trainer's host terms (cost_models.host) removed: the kernels' view."""
    from cost_models.host import HELD_TERMS, HOST_TERMS
    return replace(profile, calibration={k: v for k, v in profile.calibration.items()
                                         if k not in HOST_TERMS + HELD_TERMS})


def _kernels_only(profile):
    """The profile without any host floor (the host terms and the per-op rates): a phase is its kernels."""
    prof = _without_host_terms(profile)
    return replace(prof, calibration={k: v for k, v in prof.calibration.items() if not k.startswith("host_us_per_op")})


def test_op_recompute_keeps_matmul_outputs_and_redoes_the_rest(gpt_ctx):
    """Per-op selective checkpointing: activations between none and full (the matmul and attention
    outputs stay), and its recompute is the forward time of exactly the ops it does not save. On the
    kernels alone op sits between none and full; the trainer's host work makes op the slowest on a model
    this small (its dispatch mode costs every forward op twice: measured on an H200, a host-bound 8-layer
    llama ran 295 ms per step under op against 223 ms under full, benchmarks/results/raw/
    trainer_probes_s2.jsonl), and estimate charges that on top."""
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    cm = cost_model(gpt_ctx.graph, make_cluster(_without_host_terms(gpt_ctx.cluster.profile), 8))
    base = Plan(model="gpt", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=S, dp=8,
                micro_batch=1)
    est = {rc: cm.estimate(replace(base, recompute=(rc,) * L)) for rc in ("none", "op", "full")}
    mem = {rc: e.memory_breakdown_gib[0]["activations"] for rc, e in est.items()}
    assert mem["none"] > mem["op"] > mem["full"]
    assert est["none"].step_time_s < est["op"].step_time_s < est["full"].step_time_s
    placements = cm.placements_for(base)
    key = cm.segments_key(placements, False)
    block = cm.block_rep(0)
    seg = cm.segments(placements, False)[block]
    fwd_t, *_ = cm._phase_times(seg.fwd, "fwd", 1, 1, False, 1.0)
    cost = cm.segment_cost(key, block, 1, 1, False, 1, "op", "intra", "intra")
    assert cost.recompute_s == pytest.approx(float(fwd_t[~seg.fwd.keep_op].sum()))
    assert seg.fwd.keep_op.any() and (~seg.fwd.keep_op).any()
    with_host = gpt_ctx.cost_model.estimate(replace(base, recompute=("op",) * L)).step_time_s
    assert with_host > est["op"].step_time_s


def test_torchtitan_op_sac_recomputes_every_second_mm():
    """torchtitan's per-op SAC (its llama `_save_list` policy, a fresh mm count per block forward) saves the
    1st, 3rd, 5th ... aten.mm of each block: in a llama block q, v, gate and down, recomputing k, o and up.
    Priced as a RuntimeVariant of the trainer's runtime: its recompute is the forward time of the ops it does
    not save, and it keeps exactly the recomputed GEMMs' outputs fewer than the trainer's policy."""
    from cost_models.estimate import RuntimeVariant
    spec = load_model_spec({"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 176,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "max_position_embeddings": 64})
    from autoparallel.api import make_cluster
    cluster = make_cluster(_without_host_terms(load_profile("h200")), 1)  # the kernels' view, as above
    trainer = context(spec, cluster, 1, 64)
    titan = context(spec, cluster, 1, 64, graph=trainer.graph, variant=RuntimeVariant(op_sac="torchtitan"))
    block = trainer.cost_model.block_rep(0)
    seg = trainer.cost_model.segments({}, False)[block]
    nodes = [trainer.graph.g.nodes[n] for n in sorted(trainer.graph.g.nodes)
             if trainer.graph.g.nodes[n].get("phase") == "fwd" and trainer.graph.g.nodes[n].get("module", "")
             .startswith(block)]
    assert len(nodes) == len(seg.fwd.keep_op)
    mm = [i for i, a in enumerate(nodes) if a["op"] == "aten.mm.default"]
    assert len(mm) == 7
    assert seg.fwd.keep_op[mm].all()
    assert seg.fwd.keep_op_torchtitan[mm].tolist() == [True, False, True, False, True, False, True]
    redone = [nodes[i]["module"].rsplit(".", 1)[-1] for i in mm if not seg.fwd.keep_op_torchtitan[i]]
    assert redone == ["k_proj", "o_proj", "up_proj"]
    # every other op is treated alike by both policies (attention saved, elementwise recomputed)
    other = np.ones(len(nodes), dtype=bool)
    other[mm] = False
    assert (seg.fwd.keep_op[other] == seg.fwd.keep_op_torchtitan[other]).all()
    costs = {name: ctx.cost_model.segment_cost(ctx.cost_model.segments_key({}, False), block, 1, 1, False, 2, "op",
                                               "intra", "intra")
             for name, ctx in (("trainer", trainer), ("torchtitan", titan))}
    fwd_t, *_ = titan.cost_model._phase_times(seg.fwd, "fwd", 1, 1, False, 2.0)
    assert costs["torchtitan"].recompute_s == pytest.approx(float(fwd_t[~seg.fwd.keep_op_torchtitan].sum()))
    assert costs["torchtitan"].recompute_s > costs["trainer"].recompute_s
    fewer = sum(float(seg.fwd.out_bytes[i]) * 2 for i in mm if not seg.fwd.keep_op_torchtitan[i])
    assert costs["trainer"].act_bytes - costs["torchtitan"].act_bytes == pytest.approx(fewer)


def test_runtime_variant_without_loss_compile_keeps_the_eager_loss():
    """A runtime that compiles its blocks but not its loss (torchtitan until 2025) keeps the eager loss's
    buffers: a compiled plan's last segment then saves what the eager plan's does; the trainer's own loss,
    compiled, saves less (bf16 logits instead of fp32 log-probabilities)."""
    from cost_models.estimate import RuntimeVariant
    trainer = context("llama3-8b", "h200", 8, 2048)
    eager_loss = context("llama3-8b", "h200", 8, 2048, graph=trainer.graph,
                         variant=RuntimeVariant(compiles_loss=False))
    def post(ctx, compiled: bool) -> float:
        key = ctx.cost_model.segments_key({}, False)
        return ctx.cost_model.segment_cost(key, "post", 1, 1, False, 1, "none", "intra", "intra", compiled).act_bytes

    assert trainer.cost_model.compiled_loss(True, 1, 1) and not eager_loss.cost_model.compiled_loss(True, 1, 1)
    assert post(eager_loss, True) == pytest.approx(post(eager_loss, False))
    assert post(trainer, True) < post(trainer, False)
    with pytest.raises(UserError, match="op_sac"):
        RuntimeVariant(op_sac="every-third")


def test_flash_attention_variant_prices_the_flash_kernel():
    """A runtime that ran SDPA's flash backend (FlashAttention-2; torch's pick on Hopper before 2.9) prices its
    causal kernels with the profile's attention_flash_* terms, slower than the default (cuDNN) kernel's on an
    H200 at 8192 tokens, and nothing else; a profile without flash terms prices the default kernel."""
    from cost_models.compute import attention_times
    from cost_models.estimate import RuntimeVariant
    h200 = load_profile("h200")
    flops = np.array([4 * 2 * 32 * 8192 * 8192 * 128.0])  # one layer's causal forward at 2 x 8192, 32 heads
    default = attention_times(flops, "fwd", 8192, 128, h200, "bf16")[0]
    flash = attention_times(flops, "fwd", 8192, 128, h200, "bf16", kernel="flash")[0]
    # measured on the same H200 (benchmarks/results/raw/attention_*_h200_s60.json): 3.25 against 1.73 ms a
    # forward at (2, 32/8, 8192, 128); the fitted terms meet the rows within 13% (attention_timing.py --fit)
    assert 1.5 < flash / default < 2.3
    bare = replace(h200, calibration={k: v for k, v in h200.calibration.items() if "flash" not in k})
    assert attention_times(flops, "fwd", 8192, 128, bare, "bf16", kernel="flash")[0] == pytest.approx(default)
    trainer = context("llama3-8b", "h200", 8, 8192)
    titan = context("llama3-8b", "h200", 8, 8192, graph=trainer.graph, variant=RuntimeVariant(attention="flash"))
    plan = Plan(model="l", hardware="h200", gpus=8, gpus_per_node=8, global_batch=16, seq_len=8192, dp=8,
                micro_batch=2, zero=3)
    est = {k: c.cost_model.estimate(plan) for k, c in (("trainer", trainer), ("flash", titan))}
    assert est["flash"].step_time_s > est["trainer"].step_time_s
    assert est["flash"].peak_memory_gib == pytest.approx(est["trainer"].peak_memory_gib)
    with pytest.raises(UserError, match="attention"):
        RuntimeVariant(attention="flash3")


def test_a_head_between_kernel_tiles_costs_the_tile_it_is_padded_to():
    """The fused kernels compute a head at their tile's width (compute.padded_head_dim): on the h200 profile a
    head of 80 or 96 takes exactly a 128-wide head's time over the same scores (cuDNN's 128-wide kernel ran
    them, s94), 80 takes 96's under FlashAttention-2 (tiles every 32), and a 256-wide head's FLOP term runs at
    attention_tile_flop_scale of the fitted rate. A profile without tiles prices the FLOPs as traced."""
    from cost_models.compute import attention_times, padded_head_dim
    h200 = load_profile("h200")

    def at(d: int, prof=h200, kernel: str = "default", phase: str = "fwd") -> float:
        flops = np.array([4 * 8 * 32 * 2048 * 2048 * float(d)])  # (8, 32, 2048, d): the same scores at every d
        return float(attention_times(flops, phase, 2048, d, prof, "bf16", kernel=kernel)[0])

    assert [padded_head_dim(d, h200) for d in (32, 64, 80, 96, 128, 160, 256)] == [64, 64, 128, 128, 128, 192, 256]
    assert padded_head_dim(80, h200, "flash") == 96
    assert at(80) == pytest.approx(at(128)) and at(96) == pytest.approx(at(128)) and at(64) < 0.9 * at(128)
    assert at(80, kernel="flash") == pytest.approx(at(96, kernel="flash"))
    assert at(96, kernel="flash") < at(128, kernel="flash")
    tiles = ("attention_head_dim_tile", "attention_flash_head_dim_tile", "attention_tile_flop_scale")
    bare = replace(h200, calibration={k: v for k, v in h200.calibration.items() if k not in tiles})
    assert at(80, bare) < at(96, bare) < at(128, bare)
    assert at(128, bare) == pytest.approx(at(128))
    # the 256-wide kernel: the FLOP term alone grows by 1 / scale, the score, row and fixed terms stay
    for phase, scale in zip(("fwd", "bwd"), h200.calibration["attention_tile_flop_scale"]["256"]):
        flop_max = h200.calibration[f"attention_{phase}_terms"][0]
        flop_s = 4 * 8 * 32 * 2048 * 2048 * 256.0 / (h200.peak("bf16") * flop_max)  # at()'s FLOPs, either phase
        assert at(256, phase=phase) - at(256, bare, phase=phase) == pytest.approx(flop_s * (1 / scale - 1))


def test_the_tile_scale_fit_recovers_the_scale_it_was_given():
    """calibrate.fit_attention_tile_scale on times the model itself produced with a known scale at the 192- and
    256-wide tiles gets those scales back (closed-form least squares in 1 / s, the other terms held)."""
    from autoparallel.calibrate import AttentionSample, _sdpa_flops, fit_attention_tile_scale
    from cost_models.compute import attention_times
    h200 = load_profile("h200")
    truth = {"192": [0.7, 0.5], "256": [0.9, 0.6]}
    given = replace(h200, calibration={**h200.calibration, "attention_tile_flop_scale": truth})
    samples = []
    for b, h, s, d in ((2, 32, 2048, 192), (4, 32, 4096, 192), (8, 16, 2048, 256), (1, 16, 8192, 256),
                       (2, 32, 2048, 128)):
        ff, fb = _sdpa_flops((b, h, s, d), (b, h, s, d))
        tf, tb = (float(attention_times(np.array([f]), ph, s, d, given, "bf16")[0])
                  for f, ph in ((ff, "fwd"), (fb, "bwd")))
        samples.append(AttentionSample(b, h, h, s, d, ff, fb, tf, tb, "default"))
    fitted = fit_attention_tile_scale(samples, h200)
    assert set(fitted) == {"192", "256"}  # the 128-wide tile is the terms' own: no scale
    for tile, pair in truth.items():
        assert fitted[tile] == pytest.approx(pair, abs=1e-3)  # rounded to 3 places

def test_overlapped_collective_exposure_is_the_chunked_ring():
    """Chunked ring overlap of n-rank collectives (time c) with GEMMs (time g): all hidden while the n - 1
    transfers fit under the n chunks, c - g (n - 1) / n exposed once they set the pace."""
    from cost_models.comm import overlapped_collective_exposure
    assert overlapped_collective_exposure(3.0, 8.0, 4) == 0.0          # 3 <= 8 * 3/4
    assert overlapped_collective_exposure(7.0, 8.0, 4) == pytest.approx(1.0)
    assert overlapped_collective_exposure(7.0, 8.0, 1) == 7.0          # no group, nothing to overlap


@given(total=st.floats(0, 10), cover=st.floats(0, 10), idle=st.floats(0, 10), kappa=st.floats(0, 1))
def test_dp_overlap_cost_is_exposure_plus_the_slowdown_of_the_hidden_part(total, cover, idle, kappa):
    """comm.dp_overlap_cost: exposed = max(0, T - W); the hidden part min(T, W) slows the work beside it by
    kappa per second, less the GPU's idle time S; their sum is the maximum of its four affine pieces (what the
    planner's rows state), for every 0 <= kappa <= 1."""
    from cost_models.comm import dp_overlap_cost
    exposed, slowdown = dp_overlap_cost(total, cover, idle, kappa)
    assert exposed == pytest.approx(max(0.0, total - cover), abs=1e-12)
    assert slowdown == pytest.approx(max(0.0, kappa * min(total, cover) - idle), abs=1e-9)


def test_dp_overlap_cost_limits():
    from cost_models.comm import dp_overlap_cost
    assert dp_overlap_cost(2.0, 5.0, 0.0, 0.0) == (0.0, 0.0)          # kappa 0: the perfect overlap of before
    assert dp_overlap_cost(2.0, 0.0, 0.0, 1.0) == (2.0, 0.0)          # nothing to hide behind: all exposed
    assert sum(dp_overlap_cost(2.0, 5.0, 0.0, 1.0)) == 2.0            # kappa 1: hidden costs its own time
    assert dp_overlap_cost(2.0, 5.0, 3.0, 1.0) == (0.0, 0.0)          # a host-paced GPU idles through it


def test_overlap_interference_is_read_from_the_profile_and_bounded():
    from cost_models.comm import OVERLAP_INTERFERENCE_DEFAULT, overlap_interference
    h200, a100 = load_profile("h200"), load_profile("a100-sxm-80gb")
    assert overlap_interference(h200) == h200.calibration["overlap_interference"]
    assert load_profile("h100-sxm").calibration["overlap_interference"] == h200.calibration["overlap_interference"]
    assert "overlap_interference" not in a100.calibration
    assert overlap_interference(a100) == OVERLAP_INTERFERENCE_DEFAULT
    for bad in (1.5, -0.1, "high"):
        with pytest.raises(UserError, match="overlap_interference"):
            overlap_interference(replace(h200, calibration={**h200.calibration, "overlap_interference": bad}))


def test_estimate_charges_the_hidden_data_parallel_collectives_interference():
    """A dp8 ZeRO-3 step of an 8B llama on H100s: its FSDP traffic hides behind the blocks' work (nothing
    exposed), which then runs slower by kappa per second of it (the GPU never waits for the host at these
    widths); with kappa 0 the step is that much shorter and nothing else moves."""
    plan = Plan(model="llama3-8b", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=16, seq_len=4096,
                dp=8, tp=1, pp=1, ep=1, vpp=1, micro_batch=2, zero=3, recompute=("full",) * 32)
    ctx = context("llama3-8b", "h100-sxm", 8, 4096)
    prof = ctx.cluster.profile
    free = context("llama3-8b", replace(prof, calibration={**prof.calibration, "overlap_interference": 0.0}), 8, 4096,
                   graph=ctx.graph)
    est, est0 = ctx.cost_model.estimate(plan), free.cost_model.estimate(plan)
    b, b0 = est.breakdown, est0.breakdown
    assert b["dp_comm_total_s"] > 0 and b["dp_comm_exposed_s"] == 0.0 and b0["dp_interference_s"] == 0.0
    kappa = prof.calibration["overlap_interference"]
    assert b["dp_interference_s"] == pytest.approx(kappa * b["dp_comm_total_s"])
    assert est.step_time_s == pytest.approx(est0.step_time_s + b["dp_interference_s"])


def test_megatron_tp_comm_overlap_hides_the_collectives_behind_the_gemms():
    """Megatron's --tp-comm-overlap (RuntimeVariant.tp_comm_overlap) leaves of each phase's TP collectives only
    what the phase's GEMMs cannot cover, with sequence parallelism; without SP, and on the trainer's runtime by
    default, the collectives stay in line. GEMM times, activations and FLOPs are the same."""
    from cost_models.comm import overlapped_collective_exposure
    from cost_models.estimate import RuntimeVariant
    base = context("llama3-8b", "h100-sxm", 8, 4096, runtime="megatron")
    tpo = context("llama3-8b", "h100-sxm", 8, 4096, graph=base.graph, runtime="megatron",
                  variant=RuntimeVariant(tp_comm_overlap=True))
    cm = base.cost_model
    block = cm.block_rep(0)

    from autoparallel.placements import megatron_placements

    def cost(ctx, sp: bool, micro_batch: int):
        key = ctx.cost_model.segments_key(megatron_placements(base.graph, sp), sp)
        return ctx.cost_model.segment_cost(key, block, 8, 1, sp, micro_batch, "none", "intra", "intra")

    seg = cm.segments(megatron_placements(base.graph, True), True)[block]
    for mb in (1, 16):
        inline, hidden = cost(base, True, mb), cost(tpo, True, mb)
        assert inline.tp_comm_s > 0
        comm_fwd = comm_bwd = inline.tp_comm_s / 2  # under SP each forward collective is a backward one
        # the ops' own times (collectives past the host floor: nothing stretched) and the floor
        fwd_t, _, _, floor_fwd, _, _ = cm._phase_times(seg.fwd, "fwd", 8, 1, True, float(mb), comm_s=1e9)
        bwd_t = cm._phase_times(seg.bwd, "bwd", 8, 1, True, float(mb), comm_s=1e9)[0]
        want_fwd = overlapped_collective_exposure(comm_fwd, float(fwd_t[seg.fwd.matmul].sum()), 8)
        want_bwd = overlapped_collective_exposure(comm_bwd, float(bwd_t[seg.bwd.matmul].sum()), 8)
        assert hidden.tp_comm_s == pytest.approx(want_fwd + want_bwd)
        assert hidden.tp_comm_s < inline.tp_comm_s
        # the phase: its ops and the exposed collectives, or the host's pace where that is slower
        assert hidden.fwd_s == pytest.approx(max(float(fwd_t.sum()) + want_fwd, floor_fwd))
        assert hidden.act_bytes == inline.act_bytes and hidden.flops_fwd == inline.flops_fwd
    # without sequence parallelism Transformer Engine does not overlap: the all-reduces stay in line
    assert cost(base, False, 1).tp_comm_s > 0
    assert cost(tpo, False, 1).tp_comm_s == pytest.approx(cost(base, False, 1).tp_comm_s)


@pytest.fixture(scope="module")
def llama8b_graph():
    from autoparallel.api import trace_model
    return trace_model("llama3-8b", seq_len=2048)


def test_estimate_runs_on_every_profile(llama8b_graph):
    """`estimate` works for llama3-8b on 8 devices of every shipped profile."""
    names = list_profiles()
    assert len(names) >= 25
    for name in names:
        est, plan = estimate_plan("llama3-8b", hardware=name, gpus=8, global_batch=16, seq_len=2048, tp=2,
                                  micro_batch=1, recompute="selective", zero=1)
        assert est.step_time_s > 0 and est.tokens_per_s > 0 and 0 < est.mfu < 1, name
        assert est.peak_memory_gib > 0


def test_impossible_plans_are_user_errors(llama8b_graph):
    with pytest.raises(UserError, match="does not divide --gpus"):
        estimate_plan("llama3-8b", hardware="h100-sxm", gpus=8, global_batch=16, seq_len=2048, tp=3)
    with pytest.raises(UserError, match="key/value heads|attention heads"):
        estimate_plan("llama3-8b", hardware="h100-sxm", gpus=16, global_batch=16, seq_len=2048, tp=16)
    with pytest.raises(UserError, match="no expert layers"):
        estimate_plan("llama3-8b", hardware="h100-sxm", gpus=8, global_batch=16, seq_len=2048, ep=2)
    with pytest.raises(UserError, match="global batch"):
        estimate_plan("llama3-8b", hardware="h100-sxm", gpus=8, global_batch=12, seq_len=2048, micro_batch=4)


def test_megatron_smallest_row_within_15_percent():
    """Row 1 of the SC'21 table (1.7B, 32 GPUs, tp1 pp1, mb16, full recompute): 137 TFLOP/s measured.
    The full table is benchmarks/validate_megatron.py; this guards the calibration against drift."""
    spec = load_model_spec({"model_type": "gpt2", "vocab_size": 51200, "n_positions": 2048, "n_embd": 2304,
                            "n_layer": 24, "n_head": 24, "attn_impl": "eager", "resid_pdrop": 0.1})
    ctx = context(spec, "a100-sxm-80gb", 32, 2048, overlap_grad_sync=False)
    plan = Plan(model="gpt-1.7b", hardware="a100-sxm-80gb", gpus=32, gpus_per_node=8, global_batch=512,
                seq_len=2048, dp=32, micro_batch=16, recompute=("full",) * 24, param_dtype="fp16")
    est = ctx.cost_model.estimate(replace(plan, placements=ctx.cost_model.placements_for(plan)))
    assert est.hardware_tflops_per_gpu == pytest.approx(137, rel=0.15)
    assert est.fits


def test_trainer_loss_and_zero3_memory_rules():
    """The loss buffers and ZeRO-3 parameter state of the trainer's runtime, per logit and parameter
    (CostModel.logits_bytes, param_state_bytes, fsdp_units; derivations in their docstrings and
    docs/trainer_sweep_notes.md, s5): eager cross entropy keeps an fp32 copy and an fp32 gradient of the
    logits and the step holds the bf16 head output (4 + 4 + 2 bytes); the compiled loss makes only a bf16
    gradient (2); torch's loss_parallel holds one fp32 logit-sized tensor more than eager (+4, over tp
    shards); Megatron computes its loss inside the model (4 + 4). ZeRO-3 under FSDP2 mixed precision keeps
    no bf16 parameter shard."""
    ctx = context("tiny-llama", "h200", 2, 128)
    cm = ctx.cost_model
    vocab = cm.vocab_size
    base = Plan(model="tiny-llama", hardware="h200", gpus=2, gpus_per_node=2, global_batch=4, seq_len=128, dp=2,
                micro_batch=2, zero=2, placements=megatron_placements(ctx.graph, 1))
    logits = 2 * 128 * vocab
    assert cm.logits_bytes(base) == pytest.approx(10 * logits)
    assert cm.logits_bytes(replace(base, compile=True)) == pytest.approx(2 * logits)
    # Megatron's layout shards the head column-wise: the trainer's loss runs vocab-parallel
    tp2 = replace(base, dp=1, tp=2, micro_batch=4, sequence_parallel=True, placements=megatron_placements(ctx.graph, 2))
    assert cm.loss_parallel(tp2) and not cm.loss_parallel(base)
    assert cm.logits_bytes(tp2) == pytest.approx(14 * 4 * 128 * vocab / 2)
    replicated_head = dict(tp2.placements, lm_head="replicate")
    assert not cm.loss_parallel(replace(tp2, placements=replicated_head))
    megatron = context("tiny-llama", "h200", 2, 128, runtime="megatron").cost_model
    assert megatron.logits_bytes(base) == pytest.approx(8 * logits)
    assert cm.param_state_bytes(base) == 2 and cm.param_state_bytes(replace(base, zero=3)) == 0
    assert megatron.param_state_bytes(replace(base, zero=3)) == 2
    zero2, zero3 = cm.estimate(base), cm.estimate(replace(base, zero=3))
    params = zero2.memory_breakdown_gib[0]["params"]
    assert params > 0 and zero3.memory_breakdown_gib[0]["params"] == 0
    post = cm.segments(cm.placements_for(base), False)["post"]
    assert cm.fsdp_units(post, base) == int(not ctx.graph.has_tied_parameters)


def test_expert_groups_are_units_of_their_own_where_the_trainer_wraps_them_so():
    """An MoE block is one FSDP2 unit on one data-parallel rank and two (block, expert group) under ep > 1 or
    a dense data-parallel group of several ranks (trainer._setup's `units`; the llama block always one)."""
    ctx = context("tiny-moe", "h200", 2, 128)
    cm = ctx.cost_model
    one = Plan(model="tiny-moe", hardware="h200", gpus=2, gpus_per_node=2, global_batch=4, seq_len=128, tp=2,
               micro_batch=4, placements=megatron_placements(ctx.graph, 2))
    block = cm.segments(cm.placements_for(one), False)[cm.block_rep(0)]
    assert block.expert_params > 0
    assert cm.fsdp_units(block, one) == 1
    assert cm.fsdp_units(block, replace(one, tp=1, dp=2, micro_batch=2, placements={})) == 2
    assert cm.fsdp_units(block, replace(one, tp=1, ep=2, micro_batch=2, placements={})) == 2


def test_a_full_recompute_replays_the_forward_at_the_dense_host_rate_without_fsdp_hooks():
    """The replay of a fully recomputed block issues its forward ops again, but not FSDP2's unshard hooks (they
    return early in the backward) and, in an MoE block, at the dense per-op rate: the host per replayed op
    measured alike for MoE and dense blocks (benchmarks/host_mix.py, s42 against s36: 18 us an op for the
    catalog MoE's, 6-32 for the dense families'), where the MoE's forward rate is twice the dense one. At 128
    tokens on an H200 every phase is host-bound, so the phase times are their floors exactly."""
    from cost_models.compute import host_seconds_per_op
    ctx = context("tiny-moe", "h200", 1, 128)
    cm, prof = ctx.cost_model, ctx.cluster.profile
    plan = Plan(model="tiny-moe", hardware="h200", gpus=1, gpus_per_node=1, global_batch=1, seq_len=128)
    key = cm.segments_key(cm.placements_for(plan), False)
    block = cm.block_rep(0)
    seg = cm.segments(cm.placements_for(plan), False)[block]
    assert seg.fwd.expert.any()
    n = len(seg.fwd.flops)
    fsdp = 0.5 * cm.host.fsdp_tensor_s * seg.param_tensors
    none = cm.segment_cost(key, block, 1, 1, False, 1, "none", "intra", "intra")
    full = cm.segment_cost(key, block, 1, 1, False, 1, "full", "intra", "intra")
    assert none.fwd_s == pytest.approx(n * host_seconds_per_op(prof, "fwd", expert=True) + fsdp)
    assert full.recompute_s == pytest.approx(n * host_seconds_per_op(prof, "fwd"))
    assert full.recompute_s < full.fwd_s - fsdp
    # the backward pays the checkpoint region and the per-op replay term on top
    assert full.bwd_s == pytest.approx(none.bwd_s + cm.host.checkpoint_s + cm.host.recompute_op_s * n)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_gpu_paced_phase_pays_the_streams_gap_per_kernel(compiled):
    """calibration.stream_gap_us (eager, compiled): the stream's idle between kernels issued from the host, per
    kernel beyond kernel_overhead_us. Without a host floor a block's phase grows by exactly the gap times its
    kernels: eager, each op that moves bytes or does FLOPs (views launch none); compiled, each launch of the
    block's graph (graph.Launches)."""
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    from cost_models.compute import stream_gap_seconds
    ctx = context("tiny-llama", "h200", 1, 128)
    prof = _kernels_only(ctx.cluster.profile)
    gaps = [2.0, 3.0]
    cms = [cost_model(ctx.graph, make_cluster(replace(prof, calibration={**prof.calibration, "stream_gap_us": g}), 1))
           for g in ([0.0, 0.0], gaps)]
    assert stream_gap_seconds(cms[1].profile, compiled) == pytest.approx(gaps[compiled] * 1e-6)
    assert stream_gap_seconds(load_profile("mi300x"), compiled) == 0.0  # not measured there: no gap
    plan = Plan(model="tiny-llama", hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128)
    cm = cms[0]
    seg = cm.segments(cm.placements_for(plan), False)[cm.block_rep(0)]
    for phase, ops, i in (("fwd", seg.fwd, 0), ("bwd", seg.bwd, 1)):
        launches = cm._launches(seg, i, 4.0, 1, False, 1) if compiled else 0
        t0, t1 = (float(c._phase_times(ops, phase, 1, 1, False, 4.0, compiled, launches=launches)[0].sum())
                  for c in cms)
        kernels = launches if compiled else int(np.count_nonzero((ops.flops > 0) | (ops.act_bytes + ops.param_bytes > 0)))
        assert kernels > 0
        assert t1 - t0 == pytest.approx(gaps[compiled] * 1e-6 * kernels, rel=1e-9)


class _GatheredTable(nn.Module):
    """A table of R rows gathered once per token (an MoE's expert biases, gpt-oss's): the gather's backward is
    an accumulating index_put of batch x seq source rows into R destination rows."""

    def __init__(self, vocab: int = 64, h: int = 64, rows: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.table = nn.Parameter(torch.zeros(rows, h))
        self.layers = nn.ModuleList(nn.Linear(h, h) for _ in range(2))
        self.head = nn.Linear(h, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) + self.table[ids % self.table.shape[0]]
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_an_accumulating_index_put_takes_the_time_of_its_duplicates():
    """calibration.index_put_terms: an index_put adding N source rows into R destination rows takes bytes /
    (fraction x BW) + duplicate_us x N / R + fixed_us (compute.index_put_times); the segment reads N / R from the
    op's traced sizes (compute.gathered_per_row), and a weight-shaped destination's ratio grows with the
    micro-batch (its N is the tokens, its R fixed). Its bytes are the terms' convention (compute.index_put_bytes:
    benchmarks/index_backward.py's 2 N D + 2 R D + 8 N for bf16 rows, the traced read of the zero-filled
    destination left out; fp32 rows count as bf16 ones of the same length)."""
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    from autoparallel.tracer import trace
    from cost_models.compute import gathered_per_row, index_put_bytes, index_put_times
    assert gathered_per_row((32, 2880), 32 * 2880 * 2, 32 * 2880 * 2 + 16384 * (2880 * 2 + 8)) == pytest.approx(512)
    r, n, d = 32, 16384, 2880
    for size in (2, 4):  # what the trace records for a bf16 and an fp32 op: read = zeros + source + indices
        traced_read = r * d * size + n * (d * size + 8)
        assert index_put_bytes((r, d), r * d * size, traced_read) == pytest.approx(2 * n * d + 2 * r * d + 8 * n)
    seq, batch = 128, 2
    graph = trace(_GatheredTable(), batch=batch, seq_len=seq)
    prof = _kernels_only(load_profile("h200"))
    cm = cost_model(graph, make_cluster(prof, 1))
    plan = Plan(model="m", hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=seq)
    pre = cm.segments(cm.placements_for(plan), False)["pre"]
    sel = pre.bwd.gathered_per_row > 0
    assert sel.sum() == 1 and pre.bwd.weight_sized[sel].all()
    assert pre.bwd.gathered_per_row[sel][0] == pytest.approx(batch * seq / 8)
    terms = prof.calibration["index_put_terms"]
    for mb in (1.0, 4.0):
        t = cm._phase_times(pre.bwd, "bwd", 1, 1, False, mb)[0]
        moved = float((pre.bwd.index_put_bytes * graph.batch)[sel][0])  # a weight-shaped op keeps its traced bytes
        assert 0 < moved < float((pre.bwd.act_bytes * graph.batch)[sel][0])
        per_row = batch * seq / 8 * mb / graph.batch
        want = float(index_put_times(np.array([moved]), np.array([per_row]), prof)[0])
        assert want == pytest.approx(moved / (prof.memory_bandwidth * terms["fraction"])
                                     + (per_row * terms["duplicate_us"] + terms["fixed_us"]) * 1e-6)
        assert float(t[sel][0]) == pytest.approx(want + prof.calibration["stream_gap_us"][0] * 1e-6)
    assert index_put_times(np.array([1.0]), np.array([1.0]), load_profile("mi300x")) is None


def _with_calibration(ctx, key: str, value: float):
    """A cost model of ctx's graph on one device of ctx's profile with calibration[key] = value."""
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    prof = ctx.cluster.profile
    return cost_model(ctx.graph, make_cluster(replace(prof, calibration={**prof.calibration, key: value}), 1))


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_fsdp_host_work_counts_the_units_parameter_tensors(model):
    """FSDP2's per-tensor host work (cost_models.host host_us_per_fsdp_tensor): each segment counts the
    parameter tensors of its modules (tied ones once), as the built model holds them; the hooks run it in
    every micro-batch and ZeRO mode, on one rank too (unshard before the forward, post_backward after the
    backward), as host work of the two phases, outside compiled graphs as well: a host-bound step (the rate
    is large enough that no kernel hides it) grows by exactly rate x tensors x micro-batches, under ZeRO-0
    and ZeRO-2, eager and compiled."""
    import torch

    from autoparallel.models import build_model
    ctx = context(model, "h200", 1, 128)
    with torch.device("meta"):
        module = build_model(load_model_spec(model))
    block = ctx.graph.blocks[0]
    segs = ctx.cost_model.segments(ctx.cost_model.placements_for(
        Plan(model=model, hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128)), False)
    assert segs[block].param_tensors == len(list(module.get_submodule(block).parameters()))
    assert sum(s.param_tensors for s in segs.values() if s.name != block) + len(ctx.graph.blocks) * \
        segs[block].param_tensors == len(list(module.parameters()))  # parameters() yields a tied one once
    rate = 1000.0  # us: far above any segment's kernels at these widths
    cm, cm0 = (_with_calibration(ctx, "host_us_per_fsdp_tensor", us) for us in (rate, 0.0))
    tensors = len(list(module.parameters()))
    for zero, compiled in ((0, False), (2, False), (0, True)):
        plan = Plan(model=model, hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128,
                    micro_batch=2, zero=zero, compile=compiled)
        extra = cm.estimate(plan).step_time_s - cm0.estimate(plan).step_time_s
        assert extra == pytest.approx(rate * 1e-6 * tensors * plan.num_micro_batches, rel=1e-6)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_per_op_checkpointing_pays_its_host_per_parameter_tensor_of_each_block(model):
    """cost_models.host host_us_per_sac_tensor: a block under per-op checkpointing pays the term once per
    parameter tensor in its forward (FSDP2's parameter views pass through the checkpoint's dispatch mode),
    whatever its op count: with the term far above any kernel at these widths (the phase host-bound), a block's
    forward grows by exactly term x its parameter tensors (the GPT's 16, the llama's 9), and its recompute by
    the recomputed ops' share of that forward, as every host term of the forward; without per-op checkpointing
    (none, full) neither moves."""
    ctx = context(model, "h200", 1, 128)
    rate = 1000.0
    cm, cm0 = (_with_calibration(ctx, "host_us_per_sac_tensor", us) for us in (rate, 0.0))
    plan = Plan(model=model, hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128, micro_batch=2)
    placements = cm.placements_for(plan)
    key, block = cm.segments_key(placements, False), cm.block_rep(0)
    tensors = cm.segments(placements, False)[block].param_tensors
    cm0.segments(placements, False)
    assert tensors == {"tiny-llama": 9, "tiny-gpt": 16}[model]
    for mode in ("op", "none", "full"):
        cost, cost0 = (c.segment_cost(key, block, 1, 1, False, 2, mode, "intra", "intra") for c in (cm, cm0))
        assert cost.fwd_s - cost0.fwd_s == pytest.approx(rate * 1e-6 * tensors if mode == "op" else 0.0,
                                                         rel=1e-9, abs=1e-12)
        if mode == "op":  # the recomputed ops take their share of the stretched forward
            assert 0 < cost.recompute_s - cost0.recompute_s < cost.fwd_s - cost0.fwd_s


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_a_compiled_block_pays_its_host_call_per_phase_whatever_its_op_count(model):
    """cost_models.host host_us_per_compiled_call: a compiled block's phase costs the host one graph call
    (compute.compiled_host_floor, the forward's share 1.2 and the backward's 0.8 of the term), not a rate per
    traced op: a host-bound compiled step (the term far above any block's kernels at these widths) grows
    by exactly term x 2 x (blocks + the compiled loss) x micro-batches, for the llama's blocks and the GPT's
    alike though their op counts differ; the embedding runs eager, as the trainer runs it, and an eager
    step does not move with the term."""
    from cost_models.compute import COMPILED_CALL_SHARE
    ctx = context(model, "h200", 1, 128)
    rate = 5000.0
    cm, cm0 = (_with_calibration(ctx, "host_us_per_compiled_call", us) for us in (rate, 0.0))
    assert sum(COMPILED_CALL_SHARE.values()) == pytest.approx(2.0)
    plan = Plan(model=model, hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128, micro_batch=2,
                compile=True)
    extra = cm.estimate(plan).step_time_s - cm0.estimate(plan).step_time_s
    assert cm.compiled_loss(True, 1, 1)
    calls = len(ctx.graph.blocks) + 1
    assert extra == pytest.approx(rate * 1e-6 * 2 * calls * plan.num_micro_batches, rel=1e-6)
    eager = replace(plan, compile=False)
    assert cm.estimate(eager).step_time_s == cm0.estimate(eager).step_time_s


def test_a_compiled_block_pays_per_kernel_it_launches_and_its_split_reductions_grow_with_the_micro_batch():
    """cost_models.host host_us_per_compiled_launch: beside its call, a compiled block's phase costs the host
    per kernel it launches (graph.Launches, OpGraph.compiled_launches). A tiny llama block launches 14 kernels
    forward (7 GEMMs, attention, 6 fused groups) and 24 backward at 128 tokens a micro-batch (14 GEMMs, the
    attention backward's 3, 7 fused kernels); above 128 tokens Inductor splits the gradients of its two RMSNorm
    weights (sums over the tokens) into two kernels each: 26.
    With the call priced at 0 and the launch far above any kernel, the step grows by the rate x kernels x
    blocks x micro-batches (the loss launches none of these), and an eager step not at all."""
    ctx = context("tiny-llama", "h200", 1, 128)
    rate = 5000.0
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    prof = ctx.cluster.profile

    def model_with(us: float):
        cal = {**prof.calibration, "host_us_per_compiled_call": 0.0, "host_us_per_compiled_launch": us}
        return cost_model(ctx.graph, make_cluster(replace(prof, calibration=cal), 1))

    cm, cm0 = model_with(rate), model_with(0.0)
    blocks = len(ctx.graph.blocks)
    for micro_batch, kernels in ((1, 14 + 24), (2, 14 + 26)):
        plan = Plan(model="tiny-llama", hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128,
                    micro_batch=micro_batch, compile=True)
        extra = cm.estimate(plan).step_time_s - cm0.estimate(plan).step_time_s
        assert extra == pytest.approx(rate * 1e-6 * kernels * blocks * plan.num_micro_batches, rel=1e-6)
        eager = replace(plan, compile=False)
        assert cm.estimate(eager).step_time_s == cm0.estimate(eager).step_time_s


def test_a_block_whose_graph_breaks_at_a_data_dependent_shape_is_priced_eager_when_compiled():
    """DBRX's compiled step (s114): its per-expert loop's nonzero breaks Dynamo's graph and the loop runs as
    eager Python, 552 ms against 580 eager, where pricing the block as fused predicted 422 (-23.6%). A block
    with such an op (compute.breaks_graph) is priced as eager under compile=True, time and memory alike, while
    the compiled loss still counts (the head's step differs)."""
    from loop_moe import LoopMoE

    from autoparallel.api import make_cluster, trace_model
    from autoparallel.sharding import cost_model
    graph = trace_model(LoopMoE(), seq_len=64)
    cm = cost_model(graph, make_cluster(load_profile("h200"), 1))
    plan = Plan(model="loop-moe", hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=64, micro_batch=2)
    placements = cm.placements_for(plan)
    key, block = cm.segments_key(placements, False), cm.block_rep(0)
    assert cm.segments(placements, False)[block].fwd.graph_break.any()
    eager, compiled = (cm.segment_cost(key, block, 1, 1, False, 2, "none", "intra", "intra", compiled=c)
                       for c in (False, True))
    assert compiled == eager
    assert cm.segment_cost(key, "post", 1, 1, False, 2, "none", "intra", "intra", compiled=True) != \
        cm.segment_cost(key, "post", 1, 1, False, 2, "none", "intra", "intra")


def test_a_profile_with_the_retired_per_op_compiled_term_is_one_clear_error(tmp_path):
    """A profile fitted before the compiled host floor became one call a phase carries
    host_us_per_op_compiled, which nothing reads: priced without it, its compiled plans would lose their host
    work silently. `estimate` says so in one line (exit 2) and names the refit; with the new term beside it
    the old one is ignored."""
    import yaml
    from cli_harness import run_cli
    data = yaml.safe_load(Path(load_profile("h200").path).read_text())
    cal = data["calibration"]
    cal["host_us_per_op_compiled"] = cal.pop("host_us_per_compiled_call")
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    argv = ["estimate", "tiny-llama", "--hardware", str(path), "--gpus", "1", "--global-batch", "4", "--seq-len", "128"]
    old = run_cli(argv)
    assert old.kind == "usage-error", old.err
    assert "host_us_per_op_compiled is no longer read" in old.error_lines[0]
    assert "calibrate --trainer" in old.error_lines[0]
    cal["host_us_per_compiled_call"] = 1000.0
    path.write_text(yaml.safe_dump(data))
    assert run_cli(argv).kind == "ok"


def test_the_trainer_update_prices_adamw_and_fsdp_copies_at_their_own_fractions():
    """compute.fsdp_update_time: 28 B of AdamW per optimizer parameter at memory_fraction.adamw, and
    FSDP2's copies at fsdp_copy_fraction: at d = 4, ZeRO-3, two micro-batches, 2 x 2 unshards of
    6/4 + 4 B, 2 reductions of 12/4 + 6 B (40 B), nothing kept between micro-batches; at ZeRO-0 one
    reduction, the first micro-batch's bf16 gradient upcast into FSDP2's fp32 accumulator (6 B), the
    second's added to it (10 B) and the reduction reading fp32 (+2 B), 18 B at fsdp_accumulate_fraction;
    with a bf16 reduction autograd adds the second gradient into the first (3 x 2 B)."""
    from cost_models.comm import trainer_dp_schedule
    from cost_models.compute import fsdp_update_time
    base = load_profile("h200")
    prof = replace(base, calibration={**base.calibration, "fsdp_copy_fraction": 0.5, "fsdp_accumulate_fraction": 0.4,
                                      "memory_fraction": {**base.calibration["memory_fraction"], "adamw": 0.25}})
    bw = prof.memory_bandwidth
    assert fsdp_update_time(0.25, 4, trainer_dp_schedule(3, 2, False), 2, prof) == pytest.approx(0.25 * 28 / (bw * 0.25) + 40 / (bw * 0.5))
    zero0 = trainer_dp_schedule(0, 2, False)
    assert fsdp_update_time(1.0, 4, zero0, 2, prof) == pytest.approx(
        28 / (bw * 0.25) + (2 * 5.5 + 9) / (bw * 0.5) + 18 / (bw * 0.4))
    assert fsdp_update_time(1.0, 4, zero0, 2, prof, reduce_bytes=2) == pytest.approx(
        28 / (bw * 0.25) + (2 * 5.5 + 9) / (bw * 0.5) + 6 / (bw * 0.4))
    # clipping (max_grad_norm) reads each gradient entry the optimizer holds for the norm and rewrites it: 12 B more
    assert fsdp_update_time(0.25, 4, trainer_dp_schedule(3, 2, False), 2, prof, clip=True) == pytest.approx(
        0.25 * (28 + 12) / (bw * 0.25) + 40 / (bw * 0.5))
    # four micro-batches under a pipeline (one unshard, one reduction): three adds
    assert fsdp_update_time(1.0, 1, trainer_dp_schedule(1, 4, True), 4, prof) == pytest.approx(
        28 / (bw * 0.25) + (10 + 18) / (bw * 0.5) + (8 + 3 * 10) / (bw * 0.4))
    # without a measured AdamW fraction the step runs at memory_bound, without an accumulation fraction the
    # copies' one prices it
    plain = replace(prof, calibration={k: v for k, v in prof.calibration.items()
                                       if k not in ("memory_fraction", "fsdp_accumulate_fraction")})
    assert fsdp_update_time(1.0, 1, trainer_dp_schedule(0, 1, False), 1, plain) == pytest.approx(
        28 / (bw * prof.efficiency.memory_bound) + 28 / (bw * 0.5))
    assert fsdp_update_time(1.0, 1, trainer_dp_schedule(0, 2, False), 2, plain) == pytest.approx(
        28 / (bw * prof.efficiency.memory_bound) + (2 * 10 + 18) / (bw * 0.5) + 18 / (bw * 0.5))


def test_a_gemm_on_fp32_inputs_runs_at_the_fp32_rate():
    """GPT-J upcasts its attention scores' operands to fp32 before the product: in a bf16 model that GEMM runs
    on the fp32 units (no TF32 by default) at the calibrated fp32 fraction of the fp32 peak, 1/15 of the bf16
    rate on an H200 (s34: GPT-J's steps were predicted 18-22% fast at the bf16 rate), its curve's fixed time
    (half-size over peak x maximum) the bf16 curve's: a tiny GEMM is the kernel's latency on either units (s96:
    Qwen3-Next's small fp32 bmms took 14 us, the bf16 half-size said 39). In an fp32 model every GEMM is such a
    one and keeps the plain curve."""
    from cost_models.compute import classify_node
    from hardware_profiles import load_profile
    profile = load_profile("h200")
    node = {"op": "aten.bmm.default", "out_shapes": [(64, 2048, 2048)], "flops": 2.0 * 64 * 2048 * 2048 * 256,
            "out_dtypes": ["float32"]}
    assert classify_node(node) == CLASS_CODE["gemm_fp32"]
    assert classify_node({**node, "out_dtypes": ["bfloat16"]}) == CLASS_CODE["gemm"]
    f, moved, mm = np.array([node["flops"]]), np.array([0.0]), np.array([True])
    eff = profile.efficiency
    fraction = profile.calibration["gemm_best_fraction_by_dtype"]["fp32"]
    fixed = eff.gemm_half_flops / (profile.peak("bf16") * eff.gemm_max)  # the bf16 curve's fixed time [s]
    expected = f[0] / (profile.peak("fp32") * fraction) + fixed + eff.kernel_overhead_s
    t32 = op_times(f, moved, mm, profile, "bf16", np.array([CLASS_CODE["gemm_fp32"]]))[0]
    assert t32 == pytest.approx(expected, rel=1e-12)
    t16 = op_times(f, moved, mm, profile, "bf16", np.array([CLASS_CODE["gemm"]]))[0]
    assert t32 / t16 > 10
    tiny = np.array([1e3])  # no work: both classes cost the same kernel latency
    t32_tiny, t16_tiny = (op_times(tiny, moved, mm, profile, "bf16", np.array([CLASS_CODE[c]]))[0]
                          for c in ("gemm_fp32", "gemm"))
    assert t32_tiny == pytest.approx(t16_tiny, rel=1e-3)
    fp32_model = [op_times(f, moved, mm, profile, "fp32", np.array([CLASS_CODE[c]]))[0] for c in ("gemm_fp32", "gemm")]
    assert fp32_model[0] == fp32_model[1]


def test_a_depthwise_convolution_moves_its_bytes_at_its_own_fraction():
    """PyTorch's depthwise kernels (conv_depthwise2d) run a short convolution bandwidth-bound at
    memory_fraction.conv_depthwise of the bandwidth (calibrate's kernel family on an H200: 0.0551), not on the
    GEMM curve every other convolution takes. Qwen3-Next's (4 x 8192 channels x 2051, kernel 4; s96) had 0.71 ms
    of its own kernels' time forward (self time, without its input's contiguous copy), where the GEMM curve said
    0.13: the class prices it above that floor."""
    from hardware_profiles import load_profile
    profile = load_profile("h200")
    flops = np.array([2.0 * 4 * 8192 * 2051 * 4])
    moved = np.array([2.0 * 4 * 8192 * 2051 * 2 + 8192 * 4 * 2])  # bf16 input and output, the weight
    mm = np.array([True])
    depthwise = op_times(flops, moved, mm, profile, "bf16", np.array([CLASS_CODE["conv_depthwise"]]))[0]
    fraction = profile.calibration["memory_fraction"]["conv_depthwise"]
    assert depthwise == pytest.approx(moved[0] / (profile.memory_bandwidth * fraction)
                                      + profile.efficiency.kernel_overhead_s, rel=1e-9)
    assert depthwise > 0.71e-3  # no faster than the kernels' own time in the profiled step
    assert op_times(flops, moved, mm, profile, "bf16", np.array([CLASS_CODE["gemm"]]))[0] < 0.3 * depthwise


def test_a_gemm_is_priced_by_the_alignment_its_dims_allow():
    """An LM head of an even vocabulary that is not a multiple of 8 (OLMo 3's 100278) runs 2-element-aligned
    kernels at 0.279 of an H200's peak, an odd one (GPT-2's 50257) 1-element-aligned ones at about half that,
    an aligned one at 0.70 (benchmarks/gemm_alignment.py): three classes. A profile without gemm_align2_max
    prices the even ones as before, at gemm_unaligned_max."""
    from cost_models.compute import _class_tables

    tokens, hidden = 16384, 4096
    flops = {v: 2.0 * tokens * v * hidden for v in (100278, 100276, 50257, 100280)}
    kinds = {v: classify("aten.mm.default", [(tokens, v)], f) for v, f in flops.items()}
    assert kinds == {100278: CLASS_CODE["gemm_align2"], 100276: CLASS_CODE["gemm_align2"],
                     50257: CLASS_CODE["gemm_unaligned"], 100280: CLASS_CODE["gemm"]}
    h200 = load_profile("h200")
    peak_max, _, _ = _class_tables(h200, "bf16")
    assert peak_max[CLASS_CODE["gemm_align2"]] == h200.calibration["gemm_align2_max"]
    without = replace(h200, calibration={k: v for k, v in h200.calibration.items() if k != "gemm_align2_max"})
    peak_max, _, _ = _class_tables(without, "bf16")
    assert peak_max[CLASS_CODE["gemm_align2"]] == peak_max[CLASS_CODE["gemm_unaligned"]]
    f = np.array([flops[100278], flops[50257]])
    times = op_times(f, np.zeros(2), np.ones(2, dtype=bool), h200, "bf16",
                     op_class=np.array([CLASS_CODE["gemm_align2"], CLASS_CODE["gemm_unaligned"]]))
    # per FLOP the odd GEMM takes 0.279 / 0.126 as long, less the curves' size terms (these GEMMs are ~10 TFLOP,
    # far past the half-size, so within a few percent of the maxima's ratio)
    ratio = (times[1] / f[1]) / (times[0] / f[0])
    assert abs(ratio / (0.279 / 0.126) - 1) < 0.05, ratio


@pytest.mark.parametrize("model", ["hf-gpt2-eager", "tiny-llama"])
def test_an_eager_attention_backward_holds_two_seq_by_seq_gradients(model):
    """A block's backward working set: eager attention's softmax backward holds the gradient of the
    probabilities while it makes the gradient of the scores, two [b, heads, s, s] tensors in the compute dtype
    (the tests' tiny Hugging Face GPT-2, hf_helpers, with eager attention: 2 x 2 x 8 x 64 x 64 x 2 B), on top of
    what a mode rematerializes (full: the block's saved set); the catalog llama's fused attention keeps none."""
    import torch
    seq, b, heads = 64, 2, 8
    if model == "hf-gpt2-eager":
        transformers = pytest.importorskip("transformers")
        import hf_helpers

        config = hf_helpers.config("gpt2")
        assert (config.n_head, config.n_positions) == (heads, seq)
        with torch.device("meta"):
            module = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        ctx = context(module, "h200", 1, seq)
    else:
        ctx = context(model, "h200", 1, seq)
    cm = ctx.cost_model
    plan = Plan(model=model, hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=seq, micro_batch=b)
    placements = cm.placements_for(plan)
    key, block = cm.segments_key(placements, False), cm.block_rep(0)
    cm.segments(placements, False)
    cost = {rc: cm.segment_cost(key, block, 1, 1, False, b, rc, "intra", "intra") for rc in ("none", "full")}
    expected = 2 * b * heads * seq * seq * 2 if model == "hf-gpt2-eager" else 0.0
    assert cost["none"].working_bytes == pytest.approx(expected, rel=1e-9)
    assert cost["full"].working_bytes == pytest.approx(cost["none"].act_bytes + expected, rel=1e-9)


@pytest.mark.parametrize("excess", [0.5, 2.0])
def test_a_blocks_host_lead_from_its_forward_carries_into_its_backward(excess):
    """Nothing synchronizes between a block's forward and its backward, so a GPU-bound forward leaves the host
    ahead by its kernels less its host work, and a host-bound backward waits that much less
    (estimate.carry_forward_lead). With the per-op host rates set so that the forward's host is half its kernels
    (a lead L of half the forward) and the backward's host is its kernels plus `excess` x L, the backward takes
    its kernels where the lead covers the excess (0.5) and its host less L where it does not (2.0); the
    forward keeps its kernels' time either way."""
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    ctx = context("tiny-llama", "h200", 1, 128)
    kernels = _kernels_only(ctx.cluster.profile)
    plan = Plan(model="tiny-llama", hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=128)

    def block_cost(profile):
        cm = cost_model(ctx.graph, make_cluster(profile, 1))
        key = cm.segments_key(cm.placements_for(plan), False)
        seg = cm.segments(cm.placements_for(plan), False)[cm.block_rep(0)]
        return seg, cm.segment_cost(key, cm.block_rep(0), 1, 1, False, 4, "none", "intra", "intra")

    seg, gpu = block_cost(kernels)
    n_fwd, n_bwd = len(seg.fwd.flops), len(seg.bwd.flops)
    lead = gpu.fwd_s / 2
    host_bwd = gpu.bwd_s + excess * lead
    rates = [gpu.fwd_s / 2 / n_fwd * 1e6, host_bwd / n_bwd * 1e6]
    _, cost = block_cost(replace(kernels, calibration={**kernels.calibration, "host_us_per_op_fwd_bwd": rates}))
    assert cost.fwd_s == pytest.approx(gpu.fwd_s, rel=1e-9)
    assert cost.bwd_s == pytest.approx(max(gpu.bwd_s, host_bwd - lead), rel=1e-9)
    assert cost.idle_s == pytest.approx(max(0.0, host_bwd - lead - gpu.bwd_s), rel=1e-9, abs=1e-12)
