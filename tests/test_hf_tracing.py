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


def test_plan_puts_megatron_layout_on_a_realistic_hf_llama_at_seq_equal_hidden():
    """`plan` of an HF Llama at hidden 2048 (seq_len 2048 = hidden), tp pinned to 2: column -> row on
    attention and MLP, vocab-parallel embedding, column-parallel head."""
    import autoparallel

    plan = autoparallel.plan(_llama(2048, vocab=32000), hardware="h100-sxm", gpus=8, global_batch=64, seq_len=2048,
                             max_memory_per_gpu="80GB", fix={"tp": 2})
    block = {k.removeprefix("model.layers.0."): v for k, v in plan.placements.items()
             if k.startswith("model.layers.0.")}
    for leaf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert block[leaf] == "colwise", (leaf, block)
    assert block["self_attn.o_proj"] == block["mlp.down_proj"] == "rowwise"
    assert plan.placements["model.embed_tokens"] == "vocab" and plan.placements["lm_head"] == "colwise"


def test_megatron_rule_on_fused_and_qk_normed_projections():
    phi3 = megatron_placements(trace(HF.build("phi3"), batch=1, seq_len=16))
    for leaf in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        assert phi3[f"model.layers.0.{leaf}"] == "replicate", leaf  # a column split would cut across q/k/v
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
