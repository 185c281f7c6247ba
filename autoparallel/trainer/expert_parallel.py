"""Expert parallelism: expert weights split over the "ep" mesh dim, tokens moved by all-to-all.

torchtitan's ExpertParallel, applied to a GroupedExperts-style module (docs/architecture.md):
`forward(routed_input [T*k, h] sorted by expert, num_tokens_per_expert [E]) -> [T*k, h]` with stacked
weights `w1 [E, f, h]`, `w2 [E, h, f]`, `w3 [E, f, h]`.

* Weights become DTensors Shard(0) on the ep mesh: rank r holds experts [r*E/ep, (r+1)*E/ep).
* Dispatch: an all-to-all of the per-expert counts tells every rank how many tokens it receives from
  each peer for each of its local experts; an all-to-all of the tokens (autograd-aware: its backward is
  the reverse all-to-all) moves them; a permutation regroups them by local expert.
* The module's own forward then runs on the local weight shards with the local counts.
* Combine: inverse permutation, reverse all-to-all; the router's combine step is unchanged.

HF experts (transformers 5: `forward(hidden_states, top_k_index, top_k_weights)`, stacked
`gate_up_proj [E, 2f, h]`, `down_proj [E, h, f]`) are recognized by that signature; the token copies are
sorted by expert here and the routing weights applied after the combine (see `_hf_forward`).

Gradients: every rank's experts receive contributions from the tokens of all ep peers, so after the
data-parallel mean over dp the expert gradients are still ep times the mean over all dp*ep slices;
`scale_expert_grads` divides them by ep before the optimizer step.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from autoparallel.errors import UserError
from autoparallel.trainer.materialize import local_shard


def _dispatch(routed_input: torch.Tensor, num_tokens_per_expert: torch.Tensor, ep_mesh: DeviceMesh,
              compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Send tokens sorted by (global) expert to the ranks holding their experts, run
    `compute(received sorted by local expert, tokens per local expert)` there and send the results
    back in the original order."""
    group = ep_mesh.get_group()
    ep = ep_mesh.size()
    counts = num_tokens_per_expert.to(torch.int64)
    num_local = counts.numel() // ep
    with torch.no_grad():
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=group)
        input_splits = counts.view(ep, num_local).sum(1).tolist()          # tokens sent to each peer
        by_src = recv_counts.view(ep, num_local)                            # [src rank, local expert]
        output_splits = by_src.sum(1).tolist()                              # tokens received per peer
        starts = (by_src.flatten().cumsum(0) - by_src.flatten()).view(ep, num_local).tolist()
        sizes = by_src.tolist()
        # received order is (src, expert); the experts need (expert, src)
        perm = torch.cat([torch.arange(starts[r][e], starts[r][e] + sizes[r][e], device=routed_input.device)
                          for e in range(num_local) for r in range(ep)] or
                         [torch.zeros(0, dtype=torch.long, device=routed_input.device)])
        local_counts = by_src.sum(0)
    received = all_to_all_single_autograd(routed_input, output_splits, input_splits, group)
    out = compute(received[perm], local_counts)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return all_to_all_single_autograd(out[inverse], input_splits, output_splits, group)


@contextmanager
def _local_experts(module: nn.Module, num_local: int):
    """The module's own forward sees its local expert shards (weights and, for HF experts, the
    `num_experts` it loops over) for the duration of the call."""
    saved = {n: p for n, p in module._parameters.items() if p is not None}
    count = getattr(module, "num_experts", None)
    try:
        for n, p in saved.items():
            module._parameters[n] = local_shard(p)
        if count is not None:
            module.num_experts = num_local
        yield
    finally:
        module._parameters.update(saved)
        if count is not None:
            module.num_experts = count


def _grouped_forward(module: nn.Module, routed_input: torch.Tensor, num_tokens_per_expert: torch.Tensor,
                     ep_mesh: DeviceMesh, orig_forward: Callable) -> torch.Tensor:
    """GroupedExperts: forward(routed_input sorted by expert, num_tokens_per_expert)."""
    def compute(received: torch.Tensor, local_counts: torch.Tensor) -> torch.Tensor:
        with _local_experts(module, local_counts.numel()):
            return orig_forward(received, local_counts)

    return _dispatch(routed_input, num_tokens_per_expert, ep_mesh, compute)


def _hf_forward(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor, ep_mesh: DeviceMesh, orig_forward: Callable,
                num_experts: int) -> torch.Tensor:
    """HF experts (Mixtral, Qwen2/3-MoE in transformers 5): forward(hidden_states [T, h],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, h], the weighted sum over each token's experts.

    Token copies are sorted by expert (stable), dispatched, and run through the module's own forward
    with one expert per copy at weight 1 (exact); the routing weights are applied after the combine
    and the copies summed per token in ascending expert order, as HF's expert loop adds them."""
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=num_experts)

    def compute(received: torch.Tensor, local_counts: torch.Tensor) -> torch.Tensor:
        local_ids = torch.repeat_interleave(torch.arange(local_counts.numel(), device=received.device),
                                            local_counts)[:, None]
        ones = torch.ones(local_ids.shape, dtype=top_k_weights.dtype, device=received.device)
        with _local_experts(module, local_counts.numel()):
            return orig_forward(received, local_ids, ones)

    out = _dispatch(hidden_states[token], counts, ep_mesh, compute)
    weighted = out * top_k_weights.reshape(-1)[order, None].to(out.dtype)
    return torch.zeros_like(hidden_states).index_add(0, token, weighted.to(hidden_states.dtype))


def _is_hf_experts(module: nn.Module) -> bool:
    return "top_k_index" in inspect.signature(module.forward).parameters


def apply_expert_parallel(module: nn.Module, path: str, ep_mesh: DeviceMesh) -> None:
    """Shard `module`'s stacked expert weights over ep_mesh (dim 0) and wrap its forward with
    all-to-all dispatch / combine."""
    ep = ep_mesh.size()
    params = dict(module.named_parameters(recurse=False))
    if not params:
        raise UserError(f"plan placement expert on {path}: {type(module).__name__} holds no stacked expert "
                        f"weights; expert groups hold stacked weights [E, ...] (GroupedExperts w1/w2/w3, HF gate_up_proj/down_proj)")
    num_experts = {p.shape[0] for p in params.values()}
    if len(num_experts) != 1:
        raise UserError(f"plan placement expert on {path}: its weights disagree on the expert count "
                        f"(dim 0 sizes {sorted(num_experts)})")
    (n_exp,) = num_experts
    if n_exp % ep:
        raise UserError(f"plan: {path} has {n_exp} experts, not divisible by ep={ep}; pick an ep that "
                        f"divides the expert count")
    for name, p in params.items():
        module.register_parameter(name, nn.Parameter(distribute_tensor(p, ep_mesh, [Shard(0)]),
                                                     requires_grad=p.requires_grad))
    orig_forward = module.forward
    if _is_hf_experts(module):
        def forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
            return _hf_forward(self, hidden_states, top_k_index, top_k_weights, ep_mesh, orig_forward, n_exp)
    else:
        def forward(self: nn.Module, routed_input: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
            return _grouped_forward(self, routed_input, num_tokens_per_expert, ep_mesh, orig_forward)

    module.forward = types.MethodType(forward, module)


def scale_expert_grads(modules: list[nn.Module], ep: int) -> None:
    """Divide the gradients of ep-sharded expert weights by ep (see the module docstring)."""
    with torch.no_grad():
        for mod in modules:
            for p in mod.parameters():
                if p.grad is not None:
                    p.grad.div_(ep)
