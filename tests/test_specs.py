"""Model specs: catalog parameter counts, unmodified HF configs of every supported model_type, errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from autoparallel.errors import UserError
from autoparallel.models import build_model
from autoparallel.specs import ModelSpec, list_catalog, load_model_spec, parameter_count

# Published totals (model cards / safetensors metadata of the released checkpoints).
PUBLISHED = {
    "gpt2": 124_439_808,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_620_634_112,
    "qwen3-30b-a3b": 30_532_122_624,
}

REQUIRED_CATALOG = [
    "gpt2", "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b",
    "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
    "mistral-7b", "qwen2.5-7b", "qwen2.5-72b", "mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b",
    "tiny-gpt", "tiny-llama", "tiny-moe",
]


def meta_numel(spec: ModelSpec) -> int:
    with torch.device("meta"):
        model = build_model(spec)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def test_catalog_has_required_entries():
    assert set(REQUIRED_CATALOG) <= set(list_catalog())


@pytest.mark.parametrize("name", REQUIRED_CATALOG)
def test_catalog_count_equals_built_module(name):
    spec = load_model_spec(name)
    assert spec.name == name
    assert parameter_count(spec) == meta_numel(spec)


@pytest.mark.parametrize("name,total", sorted(PUBLISHED.items()))
def test_catalog_matches_published_totals(name, total):
    assert parameter_count(load_model_spec(name)) == total


def test_gpt3_sizes_follow_the_paper():
    # Brown et al. Table 2.1 (n_layers, d_model, n_heads, d_head), context 2048, vocab 50257.
    table = {"gpt3-125m": (12, 768, 12, 64), "gpt3-350m": (24, 1024, 16, 64),
             "gpt3-760m": (24, 1536, 16, 96), "gpt3-1.3b": (24, 2048, 16, 128),
             "gpt3-2.7b": (32, 2560, 32, 80), "gpt3-6.7b": (32, 4096, 32, 128),
             "gpt3-13b": (40, 5120, 40, 128), "gpt3-175b": (96, 12288, 96, 128)}
    for name, (L, h, a, d) in table.items():
        s = load_model_spec(name)
        assert (s.num_layers, s.hidden_size, s.num_heads, s.head_dim) == (L, h, a, d), name
        assert (s.vocab_size, s.max_position_embeddings, s.intermediate_size) == (50257, 2048, 4 * h)
        assert s.tie_word_embeddings
    # Rounded sizes in the paper's name column.
    assert round(parameter_count(load_model_spec("gpt3-175b")) / 1e9) == 175
    assert round(parameter_count(load_model_spec("gpt3-13b")) / 1e9) == 13


def test_tiny_models_divide_parallel_degrees():
    for name in ("tiny-gpt", "tiny-llama", "tiny-moe"):
        s = load_model_spec(name)
        assert s.hidden_size <= 128 and s.vocab_size <= 512 and s.num_layers <= 4
        for tp in (2, 4):
            assert s.num_heads % tp == 0 and s.num_kv_heads % tp == 0 and s.vocab_size % tp == 0
    moe = load_model_spec("tiny-moe")
    assert (moe.num_experts, moe.num_experts_per_tok) == (4, 2)
    assert moe.shared_expert_intermediate_size > 0 and all(moe.moe_layers)


# ----------------------------------------------------------------------------------------------
# Unmodified Hugging Face config.json files (the released ones, every key kept).

GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
    "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}
MISTRAL_7B_CONFIG = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000,
}
QWEN25_7B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": 152064,
}
QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_06B_CONFIG = {  # tied embeddings, head_dim 128 with hidden 1024 and 16 heads
    **QWEN3_8B_CONFIG, "hidden_size": 1024, "intermediate_size": 3072, "max_window_layers": 28,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "tie_word_embeddings": True,
}
MIXTRAL_8X7B_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000,
}
QWEN15_MOE_CONFIG = {  # Qwen/Qwen1.5-MoE-A2.7B
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
    "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.39.0.dev0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936, "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
    "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001,
}
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

# Totals computed by hand from the architecture (comments), independent of parameter_count.
HF_CASES = {
    # wte + wpe + 12 x (2 LN + c_attn W,b + c_proj W,b + c_fc W,b + mlp c_proj W,b) + ln_f
    "gpt2": (GPT2_CONFIG, 50257 * 768 + 1024 * 768
             + 12 * (4 * 768 + 768 * 2304 + 2304 + 768 * 768 + 768 + 768 * 3072 + 3072 + 3072 * 768 + 768)
             + 2 * 768),
    # 2 V h (untied) + 32 x (q,o h^2 + k,v h*1024 + 3 h*14336 + 2 norms) + final norm
    "llama": (LLAMA3_8B_CONFIG, 2 * 128256 * 4096
              + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096),
    "mistral": (MISTRAL_7B_CONFIG, 2 * 32000 * 4096
                + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096),
    # q/k/v bias: 3584 + 2 * 512
    "qwen2": (QWEN25_7B_CONFIG, 2 * 152064 * 3584
              + 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3584 + 2 * 512 + 3 * 3584 * 18944 + 2 * 3584) + 3584),
    # head_dim 128: q 4096->4096, k/v 4096->1024; qk-norm 2 x 128
    "qwen3": (QWEN3_8B_CONFIG, 2 * 151936 * 4096
              + 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096) + 4096),
    # tied: one V h; q 1024->2048, k/v 1024->1024, o 2048->1024
    "qwen3-tied": (QWEN3_06B_CONFIG, 151936 * 1024
                   + 28 * (2 * 1024 * 2048 + 2 * 1024 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024) + 1024),
    # 8 experts x 3 h f + router h x 8
    "mixtral": (MIXTRAL_8X7B_CONFIG, 2 * 32000 * 4096
                + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096) + 4096),
    # 60 experts x 3 h 1408 + router + shared expert 3 h 5632 + shared gate h + q/k/v bias 3 h
    "qwen2_moe": (QWEN15_MOE_CONFIG, 2 * 151936 * 2048
                  + 24 * (4 * 2048 * 2048 + 3 * 2048 + 60 * 3 * 2048 * 1408 + 2048 * 60 + 3 * 2048 * 5632
                          + 2048 + 2 * 2048) + 2048),
    "qwen3_moe": (QWEN3_30B_A3B_CONFIG, 2 * 151936 * 2048
                  + 48 * (2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 128 * 3 * 2048 * 768 + 2048 * 128
                          + 2 * 2048) + 2048),
}


def test_hand_totals_match_published_where_known():
    assert HF_CASES["gpt2"][1] == 124_439_808
    assert HF_CASES["llama"][1] == 8_030_261_248
    assert HF_CASES["mistral"][1] == 7_241_732_096
    assert HF_CASES["qwen2"][1] == 7_615_616_512
    assert HF_CASES["mixtral"][1] == 46_702_792_704
    assert HF_CASES["qwen3_moe"][1] == 30_532_122_624
    assert HF_CASES["qwen2_moe"][1] == 14_315_784_192  # Qwen1.5-MoE-A2.7B: "14.3B"


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_unmodified_hf_config_json_loads_and_counts(case, tmp_path):
    config, total = HF_CASES[case]
    d = tmp_path / case
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config, indent=2))
    spec = load_model_spec(str(d / "config.json"))
    assert spec.name == case  # a file named config.json takes its directory's name
    assert parameter_count(spec) == total
    assert meta_numel(spec) == total
    assert load_model_spec(str(d)) == spec  # the directory works too


def test_family_details_from_hf_configs():
    s = load_model_spec(dict(QWEN25_7B_CONFIG))
    assert (s.family, s.qkv_bias, s.o_bias, s.num_kv_heads, s.head_dim) == ("llama", True, False, 4, 128)
    s = load_model_spec(dict(QWEN3_06B_CONFIG))
    assert s.qk_norm and s.tie_word_embeddings and s.head_dim == 128 and s.hidden_size == 1024
    assert s.rope_theta == 1e6 and isinstance(s.rope_theta, float)
    s = load_model_spec(dict(GPT2_CONFIG))
    assert (s.family, s.norm_type, s.activation, s.tie_word_embeddings) == ("gpt", "layernorm", "gelu_tanh", True)
    assert s.qkv_bias and s.o_bias and s.mlp_bias and s.dropout == 0.1
    s = load_model_spec(dict(MIXTRAL_8X7B_CONFIG))
    assert (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size) == (8, 2, 14336)
    assert s.norm_topk_prob and s.shared_expert_intermediate_size == 0 and all(s.moe_layers)
    s = load_model_spec(dict(QWEN15_MOE_CONFIG))
    assert s.shared_expert_intermediate_size == 5632 and s.shared_expert_gate and s.qkv_bias
    assert not s.norm_topk_prob and s.num_experts == 60
    s = load_model_spec(dict(QWEN3_30B_A3B_CONFIG))
    assert s.qk_norm and s.norm_topk_prob and not s.qkv_bias and s.shared_expert_intermediate_size == 0


def test_gpt2_hidden_size_aliases_and_n_inner():
    a = load_model_spec({"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4,
                         "n_positions": 64, "n_inner": 96})
    b = load_model_spec({"model_type": "gpt2", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "max_position_embeddings": 64, "n_inner": 96})
    assert a == b and a.intermediate_size == 96
    # 100*32 + 64*32 + 2*(4*32 + 3*32*32 + 96 + 32*32 + 32 + 32*96 + 96 + 96*32 + 32) + 2*32
    assert parameter_count(a) == 100 * 32 + 64 * 32 + 2 * (4 * 32 + 3 * 32 * 32 + 96 + 32 * 32 + 32
                                                              + 32 * 96 + 96 + 96 * 32 + 32) + 2 * 32


def test_qwen_moe_sparse_step_and_mlp_only_layers(tmp_path):
    cfg = {**QWEN15_MOE_CONFIG, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
           "shared_expert_intermediate_size": 24, "num_hidden_layers": 6, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 64,
           "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    p = tmp_path / "small-moe.yaml"
    p.write_text(yaml.safe_dump(cfg))
    s = load_model_spec(str(p))
    assert s.name == "small-moe"
    # sparse where (i + 1) % 2 == 0 and i not in [3]
    assert s.moe_layers == (False, True, False, False, False, True)
    with torch.device("meta"):
        m = build_model(s)
    assert type(m.layers["1"].mlp).__name__ == "MoE"
    assert type(m.layers["0"].mlp).__name__ == "MLP" and m.layers["0"].mlp.up_proj.out_features == 48
    # q 32->32, k/v 32->16, o 32->32, q/k/v bias 32 + 16 + 16
    attn = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 32 + 2 * 16
    dense = 3 * 32 * 48
    moe = 4 * 3 * 32 * 16 + 32 * 4 + 3 * 32 * 24 + 32
    total = 2 * 64 * 32 + 4 * (attn + dense + 2 * 32) + 2 * (attn + moe + 2 * 32) + 32
    assert parameter_count(s) == total == meta_numel(s)


def test_llama_attention_and_mlp_bias():
    cfg = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 4, "attention_bias": True, "mlp_bias": True}
    s = load_model_spec(cfg)
    assert s.qkv_bias and s.o_bias and s.mlp_bias and s.num_kv_heads == 4
    per_layer = 4 * 32 * 32 + 4 * 32 + 3 * 32 * 64 + 2 * 64 + 32 + 2 * 32
    assert parameter_count(s) == 2 * 64 * 32 + per_layer + 32 == meta_numel(s)


def test_nested_rope_parameters():
    cfg = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "rope_theta"}
    cfg["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    assert load_model_spec(cfg).rope_theta == 500000.0


def test_overrides():
    s = load_model_spec("llama3-8b", num_layers=2, attn_impl="eager")
    assert s.num_layers == 2 and s.moe_layers == (False, False) and s.attn_impl == "eager"
    assert load_model_spec("tiny-gpt", dropout=0.2).dropout == 0.2
    assert load_model_spec(s) is s
    with pytest.raises(UserError, match="unknown model spec field"):
        load_model_spec("llama3-8b", num_layer=2)
    with pytest.raises(UserError, match="num_layers"):
        load_model_spec("llama3-8b", num_layers="2")
    with pytest.raises(UserError, match="attn_impl"):
        load_model_spec("llama3-8b", attn_impl="flash")


# ----------------------------------------------------------------------------------------------
# Errors: one clear line naming what and where.


def test_unknown_catalog_name_suggests_close_names():
    with pytest.raises(UserError) as e:
        load_model_spec("llama3-8")
    msg = str(e.value)
    assert "'llama3-8'" in msg and "did you mean" in msg and "llama3-8b" in msg and "\n" not in msg
    with pytest.raises(UserError, match="catalog names: gpt2"):
        load_model_spec("zzzzzzzz")


def test_unreadable_files(tmp_path):
    with pytest.raises(UserError, match="cannot read model config .*nope.json"):
        load_model_spec(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="bad.json.*not valid JSON"):
        load_model_spec(str(bad))
    with pytest.raises(UserError, match="has no config.json"):
        load_model_spec(str(tmp_path))
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="expected a mapping"):
        load_model_spec(str(lst))


def test_missing_required_key_names_file_and_key(tmp_path):
    cfg = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "hidden_size"}
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=r"cfg\.json.*missing required key 'hidden_size'"):
        load_model_spec(str(p))
    cfg = {k: v for k, v in QWEN15_MOE_CONFIG.items() if k != "shared_expert_intermediate_size"}
    with pytest.raises(UserError, match="shared_expert_intermediate_size"):
        load_model_spec(cfg)
    cfg = {k: v for k, v in MIXTRAL_8X7B_CONFIG.items() if k != "num_local_experts"}
    with pytest.raises(UserError, match="num_local_experts"):
        load_model_spec(cfg)
    with pytest.raises(UserError, match="model_type"):
        load_model_spec({"hidden_size": 4})


def test_wrong_types_and_values(tmp_path):
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps({**LLAMA3_8B_CONFIG, "hidden_size": "4096"}))
    with pytest.raises(UserError, match=r"cfg\.json.*'hidden_size' must be an integer, got '4096'"):
        load_model_spec(str(p))
    with pytest.raises(UserError, match="'tie_word_embeddings' must be true or false"):
        load_model_spec({**LLAMA3_8B_CONFIG, "tie_word_embeddings": "no"})
    with pytest.raises(UserError, match="'num_hidden_layers' must be an integer"):
        load_model_spec({**LLAMA3_8B_CONFIG, "num_hidden_layers": True})
    with pytest.raises(UserError, match="model_type 'bert' has no ModelSpec"):
        load_model_spec({**LLAMA3_8B_CONFIG, "model_type": "bert"})
    with pytest.raises(UserError, match="not a multiple of num_kv_heads"):
        load_model_spec({**LLAMA3_8B_CONFIG, "num_key_value_heads": 7})
    with pytest.raises(UserError, match="must be positive"):
        load_model_spec({**LLAMA3_8B_CONFIG, "vocab_size": 0})
