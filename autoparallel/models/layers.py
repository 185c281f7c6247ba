"""Building blocks shared by the gpt, llama and moe families (layout: docs/architecture.md).

Parallelism-friendly by construction: attention infers its local head count from tensor shapes, so
column-sharded q/k/v projections (tensor parallelism) work unchanged; the root tolerates deleted
pieces (tok_embeddings / norm / lm_head set to None) so a pipeline stage is the model minus what
other stages own (torchtitan's splitting trick); blocks live in a ModuleDict keyed "0".."L-1" so
parameter names stay stable when layers are deleted.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from autoparallel.specs import ModelSpec

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [S, head_dim] float32


def make_norm(spec: ModelSpec, dim: int) -> nn.Module:
    if spec.norm_type == "layernorm":
        return nn.LayerNorm(dim, eps=spec.norm_eps)
    return nn.RMSNorm(dim, eps=spec.norm_eps)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device,
                 positions: torch.Tensor | None = None) -> Rope:
    """Rotary tables for positions 0..seq_len-1 (or the given positions [S], e.g. a context-parallel
    rank's load-balanced chunks), in float32 (computed per forward: cheap, and no buffer to
    re-initialize after `to_empty`)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    pos = (torch.arange(seq_len, device=device, dtype=torch.float32) if positions is None
           else positions.to(device=device, dtype=torch.float32))
    angles = torch.outer(pos, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # HF "rotate_half" layout
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x: [B, S, H, D]. Rotates in float32 and casts back (bf16 rotation loses position detail)."""
    cos, sin = (t[:, None, :] for t in rope)  # [S, 1, D] broadcasts over heads
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).type_as(x)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout as one fused kernel with a 1-byte mask (torch.native_dropout), what GPUs
    run; F.dropout decomposes into bernoulli + mul with a 16-bit mask off-GPU, which would mis-state
    the activation memory the tracer measures."""
    return torch.native_dropout(x, p, True)[0]


class Attention(nn.Module):
    """Causal self-attention with GQA, optional q/k/v/o bias, qk-norm and rotary embeddings."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.head_dim = d
        self.q_proj = nn.Linear(h, spec.num_heads * d, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * d, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * d, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(spec.num_heads * d, h, bias=spec.o_bias)
        self.q_norm = nn.RMSNorm(d, eps=spec.norm_eps) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(d, eps=spec.norm_eps) if spec.qk_norm else None
        self.attn_impl = spec.attn_impl
        self.dropout = spec.dropout
        # Set by the trainer for selective recompute (eager attention only: flash attention keeps
        # no seq x seq activations, so there is nothing to recompute).
        self.recompute_core = False

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        B, S, _ = x.shape
        # -1: the local head count (num_heads / tp under tensor parallelism), never the config's.
        q = self.q_proj(x).view(B, S, -1, self.head_dim)
        k = self.k_proj(x).view(B, S, -1, self.head_dim)
        v = self.v_proj(x).view(B, S, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        p = self.dropout if self.training else 0.0
        if self.attn_impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                 enable_gqa=q.shape[1] != k.shape[1])
        elif self.recompute_core and torch.is_grad_enabled():
            # Megatron's selective recompute: keep q, k, v; redo the seq x seq core in backward.
            out = torch.utils.checkpoint.checkpoint(self._eager_core, q, k, v, p, use_reentrant=False)
        else:
            out = self._eager_core(q, k, v, p)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))

    def _eager_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
        """Eager attention as Megatron-LM runs it: materialized scores, fused scale-mask-softmax, dropout."""
        B, _, S, _ = q.shape
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        H = q.shape[1]
        # One GEMM computes scale * q @ k^T + causal bias (Megatron's baddbmm + fused mask);
        # softmax stays in the activation dtype like its fused kernel (fp32 math inside).
        bias = torch.full((S, S), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
        scores = torch.baddbmm(bias.unsqueeze(0), q.reshape(B * H, S, -1), k.reshape(B * H, S, -1).transpose(1, 2),
                               alpha=1.0 / math.sqrt(self.head_dim))
        probs = scores.softmax(dim=-1)
        if p > 0:
            probs = dropout(probs, p)
        return torch.bmm(probs, v.reshape(B * H, S, -1)).view(B, H, S, -1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (llama, and the dense/shared MLPs of moe)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's gelu_new
    "silu": F.silu,
    "relu": F.relu,
}


class GeluMLP(nn.Module):
    """down(act(up(x))) (gpt)."""

    def __init__(self, dim: int, hidden: int, bias: bool = True, activation: str = "gelu") -> None:
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(_ACTS[self.activation](self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(attn_norm(x)), then + mlp(mlp_norm(x)).

    Residual dropout (gpt with dropout > 0) is applied to each branch before the add, as Megatron."""

    def __init__(self, spec: ModelSpec, mlp: nn.Module) -> None:
        super().__init__()
        self.attn_norm = make_norm(spec, spec.hidden_size)
        self.attn = Attention(spec)
        self.mlp_norm = make_norm(spec, spec.hidden_size)
        self.mlp = mlp
        self.dropout = spec.dropout

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.dropout) if self.training and self.dropout > 0 else x

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        x = x + self._drop(self.attn(self.attn_norm(x), rope))
        return x + self._drop(self.mlp(self.mlp_norm(x)))


# Parameters that write into the residual stream get std / sqrt(2 * num_layers) (GPT-2, Megatron).
_RESIDUAL_OUT = ("o_proj.weight", "down_proj.weight", "experts.w2")


class Transformer(nn.Module):
    """Root of every family: tok_embeddings [+ pos_embeddings] -> layers -> norm -> lm_head.

    forward(tokens [B, S] int64) -> logits [B, S, V]. Pipeline stages set pieces to None:
    tok_embeddings None -> the input is hidden states [B, S, h]; norm / lm_head None -> returns
    hidden states. Materializing a meta model: `model.to_empty(device=...)`, then
    `model.init_weights()` (re-ties embeddings, which `to_empty` unties, and initializes all).
    """

    def __init__(self, spec: ModelSpec, make_mlp: Callable[[ModelSpec, int], nn.Module]) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.tok_embeddings = nn.Embedding(spec.vocab_size, h)
        self.pos_embeddings = nn.Embedding(spec.max_position_embeddings, h) if spec.family == "gpt" else None
        self.layers = nn.ModuleDict({str(i): Block(spec, make_mlp(spec, i)) for i in range(spec.num_layers)})
        self.norm = make_norm(spec, h)
        self.lm_head = nn.Linear(h, spec.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.spec.tie_word_embeddings and self.tok_embeddings is not None and self.lm_head is not None:
            self.lm_head.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """positions [S]: the sequence positions of x's columns (default 0..S-1); context parallelism
        passes each rank's load-balanced chunk positions."""
        S = x.shape[1]
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(S, device=x.device) if positions is None else positions)
            if self.training and self.spec.dropout > 0:
                h = dropout(h, self.spec.dropout)
        else:
            h = x
        rope = None
        if self.spec.family != "gpt":
            rope = rope_cos_sin(S, self.spec.head_dim, self.spec.rope_theta, h.device, positions)
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h

    @torch.no_grad()
    def init_weights(self, seed: int | None = None, std: float = 0.02) -> None:
        """Initialize every parameter: norms weight 1 / bias 0, other biases 0, weights N(0, std),
        residual-output weights N(0, std / sqrt(2 L)).

        seed None draws from the global torch RNG in parameter order (deterministic given
        torch.manual_seed). With a seed, each parameter draws from its own generator seeded by
        (seed, its name), so a pipeline stage (a model with pieces deleted) gets exactly the values
        of the full model for the parameters it holds.
        """
        self.tie_weights()
        out_std = std / math.sqrt(2 * self.spec.num_layers)
        seen: set[int] = set()
        for mod_name, mod in self.named_modules():
            for p_name, p in mod.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                name = f"{mod_name}.{p_name}" if mod_name else p_name
                if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)):
                    p.fill_(1.0 if p_name == "weight" else 0.0)
                elif p_name == "bias":
                    p.zero_()
                else:
                    gen = None
                    if seed is not None and p.device.type != "meta":
                        gen = torch.Generator(device=p.device)
                        gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                    p.normal_(0.0, out_std if name.endswith(_RESIDUAL_OUT) else std, generator=gen)
