"""Activation checkpointing per block, as planned (plan.recompute[i] for block i).

  none       keep every activation.
  full       torch.utils.checkpoint (non-reentrant) of the whole block: only its input is saved,
             the block's forward is re-run in backward.
  selective  Megatron-LM's selective recompute, what the cost model charges: blocks whose attention
             modules expose `recompute_core` (the project's models) recompute only the seq x seq
             attention core of eager attention in backward (with flash/SDPA attention there is nothing
             to recompute, as the cost model says). Other user blocks get per-op selective
             checkpointing (torchtitan's "op" SAC): the outputs of the compute-heavy ops (matmuls,
             fused attention) and of reduce-scatters are saved, everything cheap is recomputed.
  op         per-op selective checkpointing of any block (the same policy), the mode the cost model
             prices with cost_models.compute.OP_SAC_SAVED.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from autoparallel.trainer.structure import ModelLayout, get_submodule


def _save_ops() -> set:
    aten = torch.ops.aten
    names = ["mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_grouped_mm",
             "_scaled_mm"]  # FP8 linears' GEMM (torchao float8): saved like the mm it replaces
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and hasattr(functional, "reduce_scatter_tensor"):
        ops.add(functional.reduce_scatter_tensor.default)
    return ops


def _policy(save: set, ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE


def _selective(module: nn.Module, save: set) -> nn.Module:
    return checkpoint_wrapper(module, context_fn=partial(create_selective_checkpoint_contexts, partial(_policy, save)))


def _wrap_selective_around(module: nn.Module, units: set[int], save: set) -> nn.Module:
    """Selective checkpointing of `module`, but never with an FSDP unit (an expert group) inside a
    region: torch 2.13's per-op replay counts FSDP's own hook ops, which run a different number of
    times during recomputation (pytorch#196862). Such a module is split into its children; each
    unit is wrapped on its own, so FSDP's hooks sit outside the checkpointed region."""
    if id(module) in units or not any(id(m) in units for m in module.modules()):
        return _selective(module, save)
    for name, child in list(module.named_children()):
        if any(True for _ in child.parameters()):
            module.register_module(name, _wrap_selective_around(child, units, save))
    return module


def apply_recompute(part: nn.Module, layout: ModelLayout, modes: tuple[str, ...],
                    units: list[nn.Module] = ()) -> None:
    """Wrap each block per its mode. `units` are submodules that become FSDP units of their own."""
    container = get_submodule(part, layout.container or "")
    if container is None or not modes:
        return
    save = _save_ops()
    unit_ids = {id(m) for m in units}
    for key, mode in zip(layout.blocks, modes, strict=True):
        block = get_submodule(container, key)
        if block is None or mode == "none":
            continue
        if mode == "full":
            wrapped = checkpoint_wrapper(block)
        elif mode == "op":
            wrapped = _wrap_selective_around(block, unit_ids, save)
        elif any(hasattr(m, "recompute_core") for m in block.modules()):
            for m in block.modules():
                if hasattr(m, "recompute_core"):
                    m.recompute_core = True
            continue
        else:
            wrapped = _wrap_selective_around(block, unit_ids, save)
        container.register_module(key, wrapped)
