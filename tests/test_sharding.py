"""Sharding solver (issue 5): per-op placements from the operator graph, for any model.

The Megatron layout is never given to the solver: the tests check that its ILP finds it on gpt and
llama blocks of realistic width, that it does NOT shard where tensor parallelism cannot pay (tiny
widths), that every placement it returns is legal for unseen models, that the ILP's optimum equals
exhaustive enumeration, and that the planner's cost model rates its placements no slower than the
fixed Megatron rule."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.api import context, make_cluster, trace_model
from autoparallel.errors import UserError
from autoparallel.placements import megatron_placements
from autoparallel.plan import PLACEMENTS, Plan
from autoparallel.report import explain_op
from autoparallel.sharding import (
    ENDS,
    ShardingSolver,
    _evaluate,
    _violates,
    block_tp_cost,
    explain_choices,
    solve_placements,
)
from autoparallel.specs import load_model_spec
from autoparallel.tracer import trace

SEQ = 1024


def _spec(**cfg):
    return load_model_spec(cfg)


@pytest.fixture(scope="module")
def h100():
    return make_cluster("h100-sxm", 8)


@pytest.fixture(scope="module")
def llama():  # llama3-8b widths, two layers (tracing is per layer; widths cost nothing on meta)
    return trace(_spec(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=8192, tie_word_embeddings=False), seq_len=SEQ)


@pytest.fixture(scope="module")
def gpt():  # gpt3-1.3b widths, GPT-2's odd vocabulary (50257) and tied embeddings
    return trace(_spec(model_type="gpt2", vocab_size=50257, n_positions=2048, n_embd=2048, n_layer=2,
                       n_head=16), seq_len=SEQ)


@pytest.fixture(scope="module")
def mixtral():
    return trace(_spec(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                       num_experts_per_tok=2, max_position_embeddings=4096, tie_word_embeddings=False),
                 seq_len=SEQ)


def _rel(placements: dict[str, str], block: str) -> dict[str, str]:
    return {k[len(block) + 1:]: v for k, v in placements.items() if k.startswith(block + ".")}


def _assert_legal(graph, placements: dict[str, str], tp: int) -> None:
    """Every parametric op has a plan value, and each sharding divides what it shards."""
    assert set(placements) == set(graph.parametric_ops)
    assert set(placements.values()) <= set(PLACEMENTS)
    for path, v in placements.items():
        op = graph.parametric_ops[path]
        if v == "colwise":
            assert op.kind == "linear"
            assert op.out_features % tp == 0 or path == "lm_head", path
        elif v == "rowwise":
            assert op.kind == "linear" and op.in_features % tp == 0, path
        elif v == "vocab":
            assert op.kind == "embedding", path
        elif v == "sequence":
            assert op.kind == "norm", path
        elif v == "expert":
            assert op.kind == "experts", path


# ---------------------------------------------------------------- Megatron rediscovered
@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_llama_block_rediscovers_megatron(llama, h100, tp, sp):
    pl = solve_placements(llama, h100, tp, sp)
    norm = "sequence" if sp else "replicate"
    expected = {"attn_norm": norm, "attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
                "attn.o_proj": "rowwise", "mlp_norm": norm, "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                "mlp.down_proj": "rowwise"}
    for block in llama.blocks:  # identical blocks get the same relative layout
        assert _rel(pl, block) == expected
    assert pl["tok_embeddings"] == "vocab" and pl["lm_head"] == "colwise" and pl["norm"] == norm
    _assert_legal(llama, pl, tp)


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_gpt_block_rediscovers_megatron(gpt, h100, tp, sp):
    pl = solve_placements(gpt, h100, tp, sp)
    norm = "sequence" if sp else "replicate"
    assert _rel(pl, "layers.1") == {
        "attn_norm": norm, "attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
        "attn.o_proj": "rowwise", "mlp_norm": norm, "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}
    # the 50257-row vocabulary shards unevenly; the tied LM head shards the same (row) dim of that table
    assert pl["tok_embeddings"] == "vocab" and pl["lm_head"] == "colwise"
    # positions are looked up by arange, not token ids: the table stays whole
    assert pl["pos_embeddings"] == "replicate"


@pytest.mark.parametrize("sp", [False, True])
def test_moe_block_shards_experts_and_keeps_the_router_whole(mixtral, h100, sp):
    pl = solve_placements(mixtral, h100, 4, sp)
    rel = _rel(pl, "layers.0")
    assert rel["mlp.experts"] == "expert"
    # the router could be colwise (8 experts % 4 == 0); its logits feed top-k over all experts, so
    # the solver keeps it whole
    assert rel["mlp.router.gate"] == "replicate"
    assert [rel[f"attn.{p}_proj"] for p in "qkvo"] == ["colwise"] * 3 + ["rowwise"]
    assert rel["mlp_norm"] == ("sequence" if sp else "replicate")


def test_tiny_widths_stay_replicated_because_tp_cannot_pay(h100):
    """hidden 64: a block's GEMMs take microseconds, an all-reduce's latency alone is 2(t-1) x 3 us, so
    the solver replicates; forcing the Megatron layout costs more under its own model."""
    g = trace_model("tiny-llama", seq_len=64)
    solver = ShardingSolver(g, h100)
    pl = solver.placements(4, False)
    assert {v for k, v in pl.items() if k.startswith("layers.")} == {"replicate"}
    # without SP the mode names of the Megatron layout are its placement values
    meg = {k: v for k, v in megatron_placements(g, False).items() if k.startswith("layers.0.")}
    assert "colwise" in meg.values()
    forced = solver.solve_segment("layers.0", 4, False, fixed=meg)
    best = solver.solve_segment("layers.0", 4, False)
    assert forced.cost_s > best.cost_s


# ---------------------------------------------------------------- legality
def test_gqa_kv_heads_that_do_not_divide_stay_whole(h100):
    g = trace(_spec(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4,
                    max_position_embeddings=4096), seq_len=SEQ)
    pl = solve_placements(g, h100, 8, False)
    rel = _rel(pl, "layers.0")
    assert rel["attn.k_proj"] != "colwise" and rel["attn.v_proj"] != "colwise"
    assert rel["mlp.gate_proj"] == "colwise" and rel["mlp.down_proj"] == "rowwise"
    _assert_legal(g, pl, 8)
    ctx = context(g, "h100-sxm", 8, SEQ, graph=g)
    plan = Plan(model="m", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=SEQ, tp=8,
                placements=pl)
    text = explain_choices(ctx, plan, "layers.1.attn.k_proj")
    assert "4 attention heads, not divisible by tp=8" in text
    assert "colwise op in layers.1.attn" in text  # spoken of in the op's own block


class _MHABlock(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class _ViTAttention(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.h, self.qkv, self.proj = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class _ViTBlock(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = _ViTAttention(d, h)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class _Net(nn.Module):
    """Patch embedding (a Linear), three blocks, a classification head."""

    def __init__(self, block: type, d: int = 1024, h: int = 16, layers: int = 3, patch: int = 768):
        super().__init__()
        self.patch = nn.Linear(patch, d)
        self.blocks = nn.ModuleList([block(d, h) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 1000)

    def forward(self, x):
        x = self.patch(x)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(1))


class _OddMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(64, 37), nn.Linear(37, 4096), nn.Linear(4096, 64)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


@pytest.fixture(scope="module")
def user_graphs():
    x = torch.randn(8, 256, 768)
    return {"mha": trace(_Net(_MHABlock), example_inputs=x, model_name="mha"),
            "vit": trace(_Net(_ViTBlock), example_inputs=x, model_name="vit"),
            "odd": trace(_OddMLP(), example_inputs=torch.randn(64, 512, 64), model_name="odd")}


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_unseen_models_get_legal_costed_placements(user_graphs, h100, tp, sp):
    for name, g in user_graphs.items():
        solver = ShardingSolver(g, h100)
        pl = solver.placements(tp, sp)
        _assert_legal(g, pl, tp)
        costs = solver.segment_costs(tp, sp)
        assert all(0 < c < 1 for c in costs.values()), (name, costs)
        if name == "mha":
            # nn.MultiheadAttention computes with its own in_proj and out_proj weights inside one op:
            # neither can be sharded on its own
            assert pl["blocks.0.attn"] == pl["blocks.0.attn.out_proj"] == "replicate"
            assert (pl["blocks.1.fc1"], pl["blocks.1.fc2"]) == ("colwise", "rowwise")
        elif name == "vit":
            assert pl["blocks.0.attn.qkv"] == "replicate"   # fused q/k/v: splitting rows would mix them
            assert (pl["blocks.2.fc1"], pl["blocks.2.fc2"]) == ("colwise", "rowwise")
        else:
            assert pl["l1"] != "colwise" and pl["l2"] != "rowwise"  # 37 is not divisible
            assert (pl["l2"], pl["l3"]) == ("colwise", "rowwise")


def test_unseen_model_explains_its_choices(user_graphs):
    g = user_graphs["odd"]
    ctx = context(g, "h100-sxm", 4, 512, graph=g)
    plan = Plan(model="odd", hardware="h100-sxm", gpus=4, gpus_per_node=8, global_batch=4, seq_len=512, tp=4,
                placements=solve_placements(g, ctx.cluster, 4, False))
    text = explain_op(ctx, plan, "l1")   # the CLI's `plan --explain` path
    assert "out_features=37 is not divisible by tp=4" in text
    assert "<- plan" in text and "replicate" in text
    with pytest.raises(UserError, match="not a parametric op"):
        explain_op(ctx, plan, "l9")


# ---------------------------------------------------------------- the ILP is exact
def _brute_force(solver: ShardingSolver, name: str, tp: int, sp: bool) -> float:
    seg, modes, _illegal, costs = solver.problem(name, tp, sp, 1)
    best = float("inf")
    for combo in itertools.product(*modes):
        assign = dict(enumerate(combo))
        if not _violates(seg, assign):
            best = min(best, _evaluate(seg, assign, costs)["total_s"])
    return best


@pytest.mark.parametrize("model,tp,sp", [("tiny-llama", 2, False), ("tiny-gpt", 2, True), ("tiny-gpt", 4, False)])
def test_ilp_optimum_equals_exhaustive_enumeration(h100, model, tp, sp):
    g = trace_model(model, seq_len=64)
    solver = ShardingSolver(g, h100)
    for name in solver.segment_names():
        sol = solver.solve_segment(name, tp, sp)
        assert sol.status == "OPTIMAL"
        assert sol.cost_s == pytest.approx(_brute_force(solver, name, tp, sp), rel=1e-6, abs=1e-9)


def test_gpt_ilp_optimum_on_a_real_width_block(gpt, h100):
    solver = ShardingSolver(gpt, h100)
    sol = solver.solve_segment("layers.0", 4, True)
    assert sol.cost_s == pytest.approx(_brute_force(solver, "layers.0", 4, True), rel=1e-6)


# ---------------------------------------------------------------- reuse, degrees, budget, errors
def test_one_solve_per_block_class_and_tp1_shards_nothing(llama, h100):
    solver = ShardingSolver(llama, h100)
    pl = solver.placements(8, True)
    assert set(solver._segments) == {"layers.0", ENDS}     # two identical blocks: one problem
    assert _rel(pl, "layers.0") == _rel(pl, "layers.1")
    assert set(solver.placements(1, True).values()) == {"replicate"}
    costs = block_tp_cost(llama, h100, 8, True, solver=solver)
    assert costs["layers.0"] < block_tp_cost(llama, h100, 2, True, solver=solver)["layers.0"]


def test_memory_budget_forces_sharding(h100):
    g = trace_model("tiny-llama", seq_len=64)
    free = ShardingSolver(g, h100).solve_segment("layers.0", 4, False)
    assert {m.placement for m in free.modes.values()} == {"replicate"}
    block_params = sum(op.param_count for op in g.parametric_ops.values() if op.block == "layers.0")
    tight = ShardingSolver(g, h100, memory_budget_bytes=block_params * 2 / 2)  # half the bf16 weights
    sol = tight.solve_segment("layers.0", 4, False)
    assert sol.cost_s > free.cost_s
    assert sum(m.split_params for m in sol.modes.values()) >= 4


def test_bad_degree_is_a_user_error(llama, h100):
    with pytest.raises(UserError, match="tp=0"):
        solve_placements(llama, h100, 0, False)


# ---------------------------------------------------------------- never slower than the fixed rule
CATALOG_SAMPLE = ["gpt2", "gpt3-350m", "llama3-8b", "qwen2.5-7b", "mixtral-8x7b", "tiny-gpt", "tiny-llama",
                  "tiny-moe"]


@pytest.mark.parametrize("name", CATALOG_SAMPLE)
def test_step_time_not_above_megatron_layout(name):
    """At a fixed plan (tp x dp=1, one micro-batch), CostModel.estimate with the solver's placements is
    <= with megatron_placements, for every legal tp in {2, 4, 8}, with and without SP (the benchmark
    benchmarks/sharding_speed.py runs the whole catalog)."""
    seq = 128 if name == "tiny-gpt" else 512  # tiny-gpt has 128 learned positions
    g = trace_model(name, seq_len=seq)
    checked = 0
    for tp in (2, 4, 8):
        ctx = context(name, "h100-sxm", tp, seq, graph=g)
        heads, kv = ctx.cost_model.heads, ctx.cost_model.kv_heads
        if (heads and heads % tp) or (kv and kv % tp):
            continue
        # priced with the estimate's own update cost (the runtime the cost model describes)
        solver = ShardingSolver(g, ctx.cluster, update_rate=ctx.cost_model.update_rate_per_micro_batch)
        # SP needs the vocabulary to divide tp (the trainer runs replicated vocab ends only without SP)
        for sp in (False, True) if ctx.cost_model.vocab_splits_evenly(tp) else (False,):
            plan = Plan(model=name, hardware="h100-sxm", gpus=tp, gpus_per_node=8, global_batch=1, seq_len=seq,
                        tp=tp, sequence_parallel=sp, recompute=("none",) * len(g.blocks))
            ours = ctx.cost_model.estimate(replace(plan, placements=solver.placements(tp, sp)))
            fixed = ctx.cost_model.estimate(replace(plan, placements=megatron_placements(g, sp)))
            assert ours.step_time_s <= fixed.step_time_s * (1 + 1e-9), (tp, sp)
            checked += 1
    assert checked >= 2


def test_cost_model_gathers_a_colwise_output_consumed_whole(user_graphs):
    """cost_models.segments: a colwise patch embedding's output is all-gathered before it leaves the
    model's first segment, so the replicated nn.MultiheadAttention blocks after it are costed whole
    (before, the sharded flag leaked through every later op and the whole network ran at 1/tp)."""
    g = user_graphs["mha"]
    ctx = context(g, "h100-sxm", 4, 256, graph=g)
    pl = {p: "replicate" for p in g.parametric_ops}
    segs_rep = ctx.cost_model.segments(pl, False)
    segs_col = ctx.cost_model.segments(dict(pl, patch="colwise"), False)
    block = g.blocks[0]
    assert not segs_col[block].fwd.tp_sharded.any() and not segs_col[block].bwd.tp_sharded.any()
    assert segs_col["pre"].tp_gather_bytes and not segs_rep["pre"].tp_gather_bytes
    # the patch output [8, 256, 1024] bf16 of the traced batch, per graph.batch
    assert segs_col["pre"].tp_gather_bytes[0] == pytest.approx(8 * 256 * 1024 * 2 / g.batch)
