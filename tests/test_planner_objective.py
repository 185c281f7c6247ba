"""The planner's own models price a plan exactly as CostModel.estimate does (issue 12): for random dense,
MoE (ep > 1) and mixed-block models, the MIP's objective for the plan it picked equals `estimate` of that
plan, and the per-rank memory the planner's constraints add up equals the estimate's per-stage memory.

Tolerances: the uniform-block model (CBC) works in float seconds, so only float summation order
separates it from `estimate`: 1e-9 relative. The mixed-class model (CP-SAT) works in integers of
1/RESOLUTION of the step's scale; each of its rounded terms is off by half a unit. Per block: its time;
in the binding row of the data-parallel term at most three (its gradient sync, its backward cover scaled
by 1 - kappa and its GPU idle time: comm.dp_overlap_cost's last piece); its update, and in the optimizer
term's second constraint its FSDP meetings and its lead (CostModel.tail_host_time): 7 per block, plus ~8
for the ends and per-step terms, so |objective - estimate| <= (7L + 8) * 0.5 / ns, which the test
computes from the model's own scale (6L + 8 before the overlap interference, 4L + 8 before the optimizer
term carried the meetings less the lead)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoparallel.api import context
from autoparallel.planner import ALLOCATOR_RESERVE, MeshConfig, Planner
from autoparallel.specs import load_model_spec
from autoparallel.tracer import trace
from cost_models.estimate import RuntimeVariant, in_flight_micro_batches
from cost_models.host import HELD_TERMS, HOST_TERMS
from hardware_profiles import load_profile


def _profile():
    """h100-sxm with every trainer host term set (cost_models.host), so the planner's models must carry
    each of them as estimate does: FSDP hooks, checkpoint regions, SAC/DTensor dispatch, pipeline
    actions, EP read-backs, the per-step work and per-op checkpointing's per-tensor work."""
    base = load_profile("h100-sxm")
    return dataclasses.replace(base, calibration={**base.calibration, **{k: 50.0 + 10 * i
                                                                           for i, k in enumerate(HOST_TERMS + HELD_TERMS)}})


def _spec(kind: str, layers: int, heads: int, inter: int):
    base = {"vocab_size": 256, "hidden_size": heads * 16, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "max_position_embeddings": 4096,
            "intermediate_size": inter}
    if kind == "dense":
        return load_model_spec({"model_type": "llama", **base})
    moe = {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": inter,
           "shared_expert_intermediate_size": 0, "norm_topk_prob": False}
    if kind == "mixed":  # dense and MoE blocks: two block classes, the CP-SAT model
        moe["mlp_only_layers"] = [0]
    return load_model_spec({**base, **moe})


def _planner_memory(sm, d: int, plan) -> float:
    """Bytes on rank d of `plan` as the planner's constraints count them (fixed_memory + per-block states
    and in-flight activations + the largest working set or the logits floor; or, where larger, the end of the
    backward's reduce_fixed + per-block states with gradients), plus the allocator reserve."""
    cm, cfg = sm.cm, sm.cfg
    infl = in_flight_micro_batches(d, cfg.pp, cfg.vpp, sm.m)
    total, working, end = sm.fixed_memory(d), sm.logits_floor(d), sm.reduce_fixed(d)
    for v, seg_list in enumerate(cm.virtual_stage_segments(plan)):
        if v % cfg.pp != d:
            continue
        for name, rc, *_ in seg_list:
            if name in ("pre", "post"):
                continue
            cls = next(c for c in sm.classes if sm.rep[c] == name)
            cost = sm.cost(name, rc)
            total += sm.block_memory(cls) + infl * cost.act_bytes
            working = max(working, cost.working_bytes)
            end += sm.block_end_memory(cls)
    return max(total + working, end) * (1 + ALLOCATOR_RESERVE)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["dense", "moe", "mixed"]), layers=st.integers(2, 4), heads=st.sampled_from([2, 4]),
       inter=st.sampled_from([32, 64]), pp=st.sampled_from([1, 2, 4]), batch=st.sampled_from([4, 8]),
       squeeze=st.floats(0.3, 1.0), clip=st.booleans())
@example(kind="dense", layers=4, heads=2, inter=32, pp=4, batch=8, squeeze=1.0, clip=True)   # the CBC path, for sure
@example(kind="mixed", layers=4, heads=2, inter=32, pp=4, batch=8, squeeze=0.6, clip=False)  # CP-SAT at pp = 4
def test_planner_objective_and_memory_equal_estimate(kind, layers, heads, inter, pp, batch, squeeze, clip):
    # pp <= 2: the uniform model enumerates its assignments; pp = 4: it solves the MIP (CBC)
    layers = max(layers, pp)
    spec = _spec(kind, layers, heads, inter)
    ep = 2 if kind != "dense" else 1
    gpus = 4 if pp * ep <= 4 else 8
    # eager plans only: the compiled blocks' partition (most of a small model's trace time) is not read
    # clip: the trainer's max_grad_norm, priced in the optimizer term the planner reads per block
    ctx = context(spec, _profile(), gpus, 512, gpus_per_node=gpus, graph=trace(spec, batch=1, seq_len=512,
                  dtype=torch.bfloat16, compiled_saved=False), variant=RuntimeVariant(clip_grad_norm=clip))
    dp = gpus // (pp * ep)
    cfg = MeshConfig(1, pp, dp, ep, 1, batch // (dp * ep), 2, False, "fp32")
    probe = Planner(ctx.graph, ctx.cluster, batch, 512, None, cost_model=ctx.cost_model)
    full = probe.base_plan(cfg)
    footprint = ctx.cost_model.estimate(full.__class__(**{**full.__dict__, "recompute": ("none",) * layers}))
    budget = squeeze * footprint.peak_memory_gib * 2**30
    planner = Planner(ctx.graph, ctx.cluster, batch, 512, budget, cost_model=ctx.cost_model,
                      fix={"pp": pp, "ep": ep, "dp": dp, "zero": 2, "micro_batch": cfg.micro_batch})
    sm = planner._stage_model(cfg)
    plan = sm.solve() if sm.memory_may_fit() else None
    if plan is None:
        return  # nothing fits this budget: no objective to compare (rare: full recompute frees >70%)
    est = ctx.cost_model.estimate(plan, budget)
    assert est.fits
    if len(sm.classes) == 1:
        assert sm.objective == pytest.approx(est.step_time_s, rel=1e-9)
    else:
        assert kind == "mixed"
        assert abs(sm.objective - est.step_time_s) <= (7 * layers + 8) * 0.5 / sm.ns
    for d in range(pp):
        assert _planner_memory(sm, d, plan) == pytest.approx(est.memory_per_stage_gib[d] * 2**30, rel=1e-9)
    # the search prunes a configuration on lower_bound (its pipeline term and sync_bound, which for mixed classes
    # sums add_data_parallel's per-block coefficients): at most the step of any plan of it, this one's included
    tol = 1e-9 * est.step_time_s if len(sm.classes) == 1 else (7 * layers + 8) * 0.5 / sm.ns
    assert planner.lower_bound(cfg) <= est.step_time_s + tol
    if len(sm.classes) > 1:  # and the memory-aware LP bound the search prunes mixed classes on
        assert sm.mixed_relaxed_bound() <= est.step_time_s + tol
    b = est.breakdown  # sync_bound: at most the plan's data-parallel exposure, interference and optimizer terms
    assert sm.sync_bound() <= b["dp_comm_exposed_s"] + b["dp_interference_s"] + b["optimizer_s"] + tol
