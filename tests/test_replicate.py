"""Identical blocks traced once (autoparallel.replicate): the replicated graph equals the full trace."""

from __future__ import annotations

import pytest

from autoparallel import tracer
from autoparallel.replicate import plan_replication
from autoparallel.specs import load_model_spec
from autoparallel.tracer import trace

CASES = [
    ("llama3-8b", {}, 32),
    ("gpt3-1.3b", {}, 32),
    ("qwen3-30b-a3b", {}, 16),                      # MoE with qk-norm
    ("tiny-moe", {"num_layers": 16, "moe_layers": (False, False) + (True,) * 10 + (False, True, True, False)}, 16),
    ("tiny-moe", {"num_layers": 8, "moe_layers": (True, False) * 4}, 16),   # alternating classes
    ("tiny-gpt", {"num_layers": 12, "dropout": 0.1, "attn_impl": "eager"}, 16),
    ("tiny-llama", {"num_layers": 10, "tie_word_embeddings": True}, 16),
]


@pytest.fixture
def expanded(monkeypatch) -> list[bool]:
    """One entry per replicated trace: whether its expansion to every block succeeded (a failure falls back)."""
    calls: list[bool] = []
    real = tracer.expand

    def spy(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(tracer, "expand", spy)
    return calls


@pytest.mark.parametrize("ref,overrides,seq", CASES, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(CASES)])
def test_replicated_graph_equals_full_trace(ref, overrides, seq, expanded):
    spec = load_model_spec(ref, **overrides)
    # without the compiled blocks' partition (run on each class's first block either way; most of the time)
    full = trace(spec, seq_len=seq, replicate_blocks=False, compiled_saved=False)
    assert expanded == []
    fast = trace(spec, seq_len=seq, compiled_saved=False)
    assert expanded == [True]  # the replicated path ran and did not fall back
    assert list(fast.g.nodes(data=True)) == list(full.g.nodes(data=True))
    assert set(fast.g.edges) == set(full.g.edges)
    assert fast.forward_flops == full.forward_flops and fast.backward_flops == full.backward_flops
    assert fast.saved_bytes_total == full.saved_bytes_total
    assert fast.block_class == full.block_class
    assert set(fast.param_op_edges) == set(full.param_op_edges)
    assert fast.parametric_ops == full.parametric_ops and fast.expert_groups == full.expert_groups
    assert (fast.parameters, fast.fingerprint) == (full.parameters, full.fingerprint)
    assert fast.summary() == full.summary()


def test_uniform_model_traces_five_blocks():
    from torch import nn
    with __import__("torch").device("meta"):
        from autoparallel.models import build_model
        model = build_model(load_model_spec("tiny-llama", num_layers=40))
    blocks = tracer.find_blocks(model)
    plan = plan_replication(model, blocks)
    assert plan is not None and plan.kept == (0, 1, 2, 38, 39)
    assert plan.template[:3] == (0, 1, 1) and plan.template[-1] == 39
    assert isinstance(model.get_submodule("layers"), nn.ModuleDict)


def test_position_dependent_model_falls_back_to_the_full_trace():
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32, 8)
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x)
            for i in range(len(self.layers)):  # indexing: the reduced list cannot run this
                h = self.layers[i](h).relu()
            return h

    full = trace(Net(), seq_len=8, replicate_blocks=False)
    fast = trace(Net(), seq_len=8)
    assert not fast.module_level
    assert list(fast.g.nodes(data=True)) == list(full.g.nodes(data=True))


def _hf_configs():
    import transformers as T

    kw = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=8, num_key_value_heads=4,
              max_position_embeddings=64, num_hidden_layers=16)
    return {
        "llama": T.LlamaConfig(**kw),
        # three linear-attention layers to each full one: two classes, one period
        "qwen3_5": T.Qwen3_5TextConfig(**kw, head_dim=8, linear_num_key_heads=4, linear_num_value_heads=8,
                                       linear_key_head_dim=8, linear_value_head_dim=8,
                                       layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 4),
        # dense first layers (first_k_dense_replace), then MoE
        "deepseek_v3": T.DeepseekV3Config(**{**kw, "num_key_value_heads": 8}, first_k_dense_replace=2,
                                          n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                          moe_intermediate_size=32, kv_lora_rank=16, q_lora_rank=None,
                                          qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8),
        # MoE every second layer (decoder_sparse_step), two layers listed dense (mlp_only_layers)
        "qwen2moe": T.Qwen2MoeConfig(**kw, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                     shared_expert_intermediate_size=32, mlp_only_layers=[1, 9], decoder_sparse_step=2),
    }


@pytest.mark.parametrize("name", ["llama", "qwen3_5", "deepseek_v3", "qwen2moe"])
def test_hugging_face_blocks_are_replicated_by_what_their_config_says_of_each_layer(name, expanded):
    """A Hugging Face block's modules keep their `layer_idx`, which made every block a class of its own: every
    HF model was traced block by block (Qwen3.5 9B at 4096 tokens: 171k ops). The index now counts by what the
    config says of that layer (its layer type, MoE or dense, ...), and the replicated graph equals the full one."""
    pytest.importorskip("transformers")
    import torch
    import transformers as T

    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(_hf_configs()[name])
    full = trace(model, batch=2, seq_len=16, replicate_blocks=False, compiled_saved=False)
    fast = trace(model, batch=2, seq_len=16, compiled_saved=False)
    assert expanded == [True]
    assert list(fast.g.nodes(data=True)) == list(full.g.nodes(data=True))
    assert set(fast.g.edges) == set(full.g.edges)
    assert fast.block_class == full.block_class and fast.parametric_ops == full.parametric_ops
    assert fast.summary() == full.summary()
