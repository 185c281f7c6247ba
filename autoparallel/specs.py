"""Model specs: a catalog name, a Hugging Face config file, or a dict becomes a `ModelSpec`.

Every source goes through one code path, `spec_from_hf_config`, which reads the Hugging Face keys
of each supported `model_type` (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe)
with the defaults the transformers config classes use when a key is absent. The catalog
(catalog/models.yaml) is itself a list of such configs.

A config of any other model_type (gemma, phi3, deepseek_v3, ...) is built by transformers as it is
(`HFConfig`, `autoparallel.hf.causal_lm_from_config`): the model a user hands the trainer. `load_model`
also accepts `package.module:callable` naming any user nn.Module factory.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autoparallel.errors import UserError
from autoparallel.limits import (
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    check_reference,
    load_document,
)

if TYPE_CHECKING:
    from torch import nn

FAMILIES = ("gpt", "llama", "moe")
NORM_TYPES = ("layernorm", "rmsnorm")
ATTN_IMPLS = ("sdpa", "eager")
ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu")

CATALOG_PATH = Path(__file__).parent / "catalog" / "models.yaml"

# model_type -> family. Mistral is llama with other defaults; qwen2 adds q/k/v bias, qwen3 qk-norm.
MODEL_TYPES = {
    "gpt2": "gpt",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "mixtral": "moe",
    "qwen2_moe": "moe",
    "qwen3_moe": "moe",
}

# Defaults of the transformers config classes for keys a config.json may omit.
_MAX_POS_DEFAULT = {
    "llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768,
    "mixtral": 4096 * 32, "qwen2_moe": 32768, "qwen3_moe": 32768,
}
_EPS_DEFAULT = {
    "llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6, "qwen3": 1e-6,
    "mixtral": 1e-5, "qwen2_moe": 1e-6, "qwen3_moe": 1e-6,
}
_ROPE_THETA_DEFAULT = {
    "llama": 10000.0, "mistral": 10000.0, "qwen2": 10000.0, "qwen3": 10000.0,
    "mixtral": 1e6, "qwen2_moe": 10000.0, "qwen3_moe": 10000.0,
}
# ModelSpec integer field -> (smallest, largest) value a real model can have (autoparallel/limits.py).
_FIELD_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, MAX_VOCAB), "hidden_size": (1, MAX_HIDDEN), "num_layers": (1, MAX_LAYERS),
    "num_heads": (1, MAX_HEADS), "num_kv_heads": (1, MAX_HEADS), "head_dim": (1, MAX_HEAD_DIM),
    "intermediate_size": (0, MAX_INTERMEDIATE), "max_position_embeddings": (1, MAX_POSITIONS),
    "num_experts": (0, MAX_EXPERTS), "num_experts_per_tok": (0, MAX_EXPERTS),
    "moe_intermediate_size": (0, MAX_INTERMEDIATE), "shared_expert_intermediate_size": (0, MAX_INTERMEDIATE),
}
# Hugging Face config key -> the ModelSpec field it fills, so each key is range-checked when read (before
# a bad value reaches a division or a `(False,) * layers`).
_HF_KEY_FIELD = {
    "n_embd": "hidden_size", "hidden_size": "hidden_size", "n_layer": "num_layers",
    "num_hidden_layers": "num_layers", "n_head": "num_heads", "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim", "vocab_size": "vocab_size",
    "n_inner": "intermediate_size", "intermediate_size": "intermediate_size",
    "n_positions": "max_position_embeddings", "max_position_embeddings": "max_position_embeddings",
    "n_ctx": "max_position_embeddings", "num_local_experts": "num_experts", "num_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_tok", "moe_intermediate_size": "moe_intermediate_size",
    "shared_expert_intermediate_size": "shared_expert_intermediate_size",
}
_ACT_ALIASES = {
    "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "silu": "silu", "swish": "silu", "relu": "relu",
}


_POSITIVE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "max_position_embeddings")


def _check_bounds(what: str, field: str, v: int) -> None:
    lo, hi = _FIELD_BOUNDS[field]
    if field in _POSITIVE_FIELDS and v <= 0:
        raise UserError(f"{what} must be positive, got {v}; fix the config")
    if not lo <= v <= hi:
        raise UserError(f"{what} = {v:,} is outside {lo}..{hi:,} (the limits in autoparallel/limits.py, well "
                        f"beyond published models); fix the config")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one transformer; every field is a plain value (hashable, serializable).

    `head_dim` is explicit because it need not equal hidden_size / num_heads (qwen3). For the moe
    family `intermediate_size` is the MLP width of dense layers (those with moe_layers[i] False) and
    `moe_intermediate_size` that of each routed expert.
    """

    name: str
    family: str                      # gpt | llama | moe
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False            # RMSNorm over head_dim on q and k (qwen3)
    norm_type: str = "rmsnorm"       # layernorm (with bias) | rmsnorm (no bias)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0      # unused by gpt (learned positions)
    activation: str = "silu"         # gpt MLP activation; llama/moe MLPs are SwiGLU (silu)
    attn_impl: str = "sdpa"          # sdpa | eager (materialized scores, gpt attention dropout)
    dropout: float = 0.0             # gpt only: embedding, attention-prob and residual dropout
    # MoE (family "moe")
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0   # 0: no shared expert
    shared_expert_gate: bool = False           # shared expert output times sigmoid(Linear h->1)
    norm_topk_prob: bool = False               # renormalize the top-k routing weights to sum 1
    moe_layers: tuple[bool, ...] = ()          # per layer: routed experts (True) or dense MLP

    def __post_init__(self) -> None:
        where = f"model spec {self.name!r}"
        if self.family not in FAMILIES:
            raise UserError(f"{where}: family {self.family!r} is not one of {', '.join(FAMILIES)}")
        for key in _FIELD_BOUNDS:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int):
                raise UserError(f"{where}: {key} must be an integer, got {v!r}")
            _check_bounds(f"{where}: {key}", key, v)
        for key, hi in (("norm_eps", 1.0), ("rope_theta", 1e12)):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= hi):
                raise UserError(f"{where}: {key} must be a number in (0, {hi:g}], got {v!r}; fix the config")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"{where}: num_heads {self.num_heads} is not a multiple of num_kv_heads "
                            f"{self.num_kv_heads}; grouped-query attention needs whole groups")
        if self.family == "gpt" and self.num_kv_heads != self.num_heads:
            raise UserError(f"{where}: gpt attention needs num_kv_heads == num_heads")
        if self.family == "gpt" and self.num_heads * self.head_dim != self.hidden_size:
            raise UserError(f"{where}: gpt needs num_heads * head_dim == hidden_size")
        if self.head_dim % 2 and self.family != "gpt":
            raise UserError(f"{where}: head_dim {self.head_dim} must be even for rotary embeddings")
        if self.norm_type not in NORM_TYPES:
            raise UserError(f"{where}: norm_type {self.norm_type!r} is not one of {', '.join(NORM_TYPES)}")
        if self.attn_impl not in ATTN_IMPLS:
            raise UserError(f"{where}: attn_impl {self.attn_impl!r} is not one of {', '.join(ATTN_IMPLS)}")
        if self.activation not in ACTIVATIONS:
            raise UserError(f"{where}: activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"{where}: dropout must be in [0, 1), got {self.dropout}")
        if len(self.moe_layers) != self.num_layers:
            raise UserError(f"{where}: moe_layers has {len(self.moe_layers)} entries for "
                            f"{self.num_layers} layers")
        if self.family == "moe":
            if self.num_experts <= 0 or not 0 < self.num_experts_per_tok <= self.num_experts:
                raise UserError(f"{where}: needs num_experts > 0 and 0 < num_experts_per_tok <= "
                                f"num_experts, got {self.num_experts} and {self.num_experts_per_tok}")
            if self.moe_intermediate_size <= 0:
                raise UserError(f"{where}: moe_intermediate_size must be positive")
            if self.shared_expert_gate and not self.shared_expert_intermediate_size:
                raise UserError(f"{where}: shared_expert_gate needs a shared expert "
                                "(shared_expert_intermediate_size > 0)")
        elif any(self.moe_layers) or self.num_experts:
            raise UserError(f"{where}: family {self.family!r} has no experts; use family 'moe'")
        if (self.intermediate_size <= 0 and (self.family != "moe" or not all(self.moe_layers))):
            raise UserError(f"{where}: intermediate_size must be positive")

    @property
    def is_moe(self) -> bool:
        return self.family == "moe"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        return d


# ---------------------------------------------------------------------------------------------
# Hugging Face config -> ModelSpec


class _Cfg:
    """Typed access to one config dict; errors name the source and the key."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw, self.source = raw, source

    def _get(self, keys: tuple[str, ...], default: Any, required: bool) -> tuple[str, Any]:
        for k in keys:
            if k in self.raw and self.raw[k] is not None:
                return k, self.raw[k]
        if required:
            names = " or ".join(repr(k) for k in keys)
            raise UserError(f"{self.source}: missing required key {names}; add it to the config")
        return keys[0], default

    def _bad(self, key: str, value: Any, want: str) -> UserError:
        return UserError(f"{self.source}: key {key!r} must be {want}, got {value!r} "
                         f"({type(value).__name__}); fix the config")

    def int(self, *keys: str, default: int | None = None, required: bool = False) -> int:
        key, v = self._get(keys, default, required or default is None)
        # A float like 4096.0 is accepted when integral (YAML/JSON writers sometimes emit it).
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(key, v, "an integer")
        field = _HF_KEY_FIELD.get(key)
        if field is not None:
            _check_bounds(f"{self.source}: key {key!r}", field, v)
        return v

    def float(self, *keys: str, default: float, positive: bool = False) -> float:
        key, v = self._get(keys, default, False)
        if isinstance(v, str):  # PyYAML 1.1 reads 1e-5 (no dot) as a string, as the profile loader allows
            try:
                v = float(v)
            except ValueError:
                raise self._bad(key, v, "a number") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._bad(key, v, "a number")
        if positive and v <= 0:
            raise self._bad(key, v, "a positive number")
        return float(v)

    def bool(self, *keys: str, default: bool) -> bool:
        key, v = self._get(keys, default, False)
        if not isinstance(v, bool):
            raise self._bad(key, v, "true or false")
        return v

    def str(self, *keys: str, default: str) -> str:
        key, v = self._get(keys, default, False)
        if not isinstance(v, str):
            raise self._bad(key, v, "a string")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self.raw.get(key) or []
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self._bad(key, v, "a list of integers")
        return v


def _activation(cfg: _Cfg, key: str, default: str) -> str:
    act = cfg.str(key, default=default)
    if act not in _ACT_ALIASES:
        raise UserError(f"{cfg.source}: {key} {act!r} is not supported; use one of "
                        f"{', '.join(sorted(_ACT_ALIASES))}")
    return _ACT_ALIASES[act]


@dataclass(frozen=True)
class HFConfig:
    """A Hugging Face config of a model_type outside MODEL_TYPES (gemma, phi3, deepseek_v3, ...): planned as
    transformers builds it (`autoparallel.hf.causal_lm_from_config`), the model a user hands the trainer,
    rather than through the catalog's own implementation of the MODEL_TYPES families."""
    raw: dict[str, Any]
    name: str
    source: str

    def check(self) -> None:
        """Each size key a ModelSpec also reads is an integer within autoparallel/limits.py's bounds, so a
        typo'd million layers is one error line rather than a model built layer by layer."""
        cfg = _Cfg(self.raw, self.source)
        for key in _HF_KEY_FIELD:
            if self.raw.get(key) is not None:
                cfg.int(key)


def hf_config_of(ref: Any) -> HFConfig | None:
    """`ref` (a config file or directory, or a dict of config keys) as an HFConfig when its model_type is one
    the catalog does not implement; None for everything else (catalog names and MODEL_TYPES configs become
    ModelSpecs, `package.module:callable` a user module)."""
    if isinstance(ref, dict):
        raw, name = ref, str(ref.get("name") or ref.get("model_type") or "custom")
        source = f"model config {name!r}"
    elif isinstance(ref, (str, Path)) and not _is_callable_ref(str(ref)):
        raw, name, source = _resolve(str(ref))
    else:
        return None
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type or model_type in MODEL_TYPES:
        return None
    config = HFConfig(raw, name, source)
    config.check()
    return config


def spec_from_hf_config(raw: dict[str, Any], name: str, source: str | None = None) -> ModelSpec:
    """Read the Hugging Face config keys of `raw` (unknown keys are ignored)."""
    source = source or f"model config {name!r}"
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping of config keys, got {type(raw).__name__}")
    cfg = _Cfg(raw, source)
    model_type = cfg.str("model_type", default="")
    if not model_type:
        raise UserError(f"{source}: missing required key 'model_type' (one of {', '.join(MODEL_TYPES)})")
    if model_type not in MODEL_TYPES:  # (load_model builds the others with transformers: hf_config_of)
        raise UserError(f"{source}: model_type {model_type!r} has no ModelSpec; those with one: "
                        f"{', '.join(MODEL_TYPES)} (plan the others from their config file or as a module)")
    family = MODEL_TYPES[model_type]
    if family == "gpt":
        return _gpt2_spec(cfg, name)
    return _llama_like_spec(cfg, name, model_type, family)


def _gpt2_spec(cfg: _Cfg, name: str) -> ModelSpec:
    # GPT2Config's attribute_map makes hidden_size/num_hidden_layers/... aliases of the n_* keys.
    hidden = cfg.int("n_embd", "hidden_size", required=True)
    layers = cfg.int("n_layer", "num_hidden_layers", required=True)
    heads = cfg.int("n_head", "num_attention_heads", required=True)
    if hidden % heads:
        raise UserError(f"{cfg.source}: n_embd {hidden} is not divisible by n_head {heads}")
    return ModelSpec(
        name=name, family="gpt",
        vocab_size=cfg.int("vocab_size", required=True),
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=cfg.int("n_inner", "intermediate_size", default=4 * hidden),
        max_position_embeddings=cfg.int("n_positions", "max_position_embeddings", "n_ctx", required=True),
        tie_word_embeddings=cfg.bool("tie_word_embeddings", default=True),
        qkv_bias=True, o_bias=True, mlp_bias=True, qk_norm=False,
        norm_type="layernorm",
        norm_eps=cfg.float("layer_norm_epsilon", "layer_norm_eps", default=1e-5, positive=True),
        activation=_activation(cfg, "activation_function", "gelu_new"),
        attn_impl=_attn_impl(cfg),
        # One rate for all three dropouts (Megatron's hidden/attention dropout are usually equal).
        dropout=cfg.float("resid_pdrop", "dropout", default=0.0),
        moe_layers=(False,) * layers,
    )


def _attn_impl(cfg: _Cfg) -> str:
    impl = cfg.str("attn_impl", "attn_implementation", default="sdpa")
    return "sdpa" if impl in ("sdpa", "flash_attention_2", "flex_attention") else impl


def _llama_like_spec(cfg: _Cfg, name: str, model_type: str, family: str) -> ModelSpec:
    hidden = cfg.int("hidden_size", required=True)
    layers = cfg.int("num_hidden_layers", required=True)
    heads = cfg.int("num_attention_heads", required=True)
    kv_heads = cfg.int("num_key_value_heads", default=heads)
    # head_dim is explicit in qwen3 (128 with hidden 2048, 32 heads) and newer llama/mistral configs.
    head_dim = cfg.int("head_dim", default=hidden // heads)
    if cfg.raw.get("head_dim") is None and hidden % heads:
        raise UserError(f"{cfg.source}: hidden_size {hidden} is not divisible by num_attention_heads "
                        f"{heads}; give head_dim explicitly")
    # Qwen2/Qwen2-MoE attention hard-codes bias on q/k/v (not o); llama/qwen3 'attention_bias'
    # puts bias on all four projections; mistral/mixtral have none.
    attention_bias = cfg.bool("attention_bias", default=False) if model_type in (
        "llama", "qwen3", "qwen3_moe") else False
    qkv_bias = attention_bias or model_type in ("qwen2", "qwen2_moe")
    # transformers >= 4.5x nests rope_theta under rope_parameters; older configs have it top level.
    rope_params = cfg.raw.get("rope_parameters")
    rope_default = _ROPE_THETA_DEFAULT[model_type]
    if isinstance(rope_params, dict) and "rope_theta" in rope_params and "rope_theta" not in cfg.raw:
        rope_default = _Cfg(rope_params, cfg.source + " rope_parameters").float(
            "rope_theta", default=rope_default)
    common = dict(
        name=name, family=family,
        vocab_size=cfg.int("vocab_size", required=True),
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=cfg.int("max_position_embeddings", default=_MAX_POS_DEFAULT[model_type]),
        tie_word_embeddings=cfg.bool("tie_word_embeddings", default=False),
        qkv_bias=qkv_bias, o_bias=attention_bias,
        mlp_bias=cfg.bool("mlp_bias", default=False) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        norm_type="rmsnorm",
        norm_eps=cfg.float("rms_norm_eps", default=_EPS_DEFAULT[model_type], positive=True),
        rope_theta=cfg.float("rope_theta", default=rope_default, positive=True),
        activation=_activation(cfg, "hidden_act", "silu"),
        attn_impl=_attn_impl(cfg),
    )
    if common["activation"] != "silu":
        raise UserError(f"{cfg.source}: hidden_act must be silu for {model_type} (SwiGLU MLP)")
    if family == "llama":
        return ModelSpec(intermediate_size=cfg.int("intermediate_size", required=True),
                         moe_layers=(False,) * layers, **common)
    if model_type == "mixtral":
        # Mixtral: every layer is sparse, intermediate_size is the expert width, routing weights are
        # a softmax over the top-k logits (== renormalized top-k of the full softmax).
        ffn = cfg.int("intermediate_size", required=True)
        return ModelSpec(
            intermediate_size=ffn, moe_intermediate_size=ffn,
            num_experts=cfg.int("num_local_experts", "num_experts", required=True),
            num_experts_per_tok=cfg.int("num_experts_per_tok", required=True),
            norm_topk_prob=True, moe_layers=(True,) * layers, **common)
    # qwen2_moe / qwen3_moe: layer i is sparse unless listed in mlp_only_layers or off the
    # decoder_sparse_step grid (transformers: (i + 1) % decoder_sparse_step == 0).
    num_experts = cfg.int("num_experts", "num_local_experts", required=True)
    step = cfg.int("decoder_sparse_step", default=1)
    if step <= 0:
        raise UserError(f"{cfg.source}: decoder_sparse_step must be positive, got {step}")
    mlp_only = set(cfg.int_list("mlp_only_layers"))
    moe_layers = tuple(i not in mlp_only and num_experts > 0 and (i + 1) % step == 0 for i in range(layers))
    shared = (cfg.int("shared_expert_intermediate_size", required=True)
              if model_type == "qwen2_moe" else 0)
    return ModelSpec(
        intermediate_size=cfg.int("intermediate_size", required=not all(moe_layers), default=0),
        moe_intermediate_size=cfg.int("moe_intermediate_size", required=True),
        num_experts=num_experts,
        num_experts_per_tok=cfg.int("num_experts_per_tok", required=True),
        shared_expert_intermediate_size=shared, shared_expert_gate=shared > 0,
        norm_topk_prob=cfg.bool("norm_topk_prob", default=False),
        moe_layers=moe_layers, **common)


# ---------------------------------------------------------------------------------------------
# Catalog and loading


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict[str, Any]]:
    with open(CATALOG_PATH) as f:
        data = yaml.safe_load(f)
    return data


def list_catalog() -> list[str]:
    """Names of the built-in models, in catalog order."""
    return list(_catalog())


def _read_config_file(path: Path) -> dict[str, Any]:
    data = load_document(path, "model config")
    if not isinstance(data, dict):
        raise UserError(f"model config {str(path)!r}: expected a mapping of config keys, "
                        f"got {type(data).__name__}")
    return data


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".json", ".yaml", ".yml")) or "/" in ref or "\\" in ref or ref.startswith(".")


def load_model_spec(ref: str | dict | ModelSpec, **overrides: Any) -> ModelSpec:
    """A ModelSpec from a catalog name, a YAML/JSON HF config path (or a directory holding
    config.json), a dict of HF config keys, or a ModelSpec; `overrides` replace ModelSpec fields."""
    if isinstance(ref, ModelSpec):
        spec = ref
    elif isinstance(ref, dict):
        name = ref.get("name") if isinstance(ref.get("name"), str) else ref.get("model_type", "custom")
        spec = spec_from_hf_config(ref, name=str(name))
    elif isinstance(ref, (str, Path)):
        raw, name, source = _resolve(str(ref))
        spec = spec_from_hf_config(raw, name=name, source=source)
    else:
        raise UserError(f"model reference must be a name, path, dict or ModelSpec, got {type(ref).__name__}")
    return _apply_overrides(spec, overrides) if overrides else spec


def _resolve(ref: str) -> tuple[dict[str, Any], str, str]:
    """(config keys, model name, source for messages) of a catalog name, a config file or a directory
    holding config.json."""
    check_reference(ref, "model")
    path = Path(ref).expanduser()
    catalog = _catalog()
    if ref in catalog:
        return catalog[ref], ref, f"catalog model {ref!r}"
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise UserError(f"model directory {ref!r} has no config.json; pass the config file itself")
        return _read_config_file(cfg), path.resolve().name, f"model config {str(cfg)!r}"
    if path.exists() or _looks_like_path(ref):
        name = path.parent.resolve().name if path.stem == "config" else path.stem
        return _read_config_file(path), name or path.stem, f"model config {ref!r}"
    close = difflib.get_close_matches(ref, list(catalog), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"catalog names: {', '.join(catalog)}"
    raise UserError(f"unknown model {ref!r}: not a catalog name, config file or package.module:callable; {hint}")


def _apply_overrides(spec: ModelSpec, overrides: dict[str, Any]) -> ModelSpec:
    fields = {f.name: f for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise UserError(f"unknown model spec field(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
    overrides = dict(overrides)
    if "moe_layers" in overrides:
        overrides["moe_layers"] = tuple(bool(x) for x in overrides["moe_layers"])
    elif "num_layers" in overrides:
        # A uniform layer pattern extends to the new depth; a mixed one must be given explicitly.
        if len(set(spec.moe_layers)) > 1:
            raise UserError(f"model {spec.name!r} mixes dense and MoE layers; pass moe_layers with "
                            "num_layers")
        first = spec.moe_layers[0] if spec.moe_layers else False
        overrides["moe_layers"] = (first,) * int(overrides["num_layers"])
    for key, value in overrides.items():
        want = fields[key].type
        ok = {"int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "bool": isinstance(value, bool), "str": isinstance(value, str)}.get(str(want), True)
        if not ok:
            raise UserError(f"model spec override {key}={value!r}: expected {want}")
        if str(want) == "float":
            overrides[key] = float(value)
    return dataclasses.replace(spec, **overrides)


def parameter_count(spec: ModelSpec) -> int:
    """Exact number of parameters of build_model(spec), tied weights counted once."""
    h, V, d = spec.hidden_size, spec.vocab_size, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    norm = 2 * h if spec.norm_type == "layernorm" else h
    attn = h * q + 2 * h * kv + q * h
    attn += (q + 2 * kv) * spec.qkv_bias + h * spec.o_bias + 2 * d * spec.qk_norm

    def mlp(f: int) -> int:
        if spec.family == "gpt":  # up + down
            return 2 * h * f + (f + h) * spec.mlp_bias
        return 3 * h * f + (2 * f + h) * spec.mlp_bias  # gate + up + down (SwiGLU)

    moe = h * spec.num_experts + spec.num_experts * 3 * h * spec.moe_intermediate_size
    if spec.shared_expert_intermediate_size:
        moe += 3 * h * spec.shared_expert_intermediate_size + h * spec.shared_expert_gate
    total = V * h + (spec.max_position_embeddings * h if spec.family == "gpt" else 0)
    total += sum(2 * norm + attn + (moe if is_moe else mlp(spec.intermediate_size))
                 for is_moe in spec.moe_layers)
    total += norm + (0 if spec.tie_word_embeddings else V * h)
    return total


def load_model(ref: str | dict | ModelSpec) -> tuple[nn.Module, ModelSpec | None]:
    """Build a model: a spec reference (see load_model_spec) or `package.module:callable`
    returning an nn.Module (spec None then). Built on the current default device, so
    `with torch.device("meta"): load_model(...)` allocates no parameter memory."""
    if _is_callable_ref(ref):
        return _load_callable(ref), None
    hf = hf_config_of(ref)
    if hf is not None:
        from autoparallel.hf import causal_lm_from_config
        return causal_lm_from_config(hf), None
    from autoparallel.models import build_model

    spec = load_model_spec(ref)
    return build_model(spec), spec


def _is_callable_ref(ref: Any) -> bool:
    if not isinstance(ref, str):
        return False
    check_reference(ref, "model")
    return ":" in ref and not Path(ref).exists() and ref not in _catalog()


def spec_of(ref: Any) -> ModelSpec | None:
    """The ModelSpec behind a model reference (read and validated, no model built), or the `spec`
    attribute of a module; None for a `package.module:callable` or a user module."""
    if isinstance(ref, (str, dict, ModelSpec)) and not _is_callable_ref(ref):
        return None if hf_config_of(ref) is not None else load_model_spec(ref)
    spec = getattr(ref, "spec", None)
    return spec if isinstance(spec, ModelSpec) else None


def check_seq_len(spec: ModelSpec | None, seq_len: int) -> None:
    """A model with a learned position table (gpt) has no position beyond it: refuse longer sequences."""
    if spec is not None and spec.family == "gpt" and seq_len > spec.max_position_embeddings:
        raise UserError(f"--seq-len {seq_len}: model {spec.name!r} has learned positions for "
                        f"{spec.max_position_embeddings} tokens only; use --seq-len <= "
                        f"{spec.max_position_embeddings}")


def _load_callable(ref: str) -> nn.Module:
    from torch import nn

    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise UserError(f"model {ref!r}: expected package.module:callable")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:  # any import-time failure of user code (sys.exit too) is bad input
        raise UserError(f"model {ref!r}: cannot import module {module_name!r}: "
                        f"{type(e).__name__}: {e}; check the name and PYTHONPATH") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"model {ref!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise UserError(f"model {ref!r}: {attr!r} is not callable")
    try:
        model = obj()
    except (Exception, SystemExit) as e:  # a factory calling sys.exit(3) must not end the CLI silently
        raise UserError(f"model {ref!r}: calling {attr}() failed: {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"model {ref!r}: {attr}() returned {type(model).__name__}, not a torch.nn.Module")
    return model
