"""A per-expert loop as Hugging Face's loop MoEs write it (DBRX): stacked 2-D expert weights, the experts hit found
by `nonzero` on a one_hot mask of the router's top-k, each expert's weights indexed by a 0-d expert number. The
meta device runs neither without the tracer's uniform routing (test_tracer, test_cost_model)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ExpertLoop(nn.Module):
    """x + the top-k experts' SwiGLU-less MLPs (silu), as one block of a loop MoE."""

    def __init__(self, h: int = 16, f: int = 24, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.router = nn.Linear(h, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts * f, h) / h**0.5)
        self.w2 = nn.Parameter(torch.randn(experts * f, h) / f**0.5)
        self.f, self.experts, self.top_k = f, experts, top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(flat)
        mask = F.one_hot(chosen, num_classes=self.experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = e[0]
            slot, token = torch.where(mask[e])
            w1, w2 = (w.view(-1, self.f, flat.shape[-1])[e] for w in (self.w1, self.w2))
            out = out.index_add(0, token, F.silu(flat[token] @ w1.T) @ w2 * weights[token, slot, None])
        return x + out.view_as(x)


class LoopMoE(nn.Module):
    """Token embedding, two ExpertLoop blocks, an output head."""

    def __init__(self, vocab: int = 64, h: int = 32, f: int = 48, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(ExpertLoop(h, f, experts, top_k) for _ in range(2))
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
