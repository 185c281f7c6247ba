"""Hugging Face causal LMs in the tracer, the sharding solver and the Megatron rule (transformers
required): op-level traces on the meta device with FLOPs equal to a formula count, token mixing
decided by the graph (hidden_size == seq_len is no special case), and the column -> row layout on
separate, fused (Phi-3) and qk-normed (Qwen3) projections."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import hf_helpers as HF  # noqa: E402

from autoparallel.api import make_cluster  # noqa: E402
from autoparallel.errors import UserError  # noqa: E402
from autoparallel.placements import megatron_placements  # noqa: E402
from autoparallel.sharding import ENDS, ShardingSolver  # noqa: E402
from autoparallel.tracer import trace  # noqa: E402


def _matmul_params(model: nn.Module) -> int:
    """Weights each token multiplies by in the forward: Linear / Conv1D, the router and top_k of E experts."""
    c, n = model.config, 0
    for mod in model.modules():
        cls = type(mod).__name__
        if isinstance(mod, nn.Linear) or cls == "Conv1D" or cls.endswith("TopKRouter"):
            n += mod.weight.numel()
        elif cls.endswith("Experts"):
            n += sum(p.numel() for p in mod.parameters()) * c.num_experts_per_tok // mod.gate_up_proj.shape[0]
    return n


@pytest.mark.parametrize("name", HF.MODELS)
def test_trace_is_op_level_with_formula_flops(name):
    """use_cache=False (a training config) sends transformers' own forward into its packed-sequence
    check (`.all()` on a meta tensor); the tracer runs the training forward instead, op-level, and
    leaves the user's module alone. FLOPs: forward 2*tokens*matmul weights + 4*b*s^2*heads*head_dim
    per layer (scores and weighted sum); backward twice the GEMMs and 2.5x attention (the flash
    backward's five matmuls against the forward's two)."""
    model = HF.build(name)
    model.config.use_cache = False
    b, s = 2, 64
    g = trace(model, batch=b, seq_len=s)
    assert not g.module_level and not g.warnings, g.warnings
    assert "forward" not in vars(model)
    c = model.config
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    gemm = 2 * b * s * _matmul_params(model)
    attn = 4 * b * s * s * heads * head_dim * c.num_hidden_layers
    assert abs(g.forward_flops / (gemm + attn) - 1) <= 0.02, (g.forward_flops, gemm + attn)
    assert abs(g.backward_flops / (2 * gemm + 2.5 * attn) - 1) <= 0.02, (g.backward_flops, 2 * gemm + 2.5 * attn)


def _llama(hidden: int, vocab: int = 256) -> nn.Module:
    import transformers as T

    cfg = T.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                        num_attention_heads=max(4, hidden // 128), num_key_value_heads=max(4, hidden // 128),
                        use_cache=False)
    with torch.device("meta"):
        return T.AutoModelForCausalLM.from_config(cfg)


def test_token_mixing_is_decided_by_the_graph_not_by_sizes():
    """hidden_size == seq_len: the [1, s, h] ops of a hand-written RMSNorm and the head merge
    [b, s, n, d] -> [b, s, n*d] carry two sequence-sized dims without mixing tokens."""
    flags = {}
    for seq in (64, 32):
        solver = ShardingSolver(trace(_llama(64), batch=1, seq_len=seq), make_cluster("h100-sxm", 8))
        flags[seq] = {name: solver.segment(name).mixing for name in ("model.layers.0", ENDS)}
    assert flags[64] == flags[32]
    assert sum(flags[64]["model.layers.0"]) == 1  # attention, and only attention


def _wide(name: str) -> nn.Module:
    """A 2-layer model of the family at a realistic width (hidden 2048, 16 heads of 128, GQA 8 kv heads)."""
    import transformers as T

    kw = dict(vocab_size=32000, hidden_size=2048, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=16,
              num_key_value_heads=8, max_position_embeddings=4096, use_cache=False)
    moe = dict(num_experts_per_tok=2)
    cfg = {"llama": lambda: T.LlamaConfig(**kw), "qwen2": lambda: T.Qwen2Config(**kw),
           "gemma": lambda: T.GemmaConfig(**kw, head_dim=128),
           "phi3": lambda: T.Phi3Config(**kw, pad_token_id=0, bos_token_id=1, eos_token_id=2),
           "mixtral": lambda: T.MixtralConfig(**kw, num_local_experts=4, **moe),
           "qwen3moe": lambda: T.Qwen3MoeConfig(**kw, moe_intermediate_size=1024, num_experts=4, head_dim=128, **moe),
           "gpt2": lambda: T.GPT2Config(vocab_size=32000, n_embd=2048, n_layer=2, n_head=16, n_positions=4096,
                                        use_cache=False)}[name]()
    with torch.device("meta"):
        return T.AutoModelForCausalLM.from_config(cfg)


# Megatron's roles per family, block-relative: (column-parallel, row-parallel). The fused projections
# (Phi-3's qkv_proj / gate_up_proj, GPT-2's c_attn) are column-parallel piece by piece; GPT-2's Conv1D
# stores its weight transposed; MoE MLPs are expert groups.
_ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
ROLES = {
    **{m: (_ATTN + ("mlp.gate_proj", "mlp.up_proj"), ("self_attn.o_proj", "mlp.down_proj"))
       for m in ("llama", "qwen2", "gemma")},
    **{m: (_ATTN, ("self_attn.o_proj",)) for m in ("mixtral", "qwen3moe")},
    "phi3": (("self_attn.qkv_proj", "mlp.gate_up_proj"), ("self_attn.o_proj", "mlp.down_proj")),
    "gpt2": (("attn.c_attn", "mlp.c_fc"), ("attn.c_proj", "mlp.c_proj")),
}


@pytest.mark.parametrize("name", HF.MODELS)
def test_plan_puts_megatron_layout_on_realistic_hf_models(name):
    """`plan` of each family at hidden 2048, tp pinned to 2: column -> row on attention and MLP of every
    block, vocab-parallel embedding, column-parallel head, experts expert-placed. Llama at seq_len 2048
    = hidden (token mixing decided by the graph, not by sizes)."""
    import autoparallel

    model = _wide(name)
    plan = autoparallel.plan(model, hardware="h100-sxm", gpus=8, global_batch=64,
                             seq_len=2048 if name == "llama" else 1024, max_memory_per_gpu="80GB", fix={"tp": 2})
    cols, rows = ROLES[name]
    prefix = "transformer.h" if name == "gpt2" else "model.layers"
    for i in range(2):
        block = {k.removeprefix(f"{prefix}.{i}."): v for k, v in plan.placements.items()
                 if k.startswith(f"{prefix}.{i}.")}
        assert all(block[c] == "colwise" for c in cols) and all(block[r] == "rowwise" for r in rows), block
        assert all(v == "expert" for k, v in block.items() if k.endswith("experts")), block
    embed = "transformer.wte" if name == "gpt2" else "model.embed_tokens"
    assert plan.placements[embed] == "vocab" and plan.placements["lm_head"] == "colwise"


def test_megatron_rule_on_fused_and_qk_normed_projections():
    """Fused projections whose pieces the tracer recognized are column-parallel (the trainer shards them
    piece by piece); qk-norms per head do not break the column -> row pair."""
    graph = trace(HF.build("phi3"), batch=1, seq_len=16)
    assert graph.parametric_ops["model.layers.0.self_attn.qkv_proj"].fused_pieces == (32, 16, 16)  # q, k, v
    assert graph.parametric_ops["model.layers.0.mlp.gate_up_proj"].fused_pieces == (64, 64)         # gate, up
    phi3 = megatron_placements(graph)
    for leaf, role in (("self_attn.qkv_proj", "colwise"), ("self_attn.o_proj", "rowwise"),
                       ("mlp.gate_up_proj", "colwise"), ("mlp.down_proj", "rowwise")):
        assert phi3[f"model.layers.0.{leaf}"] == role, leaf
    assert phi3["model.embed_tokens"] == "vocab" and phi3["lm_head"] == "colwise"
    qwen3 = megatron_placements(trace(HF.build("qwen3moe"), batch=1, seq_len=16), sequence_parallel=True)
    attn = {k.removeprefix("model.layers.0.self_attn."): v for k, v in qwen3.items()
            if k.startswith("model.layers.0.self_attn.")}
    assert attn == {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise",
                    "q_norm": "sequence", "k_norm": "sequence"}
    assert qwen3["model.layers.0.mlp.experts"] == "expert" and qwen3["model.layers.0.mlp.gate"] == "replicate"


def test_megatron_rule_keeps_attention_whole_when_a_norm_spans_all_heads():
    """OLMo2's q_norm / k_norm normalize over all heads: q/k cannot be head-split, so neither can v/o
    (attention would see mismatched head counts); the MLP is still split."""
    p = megatron_placements(trace(HF.build("olmo2"), batch=1, seq_len=16))
    for leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert p[f"model.layers.0.self_attn.{leaf}"] == "replicate", (leaf, p)
    assert p["model.layers.0.mlp.gate_proj"] == "colwise" and p["model.layers.0.mlp.down_proj"] == "rowwise"
    # MiniMax's linear attention normalizes its output over all heads before output_gate's product (hidden 64 =
    # 4 heads x 16: only the norm's producer, qkv_proj, tells it from a block's residual-stream norm); its
    # full-attention layer (0) still splits its heads
    p = megatron_placements(trace(HF.build("minimax"), batch=1, seq_len=16))
    for leaf in ("qkv_proj", "output_gate", "out_proj"):
        assert p[f"model.layers.1.self_attn.{leaf}"] == "replicate", (leaf, p)
    assert p["model.layers.0.self_attn.q_proj"] == "colwise" and p["model.layers.0.self_attn.o_proj"] == "rowwise"


@pytest.mark.parametrize("model_type, path, heads, fused", [
    # rotary's q_rot / q_pass slices of the per-head view, rejoined into it: heads (Megatron's rule had read them
    # as a fused projection and kept GPT-J's attention whole)
    ("gptj", "transformer.h.0.attn.q_proj", 4, False),
    # q, k and v split after a clamp (the solver had let a contiguous column split cut across them)
    ("dbrx", "transformer.blocks.0.norm_attn_norm.attn.Wqkv", None, True),
    # per head [q, k, v], viewed (b, s, H, 3 d) and sliced (the solver had read 4 heads)
    ("gpt_neox_japanese", "gpt_neox_japanese.layers.0.attention.query_key_value", 4, True),
    # the same layout cut after its heads moved off the token dims: read per head, a whole-head split keeps each
    # head's q, k and v
    ("gpt_neox", "gpt_neox.layers.0.attention.query_key_value", 4, False),
])
def test_the_solver_and_megatrons_rule_read_a_linears_output_alike(model_type, path, heads, fused):
    """linear_output.output_structure is the one reading of a Linear's output (the heads of its per-head view,
    whether its features are cut into pieces) for the sharding solver and Megatron's rule, where the two had
    disagreed on these models."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from hf_coverage import tiny_config
    from transformers import AutoModelForCausalLM

    from autoparallel.placements import _fused_outputs

    with torch.device("meta"):
        graph = trace(AutoModelForCausalLM.from_config(tiny_config(model_type)), batch=1, seq_len=16,
                      compiled_saved=False)
    assert not graph.parametric_ops[path].fused_pieces  # no pieces the tracer recognized: the reading decides
    solver = ShardingSolver(graph, make_cluster("h100-sxm", 8))
    node = next(n for n in solver.segment(graph.parametric_ops[path].block).nodes if n.path == path)
    assert (node.heads, node.fused) == (heads, fused)
    assert (path in _fused_outputs(graph, {p: op.kind for p, op in graph.parametric_ops.items()})) == fused
    placements = megatron_placements(graph)
    assert placements[path] == ("replicate" if fused else "colwise")
    legal = {c.placement: c.illegal for c in solver.choices(path, 2, False)}
    assert ("fused projection" in legal["colwise"]) == fused, legal


def test_fused_projection_is_sharded_only_in_whole_heads_of_every_piece():
    """Phi-3's qkv_proj holds q (8 heads of 4), k and v (4 kv heads each): tp 4 gives every rank one
    kv head and is legal for the sharding solver; tp 8 would cut kv heads and is illegal, with the
    reason; a fused projection the tracer cannot split into pieces stays replicated (test_sharding)."""
    solver = ShardingSolver(trace(HF.build("phi3"), batch=1, seq_len=16), make_cluster("h100-sxm", 8))
    path = "model.layers.0.self_attn.qkv_proj"
    legal4 = {c.placement: c.illegal for c in solver.choices(path, 4, False)}
    assert legal4["colwise"] == ""
    legal8 = {c.placement: c.illegal for c in solver.choices(path, 8, False)}
    assert "pieces [32, 16, 16] (heads of 4), not each divisible by tp=8" in legal8["colwise"], legal8


def _falcon(**kw):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                               attn_implementation="sdpa", **kw)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def test_falcon_traces_and_keeps_its_fused_attention_whole_under_tp():
    """Falcon's blocks require an `alibi` argument (None under rotary), and its query_key_value is a fused
    projection whose multi-query layout [q heads | k | v] no tp > 1 can split by heads: the plan keeps the
    attention whole (the contiguous split a plain Linear would get cuts across q, k and v) and splits the MLP."""
    from autoparallel.api import plan_result
    graph = trace(_falcon(), batch=1, seq_len=16)
    qkv = graph.parametric_ops["transformer.h.0.self_attention.query_key_value"]
    assert qkv.fused_pieces == (64, 16, 16) and qkv.fused_unit == 16
    from autoparallel.errors import UserError
    from cost_models.estimate import attention_heads
    if attention_heads(graph)[1] == 1:
        # transformers >= 5.25 hands attention the one key/value head (its attention interface repeats it
        # there): no tp > 1 divides it, and a tp pin is one error line
        with pytest.raises(UserError, match=r"pin tp=2 does not divide the model's 4 heads / 1 kv heads"):
            plan_result(_falcon(), hardware="h100-sxm", gpus=2, global_batch=2, seq_len=16, fix="tp=2")
        return
    result, _ = plan_result(_falcon(), hardware="h100-sxm", gpus=2, global_batch=2, seq_len=16, fix="tp=2")
    pl = result.plan.placements
    assert pl["transformer.h.0.self_attention.query_key_value"] == "replicate"
    assert pl["transformer.h.0.self_attention.dense"] == "replicate"
    assert (pl["transformer.h.0.mlp.dense_h_to_4h"], pl["transformer.h.0.mlp.dense_4h_to_h"]) == ("colwise", "rowwise")


@pytest.mark.parametrize("name, qkv, pieces, unit", [
    ("bloom", "transformer.h.0.self_attention.query_key_value", (192,), 48),  # per head [q, k, v]: whole heads
    ("mpt", "transformer.blocks.0.attn.Wqkv", (64, 64, 64), 16),              # [q | k | v], cut by .chunk(3)
])
def test_alibi_models_trace_and_split_their_fused_attention_by_heads(name, qkv, pieces, unit):
    """BLOOM and MPT, whose blocks take ALiBi biases their base models build, trace op-level on the meta device
    through autoparallel's forward; their fused q/k/v projections are recognized by how the attention reads
    them, so a tp=2 plan splits them by whole heads (each rank then takes its heads' slopes)."""
    from autoparallel.api import plan_result
    graph = trace(HF.build(name, meta=True), batch=1, seq_len=16)
    assert not graph.module_level and not graph.warnings, graph.warnings
    op = graph.parametric_ops[qkv]
    assert (op.fused_pieces, op.fused_unit) == (pieces, unit)
    result, _ = plan_result(HF.build(name, meta=True), hardware="h100-sxm", gpus=2, global_batch=2, seq_len=16,
                            fix="tp=2")
    assert result.plan.placements[qkv] == "colwise"


def test_an_attention_reshaped_to_its_input_width_stays_whole_under_tp():
    """TrOCR's attention reshapes its heads' output to the width it reads off its (whole) input: no head split runs
    (the trainer crashed in it at tp2). The tracer records its projections as one unit (hf.projection_heads), so a
    tp=2 plan keeps the attention replicated and splits the MLP, and the trainer refuses a hand-written head split
    in one line."""
    from autoparallel.api import plan_result
    from autoparallel.errors import UserError
    from autoparallel.trainer.tensor_parallel import _check_heads
    attn = "model.decoder.layers.0.self_attn"
    graph = trace(HF.build("trocr", meta=True), batch=1, seq_len=16)
    assert graph.parametric_ops[f"{attn}.q_proj"].heads == 1
    result, _ = plan_result(HF.build("trocr", meta=True), hardware="h100-sxm", gpus=2, global_batch=2, seq_len=16,
                            fix="tp=2")
    pl = result.plan.placements
    assert {pl[f"{attn}.{p}"] for p in ("q_proj", "k_proj", "v_proj", "out_proj")} == {"replicate"}
    assert (pl["model.decoder.layers.0.fc1"], pl["model.decoder.layers.0.fc2"]) == ("colwise", "rowwise")
    model = HF.build("trocr")
    split = {**{f"{attn}.{p}": "colwise" for p in ("q_proj", "k_proj", "v_proj")}, f"{attn}.out_proj": "rowwise"}
    with pytest.raises(UserError, match=rf"{attn}\.q_proj is a projection of {attn}, whose forward reshapes its "
                                        r"output to its input's width"):
        _check_heads(model, split, 2)


def test_alibi_attention_is_one_clear_error(monkeypatch):
    """Falcon's config.alibi (transformers >= 5.25 folds it into the mask it builds), and blocks that require an
    ALiBi bias whose base model holds no builder autoparallel knows (hf.BIAS_BUILDERS; BLOOM's taken away here)."""
    from autoparallel.errors import UserError
    with pytest.raises(UserError, match="ALiBi attention is not supported"):
        trace(_falcon(alibi=True), batch=1, seq_len=16)
    bloom = HF.build("bloom", meta=True)
    monkeypatch.setattr(type(bloom.transformer), "build_alibi_tensor", None)
    with pytest.raises(UserError, match=r"its blocks require the argument 'alibi'.*ALiBi attention is not supported"):
        trace(bloom, batch=1, seq_len=16)


def test_selective_recompute_is_priced_as_the_trainer_runs_it():
    """AutoParallelTrainer recomputes the attention core under "selective" only in blocks whose attention
    exposes `recompute_core` (the catalog's); a Hugging Face block runs per-op checkpointing instead
    (trainer/recompute.py). The cost model prices what runs: for the HF llama "selective" costs exactly
    what "op" costs (time and memory), while the catalog llama's selective stays the cheaper attention
    core (with SDPA nothing quadratic to recompute: the activations of "none", the checkpoint's host work)."""
    from autoparallel.models import build_model, load_model_spec
    from autoparallel.plan import Plan
    from autoparallel.sharding import cost_model

    hf = HF.build("llama")
    with torch.device("meta"):
        catalog = build_model(load_model_spec("tiny-llama"))
    cluster = make_cluster("h100-sxm", gpus=1, gpus_per_node=8)
    for model, selective_is_op in ((hf, True), (catalog, False)):
        g = trace(model, batch=1, seq_len=64)
        assert (g.selective_as_op == g.blocks) is selective_is_op and (not g.selective_as_op) is not selective_is_op
        cm = cost_model(g, cluster)
        est = {r: cm.estimate(Plan(model="m", hardware="h100-sxm", gpus=1, gpus_per_node=8, global_batch=8,
                                   seq_len=64, micro_batch=8, recompute=(r,) * len(g.blocks)))
               for r in ("none", "selective", "op")}
        assert est["op"].step_time_s > est["none"].step_time_s   # per-op checkpointing is not free
        if selective_is_op:
            assert est["selective"].step_time_s == est["op"].step_time_s
            assert est["selective"].peak_memory_gib == est["op"].peak_memory_gib
        else:  # the checkpoint's own host work only
            assert est["none"].step_time_s <= est["selective"].step_time_s < est["op"].step_time_s
            assert est["selective"].peak_memory_gib == est["none"].peak_memory_gib


def test_a_block_that_changes_a_cached_output_in_place_is_planned_without_per_op_checkpointing():
    """transformers' grouped experts with biases (gpt-oss) add the bias into the grouped GEMM's output in place;
    per-op selective checkpointing caches that output and torch refuses the changed entry in the backward
    ("Tensor cached during selective activation checkpoint has been mutated", on CPU too). The trace marks
    the GEMM; the planner then leaves out "op" and, on a Hugging Face block, "selective" (per-op checkpointing
    there), and a pinned one is one error. A llama block, which changes nothing in place, keeps every mode."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from hf_coverage import tiny_config
    from transformers import AutoModelForCausalLM

    from autoparallel.errors import UserError
    from autoparallel.plan import RECOMPUTE_MODES
    from autoparallel.planner import Planner

    with torch.device("meta"):
        oss = AutoModelForCausalLM.from_config(tiny_config("gpt_oss"))
    g = trace(oss, batch=1, seq_len=16)
    assert {op for op, _ in g.op_sac_mutated()} == {"aten._grouped_mm.default"}
    cluster = make_cluster("h100-sxm", gpus=1, gpus_per_node=8)
    assert Planner(g, cluster, 8, 16).recompute_modes == ("none", "full")
    for pinned in ("op", "selective"):
        with pytest.raises(UserError, match=f"pin recompute={pinned}: per-op checkpointing would cache the output "
                                            r"of aten._grouped_mm.default in model.layers.0.mlp.experts"):
            Planner(g, cluster, 8, 16, fix={"recompute": pinned})
    llama = trace(HF.build("llama"), batch=1, seq_len=16)
    assert llama.op_sac_mutated() == [] and Planner(llama, cluster, 8, 16).recompute_modes == RECOMPUTE_MODES


def _config_dir(tmp_path, name: str, **changes) -> str:
    """A directory holding config.json of HF.config(name) with `changes`, as a user's checkpoint folder has."""
    import json
    raw = {**HF.config(name).to_dict(), **changes}
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


def test_cli_plans_a_config_the_catalog_does_not_implement_as_transformers_builds_it(tmp_path):
    """`autoparallel plan DIR` with a config.json of a model_type outside the catalog's (Gemma here) plans the
    model transformers builds from it, the one a user hands the trainer: the same trace as HF.build's."""
    from cli_harness import run_cli

    from autoparallel.api import trace_model
    from autoparallel.specs import hf_config_of, spec_of
    folder = _config_dir(tmp_path, "gemma")
    assert hf_config_of(folder) is not None and spec_of(folder) is None
    o = run_cli(["plan", folder, "--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "4", "--seq-len", "16",
                 "--quiet"])
    assert o.kind == "ok", (o.err, o.escaped)
    assert "mesh" in o.out and "step time" in o.out
    from_cli = trace_model(folder, seq_len=16, cache=False)
    from_module = trace_model(HF.build("gemma", meta=True), seq_len=16, cache=False)
    assert from_cli.parameters == from_module.parameters
    assert from_cli.g.number_of_nodes() == from_module.g.number_of_nodes()


def test_the_hf_build_keeps_torchao_extension_warnings_off_the_cli(tmp_path, monkeypatch):
    """transformers imports torchao's quantizer while it builds a model, and a torchao build whose optional
    CUDA extensions do not load logs "Failed to load ..." for each, and torch's pytree a deprecation for each
    Enum torchao registers (both seen on this project's CPU machine): the CLI's stderr must not carry them
    for a plan (hf.quiet_optional_kernels), and the loggers are as they were afterwards. The warnings are
    raised inside the build here, so the check holds with any torchao or none."""
    import logging

    import transformers
    from cli_harness import run_cli

    from autoparallel.hf import IMPORT_NOISE_LOGGERS
    original = transformers.AutoModelForCausalLM.from_config
    builds = []
    logs = [logging.getLogger(name) for name in IMPORT_NOISE_LOGGERS]

    def noisy(*args, **kwargs):
        builds.append(1)
        for log in logs:
            log.warning("Failed to load _C_mxfp8.so: Could not load this library")
        return original(*args, **kwargs)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", noisy)
    levels = [log.level for log in logs]
    emitted: list[logging.LogRecord] = []  # what any handler (the CLI's stderr, through logging's last resort) gets
    handler = logging.Handler()
    handler.emit = emitted.append
    for log in logs:
        log.addHandler(handler)
    try:
        o = run_cli(["plan", _config_dir(tmp_path, "gemma"), "--hardware", "h100-sxm", "--gpus", "1", "--global-batch",
                     "4", "--seq-len", "16", "--quiet", "--no-cache"])
        assert o.kind == "ok", (o.err, o.escaped)
        assert builds and not emitted and "Failed to load" not in o.err
        assert [log.level for log in logs] == levels
        for log in logs:
            log.warning("after the build")  # their own warnings elsewhere are untouched
        assert [r.getMessage() for r in emitted] == ["after the build"] * len(logs)
    finally:
        for log in logs:
            log.removeHandler(handler)


@pytest.mark.parametrize("model_type, changes, message", [
    ("t5", {}, "has no causal language model in transformers"),
    # BertLMHeadModel has an output head (get_output_embeddings()), but no blocks beside its embedding
    ("bert", {}, "bert.embeddings .*holds no ModuleList of blocks; only decoder-only causal LMs"),
    ("no_such_model", {}, "transformers .* cannot read it"),
    ("gemma", {"num_hidden_layers": 10 ** 7}, "'num_hidden_layers' = 10,000,000 is outside"),
    ("gemma", {"hidden_size": "wide"}, "'hidden_size' must be an integer"),
])
def test_cli_refuses_configs_transformers_cannot_build_in_one_line(tmp_path, model_type, changes, message):
    import re

    from cli_harness import run_cli
    folder = _config_dir(tmp_path, "gemma", model_type=model_type, **changes)
    o = run_cli(["plan", folder, "--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "4", "--seq-len", "16",
                 "--quiet"])
    assert o.kind == "usage-error", (o.rc, o.err, o.escaped)
    assert re.search(message, o.error_lines[0]), o.error_lines[0]


def test_a_config_value_left_none_is_an_error_at_the_line_that_reads_it(tmp_path):
    """transformers' DeepseekV2Config defaults num_experts_per_tok to None, and its router's topk raises on it: the
    error line names the modeling file's line (the model's code, not the tracer's dispatch modes) and the config."""
    import json

    import transformers as T
    cfg = T.DeepseekV2Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                             kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                             max_position_embeddings=64)
    assert cfg.num_experts_per_tok is None
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(UserError, match=r"layers raised TypeError: .*NoneType at transformers/models/deepseek_v2/"
                                        r"modeling_deepseek_v2\.py:\d+ \(\w+\) under .*fix the config"):
        trace(str(tmp_path), seq_len=8)


def test_trace_cache_tells_hf_models_apart_by_their_config():
    """Two HF models whose module trees print alike but whose configs differ (a sliding window) trace apart."""
    from autoparallel.trace_cache import module_identity
    a, b = HF.build("mistral", meta=True), HF.build("mistral", meta=True)
    assert module_identity(a) == module_identity(b)
    b.config.sliding_window = 8
    assert repr(a) == repr(b) and module_identity(a) != module_identity(b)


@pytest.mark.parametrize("name", ["llama", "gemma2"])  # SDPA (query heads visible in the trace), eager attention
def test_tp_must_divide_the_key_value_heads_of_the_config(name):
    """8 query heads, 4 key/value heads: tp=8 would split each kv head over two ranks. The counts come from the
    config; the trace alone shows the query heads of SDPA's outputs and nothing of an eager attention."""
    from autoparallel.api import plan_model
    from autoparallel.errors import UserError
    model = HF.build(name, meta=True)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (8, 4)
    with pytest.raises(UserError, match="does not divide the model's 8 heads / 4 kv heads"):
        plan_model(model, hardware="h100-sxm", gpus=8, global_batch=8, seq_len=16, fix={"tp": 8})
    assert plan_model(model, hardware="h100-sxm", gpus=8, global_batch=8, seq_len=16, fix={"tp": 4}).tp == 4


def test_pinned_recompute_on_mixed_block_classes_is_feasible(hidden: int = 32, layers: int = 12):
    """Gemma 3's layout (five sliding-window layers to each global one: two block classes) with recompute
    pinned: the CP-SAT stage-time bound summed the blocks' times before rounding them to whole units, so a
    stage of all-pinned blocks could exceed it and a plan that fits came back INFEASIBLE (this size did with
    recompute=op, as 32 x 26 and 48 x 26 layers did; Gemma 3 1B with recompute=none)."""
    import transformers as T

    from autoparallel.api import plan_model
    cfg = T.Gemma3TextConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=64,
                             max_position_embeddings=64,
                             layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                          for i in range(layers)])
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(cfg)
    plan = plan_model(model, hardware="h200", gpus=1, gpus_per_node=1, global_batch=4, seq_len=16,
                      fix={"micro_batch": 2, "recompute": "op", "compile": 0})
    assert plan.recompute == ("op",) * layers


def test_state_space_mixers_are_one_clear_error():
    """Mamba's mixer reads `attention_mask` as a padding mask where autoparallel's forward passes attention's
    causal one: the trainer failed on the shapes and the meta trace broadcast them into a wrong graph (which the
    planner then planned, tensor-parallel mixers included). A model of Mamba-1 mixers alone (a scan looped over the
    sequence) is refused as a recurrence, one of Mamba-2 mixers alone (a chunked scan) runs (test_hf_trainer); a
    convolution in a block whose layer type transformers hands no padding mask is refused naming it (hybrids
    whose types do get one, Qwen3.5's and LFM2's, run: test_hf_trainer)."""
    import transformers as T

    from autoparallel.errors import UserError
    cfg = T.MambaConfig(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UserError, match=r"MambaForCausalLM: its config declares no attention heads"):
        trace(model, batch=1, seq_len=16)
    lfm2 = HF.build("lfm2", meta=True)
    lfm2.model.layers[0].conv.layer_type = "full_attention"  # the convolution's layer loses its padding mask
    with pytest.raises(UserError, match=r"model\.layers\.0\.conv\.conv is a convolution inside a block"):
        trace(lfm2, batch=1, seq_len=16)


def test_sequence_parallelism_the_sharding_solver_cannot_place_is_skipped():
    """Qwen3.5's gated full attention has no sequence-parallel placement in the sharding solver at tp 2: the
    planner plans tp 2 without SP (it failed with "no placement satisfies the constraints" before), and a
    pinned SP is one error naming the block."""
    from autoparallel.api import plan_result
    from autoparallel.errors import UserError

    model = HF.build("qwen3_5", meta=True)
    graph = trace(model, batch=2, seq_len=64)
    solver = ShardingSolver(graph, make_cluster("h100-sxm", 2))
    assert solver.solve_segment("model.layers.1", 2, True).status == "INFEASIBLE"
    result, _ = plan_result(model, hardware="h100-sxm", gpus=2, global_batch=8, seq_len=64, graph=graph,
                            fix="tp=2", cache=False)
    assert result.plan.tp == 2 and not result.plan.sequence_parallel
    with pytest.raises(UserError, match=r"no placement satisfies the constraints of model\.layers\.1 at tp=2"):
        plan_result(model, hardware="h100-sxm", gpus=2, global_batch=8, seq_len=64, graph=graph,
                    fix="tp=2,sequence_parallel=1", cache=False)


@pytest.mark.parametrize("name, post_ln, flattens", [("opt", False, True), ("opt", True, True), ("llama", False, False),
                                                     ("gpt2", False, False), ("qwen2moe", False, False)])
def test_blocks_that_flatten_their_tokens_are_planned_without_sequence_parallelism(name, post_ln, flattens):
    """OPT's blocks reshape to [batch * seq, hidden] around their MLP (its norm reads that before the MLP,
    pre-LN; only the Linears do, post-LN as OPT-350m), so no dim is the sequence there: the planner never
    chooses SP for it and a pin is one error. An MoE layer, which flattens its tokens to route them (and
    which SP runs on the gathered sequence), does not count."""
    from autoparallel.api import plan_model
    from autoparallel.errors import UserError
    from cost_models.facts import flattens_tokens

    model = HF.build(name, meta=True) if not post_ln else _built(HF.config(name), do_layer_norm_before=False)
    assert flattens_tokens(trace(model, batch=1, seq_len=16)) is flattens
    if flattens:
        with pytest.raises(UserError, match="flatten batch and sequence"):
            plan_model(model, hardware="h100-sxm", gpus=2, global_batch=8, seq_len=16,
                       fix={"tp": 2, "sequence_parallel": True})
        assert not plan_model(model, hardware="h100-sxm", gpus=2, global_batch=8, seq_len=16,
                              fix={"tp": 2}).sequence_parallel


def _built(config, **changes):
    import transformers as T

    for key, value in changes.items():
        setattr(config, key, value)
    with torch.device("meta"):
        return T.AutoModelForCausalLM.from_config(config)


def test_falcon_blocks_partition_and_their_math_attention_moves_the_cuda_kernels_bytes():
    """Falcon's multi-query split indexes with a Python list (qkv[..., [-2], :]), whose index tensor is made
    outside AOTAutograd's fake mode: the partitioner still takes the block (compiled saved and fused bytes per
    class). Its 4 query heads against 1 key head run scaled_dot_product_attention's math path, whose
    _safe_softmax is four CUDA kernels (softmax, isneginf, all, where: compute.moved_bytes): 5 s + 2 bytes an
    element, where the op's own read and write count 2 s."""
    from cost_models.compute import moved_bytes
    graph = trace(_falcon(), batch=1, seq_len=16)
    classes = set(graph.block_class.values())
    assert set(graph.compiled_saved) == classes and set(graph.compiled_fused) == classes
    elements = 1 * 4 * 16 * 16
    soft = [a for _, a in graph.nodes() if a["op"] == "aten._safe_softmax.default"]
    if not soft:  # transformers >= 5.25 repeats the key head before SDPA, which then runs a fused kernel
        assert any("_scaled_dot_product_efficient_attention" in a["op"] for _, a in graph.nodes())
        soft = [{"op": "aten._safe_softmax.default", "bytes_read": elements * 4, "bytes_written": elements * 4,
                 "out_shapes": [[1, 4, 16, 16]]}]  # the math path's op as the tracer records it (fp32)
    else:
        assert len(soft) == 2  # one a block
    a = soft[0]
    size = a["bytes_written"] // elements
    assert a["bytes_read"] == a["bytes_written"] == elements * size
    assert moved_bytes(a) == elements * (5 * size + 2)


@pytest.mark.parametrize(("name", "scales"), [("cohere", True), ("granite", True), ("gemma2", True),
                                              ("llama", False), ("gpt2", False)])
def test_the_loss_is_marked_and_a_scaled_head_output_is_one_more_logits_gradient(name, scales):
    """The tracer marks the loss's forward ops (after the model returned): the log-softmax and the NLL are
    marked, no op of the model is. A model that scales its logits (Cohere's logit_scale, Granite's
    logits_scaling, Gemma 2's soft-cap) runs that op eager before the trainer's compiled loss, and its backward
    makes the gradient of the head's output while the loss's is alive: the compiled loss's buffers are two
    logits-sized gradients in the logits' dtype instead of one (CostModel.logits_bytes; on an H200, Aya
    Expanse's compiled step peaked one logits-sized bf16 tensor above the one-gradient count)."""
    from autoparallel.api import make_cluster
    from autoparallel.plan import Plan
    from cost_models.estimate import CostModel
    from cost_models.facts import scales_logits

    graph = trace(HF.build(name, meta=True), batch=1, seq_len=16)
    marked = [a["op"] for _, a in graph.nodes() if a.get("loss")]
    assert "aten._log_softmax.default" in marked and "aten.nll_loss_forward.default" in marked
    assert all(a["phase"] == "fwd" and a["region"] == "post" and a["module"] == "" for _, a in graph.nodes()
               if a.get("loss"))
    assert scales_logits(graph) is scales
    cm = CostModel(graph, make_cluster("h200", 1))
    plan = Plan(model=name, hardware="h200", gpus=1, gpus_per_node=1, global_batch=2, seq_len=16, micro_batch=2,
                compile=True)
    logits = 2 * 16 * cm.vocab_size
    assert cm.logits_bytes(plan) == (2 if scales else 1) * 2 * logits


def test_a_sliding_window_beyond_the_sequence_traces_masked_attention():
    """A Mistral-style model (every layer slides, window 8) traced within its window runs SDPA's is_causal
    (flash: the causal calibration prices it); beyond the window each layer's attention gets the additive mask
    and the tracer records that kernel as not causal, which the cost model prices with the masked terms
    (compute.attention_times): on the shipped h200 profile its own fitted terms, 2.9-3.1x the causal time at
    8192 tokens as measured (s57), where the doubling fallback would give 2x and the causal terms 1x."""
    import numpy as np
    import transformers as T

    from cost_models.compute import attention_times
    from hardware_profiles import load_profile

    cfg = T.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8)
    model = T.AutoModelForCausalLM.from_config(cfg)

    def attention(seq: int) -> list[dict]:
        g = trace(model, seq_len=seq)
        return [g.g.nodes[n] for n in g.g.nodes if "attention" in g.g.nodes[n]["op"]]

    within, beyond = attention(8), attention(32)
    assert len(within) == len(beyond) == 4  # forward and backward of 2 layers
    assert all(a["causal"] is True for a in within) and all(a["causal"] is False for a in beyond)
    prof = load_profile("h200")
    flops = np.array([4.4e12, 4.4e12])
    causal, masked = attention_times(flops, "fwd", 8192, 128, prof, "bf16", np.array([False, True]))
    assert 2.5 < masked / causal < 4.0


def test_padded_batches_plan_with_the_masked_attention_they_run(tmp_path):
    """A batch with padding hands every attention layer a mask (the trainer keeps a mask with zeros), so the
    kernel computes every score; planning with padded=True (what AutoParallelTrainer does when its first batch has
    padding) traces that kernel as not causal, the trace cache keeps the two graphs apart, and the same plan is
    priced slower padded (masked terms: ~3x the causal attention on the shipped h200 profile)."""
    import transformers as T

    from autoparallel.api import estimate_plan, trace_model
    from autoparallel.trace_cache import TraceCache

    cfg = T.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model = T.AutoModelForCausalLM.from_config(cfg)
    store = TraceCache(tmp_path)

    def attention_kinds(padded: bool) -> set[bool]:
        g = trace_model(model, seq_len=512, cache=store, padded=padded)
        return {g.g.nodes[n]["causal"] for n in g.g.nodes if "attention" in g.g.nodes[n]["op"]}

    assert attention_kinds(False) == {True} and attention_kinds(True) == {False}
    assert attention_kinds(False) == {True}  # the cached unpadded graph is still its own
    est = {p: estimate_plan(model, hardware="h200", gpus=1, global_batch=4, seq_len=512, micro_batch=4,
                            cache=store, padded=p)[0] for p in (False, True)}
    assert est[True].step_time_s > est[False].step_time_s
