"""GPT (GPT-2 / GPT-3 / Megatron GPT): LayerNorm, GELU MLP, learned positions, tied embeddings.

    x = tok_embeddings(tokens) + pos_embeddings(0..S-1)    (then embedding dropout)
    for each block:  x = x + drop(attn(ln(x)));  x = x + drop(mlp(ln(x)))
    logits = lm_head(norm(x))

attn_impl "sdpa" uses fused scaled_dot_product_attention; "eager" materializes the [S, S] scores,
softmax in fp32 and dropout on the attention probabilities (what Megatron's non-flash path saves for
backward, so the cost model sees its memory).
"""

from __future__ import annotations

from torch import nn

from autoparallel.models.layers import GeluMLP, Transformer
from autoparallel.specs import ModelSpec


def _mlp(spec: ModelSpec, layer: int) -> nn.Module:
    return GeluMLP(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias, activation=spec.activation)


class GPT(Transformer):
    def __init__(self, spec: ModelSpec) -> None:
        if spec.family != "gpt":
            raise ValueError(f"GPT needs a gpt spec, got family {spec.family!r}")
        super().__init__(spec, _mlp)
