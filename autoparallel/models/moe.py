"""Mixture-of-experts family (mixtral, qwen2_moe, qwen3_moe): llama attention, routed SwiGLU experts.

Per MoE layer, for T = B*S tokens and top-k routing over E experts:
    scores, experts = Router(x)                     # [T, k] each
    sort the T*k token copies by expert (stable)    -> routed_input [T*k, h]
    num_tokens_per_expert = counts of each expert   -> [E]
    out = GroupedExperts(routed_input, num_tokens_per_expert)
    unsort, weight by scores, sum the k copies; + shared_expert(x) * sigmoid(shared_expert_gate(x))
Layers with spec.moe_layers[i] False use a dense SwiGLU MLP of width intermediate_size.

GroupedExperts has torchtitan's interface, so expert parallelism can wrap it with all-to-all
dispatch/combine without touching the routing, and its compute (torch._grouped_mm, one kernel per
projection) has static shapes. Everything is deterministic on CPU (stable sort, fixed summation order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.models.layers import MLP, Transformer
from autoparallel.specs import ModelSpec


class Router(nn.Module):
    def __init__(self, dim: int, num_experts: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, h] -> (weights [T, k] float32, expert ids [T, k] int64)."""
        logits = self.gate(x).float()
        if self.norm_topk_prob:
            # mixtral, qwen3: softmax over the top-k logits (== the renormalized top-k of the full
            # softmax, since softmax is monotonic and the common normalizer cancels).
            top_logits, idx = logits.topk(self.top_k, dim=-1)
            return top_logits.softmax(dim=-1), idx
        # qwen2_moe default: softmax over all experts, keep the top-k probabilities as they are.
        return logits.softmax(dim=-1).topk(self.top_k, dim=-1)


def _local(w: torch.Tensor) -> torch.Tensor:
    # Under expert/tensor parallelism the weights are DTensors; the grouped GEMMs work on the
    # local shard (torchtitan does the same). Duck-typed so non-distributed builds need no import.
    return w.to_local() if hasattr(w, "to_local") else w


def _autocast_dtype(device: str) -> torch.dtype | None:
    """Autocast's dtype on `device`, None where it is off or does not exist (the meta device). A constant to
    Dynamo: torch 2.11 cannot trace torch.amp.is_autocast_available, and the graph break it made split each
    compiled MoE block into six graphs on the GPU (benchmarks/graph_breaks.py, s81). Dynamo guards the autocast
    state a graph was traced under, so a constant here is never stale."""
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


# torch.compiler.assume_constant_result's mark, set without it: the decorator imports Dynamo (1.6 s) into every
# command that builds a model, a plan's included (a test holds the mark to what the decorator sets)
_autocast_dtype._dynamo_marked_constant = True  # type: ignore[attr-defined]


class GroupedExperts(nn.Module):
    """E SwiGLU experts with stacked weights w1 [E, f, h] (gate), w2 [E, h, f] (down), w3 [E, f, h] (up)."""

    def __init__(self, num_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for w in (self.w1, self.w2, self.w3):
            nn.init.normal_(w, std=std)

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """x [N, h] sorted by expert, num_tokens_per_expert [E] (local experts) -> [N, h].

        One grouped GEMM per projection (torchtitan's grouped_mm path): static shapes and no host
        synchronization, since the group boundaries stay on the device as offsets. On meta tensors only
        the shapes matter (the FLOPs of all groups together do not depend on the split)."""
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        dtype = _autocast_dtype(x.device.type)
        if dtype is not None:
            # _grouped_mm is not on autocast's list: cast as autocast casts the inputs of F.linear.
            x, w1, w2, w3 = (t.to(dtype) for t in (x, w1, w2, w3))
        offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=offs)


class MoE(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.num_experts = spec.num_experts
        self.router = Router(h, spec.num_experts, spec.num_experts_per_tok, spec.norm_topk_prob)
        self.experts = GroupedExperts(spec.num_experts, h, spec.moe_intermediate_size)
        shared = spec.shared_expert_intermediate_size
        self.shared_expert = MLP(h, shared) if shared else None
        self.shared_expert_gate = nn.Linear(h, 1, bias=False) if spec.shared_expert_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, h = x.shape
        x = x.reshape(-1, h)
        T = x.shape[0]
        weights, idx = self.router(x)                        # [T, k]
        k = idx.shape[1]
        flat = idx.reshape(-1)                               # copy j belongs to token j // k
        order = torch.argsort(flat, stable=True)             # copies grouped by expert, ties by token
        # Same values as bincount(minlength=E); scatter_add keeps the output shape data-independent,
        # which meta/fake tensors need.
        num_tokens_per_expert = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device)
        num_tokens_per_expert.scatter_add_(0, flat, torch.ones_like(flat))
        routed_out = self.experts(x[order // k], num_tokens_per_expert)
        out = routed_out[torch.argsort(order)].view(T, k, h)  # back to token order
        y = (out * weights.unsqueeze(-1).to(out.dtype)).sum(dim=1)
        if self.shared_expert is not None:
            s = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                s = torch.sigmoid(self.shared_expert_gate(x)) * s
            y = y + s
        return y.view(B, S, h)


def _mlp(spec: ModelSpec, layer: int) -> nn.Module:
    if spec.moe_layers[layer]:
        return MoE(spec)
    return MLP(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias)


class MoETransformer(Transformer):
    def __init__(self, spec: ModelSpec) -> None:
        if spec.family != "moe":
            raise ValueError(f"MoETransformer needs a moe spec, got family {spec.family!r}")
        super().__init__(spec, _mlp)
