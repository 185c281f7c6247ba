"""Llama family (llama 2/3, mistral, qwen2, qwen3): RMSNorm, SwiGLU MLP, RoPE, grouped-query attention.

    x = tok_embeddings(tokens)
    for each block:  x = x + attn(rmsnorm(x), rope);  x = x + mlp(rmsnorm(x))
    logits = lm_head(norm(x))

Options from the spec: q/k/v (and o) bias (qwen2), qk-norm over head_dim (qwen3), explicit head_dim,
tied embeddings. GQA runs through SDPA's enable_gqa (eager: repeat_interleave of k/v heads).
"""

from __future__ import annotations

from torch import nn

from autoparallel.models.layers import MLP, Transformer
from autoparallel.specs import ModelSpec


def _mlp(spec: ModelSpec, layer: int) -> nn.Module:
    return MLP(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias)


class Llama(Transformer):
    def __init__(self, spec: ModelSpec) -> None:
        if spec.family != "llama":
            raise ValueError(f"Llama needs a llama spec, got family {spec.family!r}")
        super().__init__(spec, _mlp)
