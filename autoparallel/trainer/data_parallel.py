"""Data parallelism with FSDP2, ZeRO stages mapped onto its options, and mixed precision.

ZeRO stage -> what runs (every FSDP unit is one block; the root unit holds embeddings, final norm and
head, except in a model without tied parameters, where the final norm and the head form a unit of their
own, as torchtitan groups them (under ZeRO-0 the head alone: replicate takes one module): their gradients
are then reduced as soon as the backward has passed them, under the blocks' backward, not with the
embeddings after all of it; an expert group is its own unit, on the expert mesh when experts are ep-sharded,
and on the dense mesh when that has more than one rank; on one data-parallel rank it stays in its block's unit):

  zero 0  `replicate` (FSDP2-based DDP): parameters, gradients and optimizer state replicated;
          gradients all-reduced once per step (after the last micro-batch).
  zero 1  `fully_shard(reshard_after_forward=False)`; gradients of all micro-batches accumulate
          unsharded and are reduce-scattered once, after the last micro-batch. FSDP2 cannot shard
          only the optimizer state: parameters are sharded too between steps (all-gathered once per
          micro-batch forward, kept for backward), so this is ZeRO-1's gradient traffic and memory
          for gradients and optimizer state, plus a parameter all-gather per micro-batch that
          DeepSpeed's ZeRO-1 does once per step (with the full parameters kept resident).
  zero 2  `fully_shard(reshard_after_forward=False)` with a reduce-scatter after every micro-batch,
          so only sharded gradients accumulate (ZeRO-2's gradient memory).
  zero 3  `fully_shard(reshard_after_forward=True)`: parameters re-gathered for backward (ZeRO-3).

Under pipeline parallelism the pipelining runtime decides when gradients are reduced (once, after
the last micro-batch backward), so zero 1 and 2 behave alike there.

Mixed precision: MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=plan.grad_reduce_dtype);
fp32 for either means no cast. The sharded master parameters and optimizer state stay fp32.
grad_reduce_dtype int8 reduces in fp32 (reduce_dtype fp32) through low_precision.Int8ReduceScatter,
installed on every unit: block-scaled int8 on the wire, fp32 accumulation (ZeRO-1/2/3 only).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from autoparallel.errors import UserError
from autoparallel.trainer.low_precision import install_int8_reduce_scatter
from autoparallel.trainer.structure import ModelLayout, get_submodule

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def to_dtype(name: str, what: str) -> torch.dtype:
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise UserError(f"plan: {what}={name!r} is not one of fp32, bf16, fp16") from None


def mixed_precision_policy(param_dtype: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    p = to_dtype(param_dtype, "param_dtype")
    # int8 quantizes FSDP2's fp32 reduce-scatter input and accumulates in fp32 (Int8ReduceScatter)
    r = torch.float32 if reduce_dtype == "int8" else to_dtype(reduce_dtype, "grad_reduce_dtype")
    return MixedPrecisionPolicy(param_dtype=None if p == torch.float32 else p,
                                reduce_dtype=None if r == torch.float32 and p == torch.float32 else r)


def apply_data_parallel(part: nn.Module, layout: ModelLayout, zero: int, dense_mesh: DeviceMesh,
                        expert_mesh: DeviceMesh | None, expert_paths: list[str],
                        mp: MixedPrecisionPolicy, int8_grads: bool = False, tied: bool = False) -> FSDPModule:
    """Wrap expert groups (`expert_paths`: the trainer passes them under ep > 1 or dense dp > 1), then every block, then
    the final norm and head (no tied parameters: `tied` says the model has some), then the root of `part`
    (bottom-up, as FSDP2 wants);
    int8_grads: every unit reduce-scatters through low_precision.Int8ReduceScatter (zero >= 1)."""
    if int8_grads and zero == 0 and dense_mesh.size() > 1:  # (one data rank reduces nothing: no hook needed)
        raise UserError("plan: grad_reduce_dtype=int8 needs zero >= 1 (ZeRO-0's all-reduce has no FSDP2 hook)")

    def wrap(mod: nn.Module | list[nn.Module], mesh: DeviceMesh, reshard: bool = zero == 3
             ) -> FSDPModule | list[nn.Module]:
        if zero == 0:
            return replicate(mod, mesh=mesh, mp_policy=mp)
        unit = fully_shard(mod, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        if int8_grads:
            # a unit of several modules keeps its one FSDP state on the first (fully_shard returns the list)
            install_int8_reduce_scatter([unit[0] if isinstance(unit, list) else unit])
        return unit

    for path in expert_paths:
        mod = get_submodule(part, path)
        if mod is None:
            continue
        # Averaged over dp only; the trainer divides expert gradients by ep (see expert_parallel.py).
        # (FSDP2's set_gradient_divide_factor would do it in the collective, but gloo lacks PREMUL_SUM
        # and its sum-only fallback divides twice under replicate in torch 2.13.)
        wrap(mod, expert_mesh if expert_mesh is not None else dense_mesh)
    for block in layout.block_paths:
        mod = get_submodule(part, block)
        if mod is not None:
            wrap(mod, dense_mesh)
    post = [m for m in (get_submodule(part, p) for p in layout.post) if m is not None]
    if post and not tied:
        # ZeRO 1-3: the final norm and head, kept gathered after forward (the backward needs them first:
        # torchtitan's default for this unit); ZeRO-0: replicate takes one module, so the head alone (the
        # largest), the norm's few parameters staying with the root. One unit either way
        # (CostModel.fsdp_units).
        wrap(post if zero >= 1 else max(post, key=lambda m: sum(p.numel() for p in m.parameters())),
             dense_mesh, reshard=False)
    return wrap(part, dense_mesh)


def reshard(part: nn.Module) -> None:
    """Free the unsharded parameters a forward without a backward left gathered: units that keep them after
    their forward (ZeRO 2, blocks under a pipeline) reshard only after their backward."""
    for module in part.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def discard_gradients(part: nn.Module) -> None:
    """Drop every gradient a failed step left behind: each parameter's .grad, and what FSDP2 accumulates
    across micro-batches without reducing it (FSDPParam.unsharded_accumulated_grad and the unsharded
    parameter's .grad). The optimizer only zeroes after its step, so a step that raised in a later
    micro-batch added the earlier ones' gradients into the next step's."""
    for p in part.parameters():
        p.grad = None
    for module in part.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch before the plural list: one group or none
            groups = [g] if (g := getattr(state, "_fsdp_param_group", None)) is not None else []
        for fsdp_param in (p for g in groups for p in g.fsdp_params):
            fsdp_param.unsharded_accumulated_grad = None
            if (unsharded := getattr(fsdp_param, "_unsharded_param", None)) is not None:
                unsharded.grad = None
