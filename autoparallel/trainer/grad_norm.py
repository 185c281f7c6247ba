"""Gradient clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_ over the whole parallel model).

Every rank holds a part of the gradients: FSDP2 shards (dp), tensor-parallel shards (tp), expert shards
(ep), its own pipeline stages (pp), and copies of what those dimensions replicate. The global norm is
the norm of the single-process model's gradient, so each element must count once:

    norm^2 = sum over pp ranks of ( sum over groups G of allreduce_{shard dims of G}( sum_{g in G} |g_local|^2 ) )

where a group G is the gradients of one DTensor layout (mesh, placements): its local squares are summed
over the mesh dimensions that shard it and not over those that replicate it. A parameter tied across
pipeline stages (embedding and head) holds the same summed gradient on both stages and counts on the
first only. Then every gradient is scaled by min(1, max_norm / (norm + 1e-6)), torch's coefficient.

This is torchtitan's clip_grad_norm_ (DTensor norms reduced with full_tensor(), then over pp), done on
the local tensors: one foreach norm per group and one scalar all-reduce per shard dimension, instead of
a DTensor dispatch per gradient. Groups are built from the parameters, not from which gradients exist,
so every rank of a group joins the same collectives in the same order (a rank whose experts received no
token contributes zero, it does not skip the all-reduce).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoparallel.errors import UserError

EPS = 1e-6  # torch.nn.utils.clip_grads_with_norm_'s: the coefficient is max_norm / (norm + 1e-6)


def check_max_grad_norm(value: object) -> float | None:
    """The trainer's max_grad_norm: None (no clipping), a positive number, or inf (measure the norm only)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value <= 0:
        raise UserError(f"max_grad_norm: expected a positive number (1.0 is what Hugging Face's Trainer, "
                        f"torchtitan and Megatron-LM use) or None for no clipping, got {value!r}")
    return float(value)


def _shard_groups(p: torch.Tensor) -> tuple:
    """The process groups over which the parameter's local squares are summed: its sharded mesh dims."""
    if not isinstance(p, DTensor):
        return ()
    mesh = p.device_mesh
    groups = []
    for dim, placement in enumerate(p.placements):
        if placement.is_partial():
            # the optimizer would step on a partial sum: no trainer layout leaves one at step time
            raise RuntimeError(f"gradient clipping: a parameter's placements {p.placements} hold a partial sum")
        # Shard, or FSDP2's _StridedShard over an ep- or tp-sharded parameter (not an is_shard() in every torch)
        if not placement.is_replicate() and mesh.size(dim) > 1:
            groups.append(mesh.get_group(dim))
    return tuple(groups)


def _local_grad(p: torch.Tensor) -> torch.Tensor | None:
    g = p.grad
    if g is None:
        return None
    return g.to_local() if isinstance(g, DTensor) else g


@torch.no_grad()
def global_grad_norm(params: Iterable[torch.Tensor], pp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """The L2 norm of the whole model's gradient (module docstring), equal on every rank; `params` are this
    rank's parameters, each counted once (tied copies on later pipeline stages left out by the caller)."""
    by_groups: dict[tuple, list[torch.Tensor]] = {}
    device = None
    for p in params:
        grads = by_groups.setdefault(_shard_groups(p), [])
        g = _local_grad(p)
        device = device or (g.device if g is not None else None) or p.device
        if g is not None and g.numel():
            grads.append(g)
    total = torch.zeros((), dtype=torch.float32, device=device)
    for groups, grads in by_groups.items():
        sq = (torch.nn.utils.get_total_norm(grads, 2.0).float() ** 2 if grads
              else torch.zeros((), dtype=torch.float32, device=device))
        for group in groups:
            dist.all_reduce(sq, group=group)
        total += sq
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


@torch.no_grad()
def scale_grads(params: Iterable[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
    """grads *= min(1, max_norm / (norm + 1e-6)) (torch.nn.utils.clip_grads_with_norm_), on the local tensors."""
    if math.isinf(max_norm):
        return
    coef = torch.clamp(max_norm / (norm + EPS), max=1.0)
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        g = _local_grad(p)
        if g is not None and g.numel():
            by_kind.setdefault((g.device, g.dtype), []).append(g)
    for (device, _), grads in by_kind.items():
        torch._foreach_mul_(grads, coef.to(device))


def clip_parameters(parts: list[nn.Module], skip: set[int], max_norm: float,
                    pp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """Clip the gradients of this rank's model parts to the global norm `max_norm`; returns the norm before
    clipping. `skip`: ids of parameters not counted in the norm (tied copies held by an earlier stage), still
    scaled."""
    seen: set[int] = set()
    params = []
    for part in parts:
        for p in part.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    norm = global_grad_norm([p for p in params if id(p) not in skip], pp_group)
    scale_grads(params, norm, max_norm)
    return norm
