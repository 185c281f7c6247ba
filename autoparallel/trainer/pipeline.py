"""Pipeline parallelism with torch.distributed.pipelining: stage assignment, stages and schedules.

Virtual stage v holds blocks [sum(stage_layers[:v]), sum(stage_layers[:v+1])) and lives on pp rank
v % pp (plan.stage_of_block); the first virtual stage also holds the embeddings, the last one the
final norm and head. vpp = 1 runs Schedule1F1B, vpp > 1 ScheduleInterleaved1F1B, and
plan.pipeline_schedule = "zero_bubble" ScheduleInterleavedZeroBubble at any vpp (one stage per rank
included: its action lists then are ZB-H1's, each backward split into an input-gradient action I on the
critical path and a weight-gradient action W that fills the cool-down bubble). Every one of them
accumulates micro-batch gradients and runs the stage's perform_reduce_grad once per step. The schedule
splits this rank's batch slice into plan.num_micro_batches micro-batches along dim 0 and divides the
accumulated gradients by that count (scale_grads), so a mean loss per micro-batch gives the gradient
of the mean over the slice.

Under sequence parallelism activations inside a stage are sharded on the sequence dim; between stages
they travel whole (gathered by the sending stage, sliced again by the receiving one), so every stage
sees the full sequence length at its root (rotary tables are built from it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoparallel.errors import UserError
from autoparallel.plan import Plan
from autoparallel.trainer.structure import ModelLayout, get_submodule


def virtual_stage_blocks(plan: Plan, layout: ModelLayout) -> list[list[str]]:
    """Block keys of each virtual stage (plan.stage_layers, or an even split when it is empty)."""
    n_stages = plan.pp * plan.vpp
    n = len(layout.blocks)
    counts = list(plan.stage_layers) or [n // n_stages + (1 if i < n % n_stages else 0) for i in range(n_stages)]
    if sum(counts) != n:
        raise UserError(f"plan: stage_layers sum to {sum(counts)} but the model has {n} blocks")
    out, start = [], 0
    for c in counts:
        out.append(list(layout.blocks[start:start + c]))
        start += c
    for v, keys in enumerate(out):
        if not keys and 0 < v < n_stages - 1:
            raise UserError(f"plan: virtual pipeline stage {v} has no blocks (stage_layers={counts}); every "
                            f"middle stage needs at least one")
    return out


def local_virtual_stages(plan: Plan, pp_rank: int) -> list[int]:
    return [v for v in range(plan.pp * plan.vpp) if v % plan.pp == pp_rank]


def add_sequence_boundary_hooks(part: nn.Module, layout: ModelLayout, tp_mesh: DeviceMesh, first: bool,
                                last: bool) -> None:
    """Gather the sequence-sharded output of a non-last stage; slice the whole input of a non-first
    stage before its first sequence-parallel module (see the module docstring)."""
    if not last:
        def gather(_mod: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
            dt = DTensor.from_local(out, tp_mesh, (Shard(1),), run_check=False)
            return dt.redistribute(tp_mesh, (Replicate(),)).to_local()
        part.register_forward_hook(gather)
    if not first:
        order = [layout.block_path(k) for k in layout.blocks] + list(layout.post)
        target = next((m for m in (get_submodule(part, p) for p in order) if m is not None), None)
        if target is None:
            return

        def slice_(_mod: nn.Module, args: tuple) -> tuple:
            dt = DTensor.from_local(args[0], tp_mesh, (Replicate(),), run_check=False)
            return (dt.redistribute(tp_mesh, (Shard(1),)).to_local(),) + tuple(args[1:])
        target.register_forward_pre_hook(slice_)


def build_schedule(parts: list[tuple[int, nn.Module]], plan: Plan, pp_mesh: DeviceMesh, device: torch.device,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    n_stages = plan.pp * plan.vpp
    n_micro = plan.num_micro_batches
    group = pp_mesh.get_group()
    stages = [PipelineStage(mod, v, n_stages, device, group=group) for v, mod in parts]
    if plan.pipeline_schedule == "zero_bubble":
        # eager stages only: plan.check_runnable refuses plan.compile, the trainer its compile=True pin
        return ScheduleInterleavedZeroBubble(stages, n_microbatches=n_micro, loss_fn=loss_fn)
    if plan.vpp == 1:
        return Schedule1F1B(stages[0], n_microbatches=n_micro, loss_fn=loss_fn)
    return ScheduleInterleaved1F1B(stages, n_microbatches=n_micro, loss_fn=loss_fn)
