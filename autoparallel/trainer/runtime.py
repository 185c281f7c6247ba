"""Where the trainer runs: ranks, device, backend and the ("pp","dp","cp","ep","tp") DeviceMesh.

Everything comes from the environment, as torchrun sets it (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT): an accelerator when one is present (cuda + nccl), else the CPU
with gloo. A single process without those variables needs no launcher: on a GPU it starts a one-rank
NCCL group of its own (an in-memory store), so one GPU runs the same FSDP2 mixed-precision layout as
N GPUs (bf16 compute copies of fp32 master weights, fp32 gradient reduction) -- the layout the cost
model prices, and faster than fp32 parameters under autocast (325 vs 346 ms per step for a 1.3B llama
on an H200, benchmarks/results/h200_trainer_throughput.json). On a CPU it runs without a process
group at all ("local" mode: no mesh, no wrappers, autocast for a low-precision plan).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoparallel.errors import UserError
from autoparallel.plan import MESH_DIMS, Plan

T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None          # None in local mode (one process, no process group)

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _backend_for(device_type: str) -> str:
    return {"cuda": "nccl", "cpu": "gloo"}.get(device_type, "gloo")


def _device_type_of_backend(backend: str) -> str:
    # A gloo group on a GPU host still trains on the GPU only when the caller chose nccl; gloo means CPU.
    return "cuda" if "nccl" in backend and torch.cuda.is_available() else "cpu"


def _pick_device(device_type: str, local_rank: int, device_ids: list[int] | None) -> torch.device:
    if device_type == "cpu":
        return torch.device("cpu")
    if device_ids is not None:
        if local_rank >= len(device_ids):
            raise UserError(f"device_ids={device_ids} names {len(device_ids)} devices but this is local rank "
                            f"{local_rank}; pass one device id per process on the node")
        return torch.device(device_type, device_ids[local_rank])
    return torch.device(device_type, local_rank % max(1, torch.cuda.device_count()))


def init_distributed(device_ids: list[int] | None = None) -> DistEnv:
    """Join (or start) the process group described by the environment; see the module docstring."""
    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        device = _pick_device(_device_type_of_backend(backend), local_rank, device_ids)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return DistEnv(rank, world, local_rank, local_world, device, backend)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device_type = _default_device_type()
    if world == 1:
        device = _pick_device(device_type, 0, device_ids)
        if device.type != "cuda":
            return DistEnv(0, 1, 0, 1, device, None)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
        return DistEnv(0, 1, 0, 1, device, "nccl")
    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise UserError(f"WORLD_SIZE={world} is set but {key} is not; launch with `torchrun "
                            f"--nproc-per-node N script.py` (it sets RANK, MASTER_ADDR and MASTER_PORT)")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = _pick_device(device_type, local_rank, device_ids)
    backend = _backend_for(device.type)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank, world_size=world, device_id=device)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world)
    return DistEnv(rank, world, local_rank, local_world, device, backend)


@dataclass
class Meshes:
    """The world mesh and the sub-meshes each parallelism uses (all from one root, as FSDP2+TP need).

    dense_dp  ("dp","cp","ep") flattened: dense parameters are replicated / sharded over every rank
              that sees different tokens (torchtitan's dp_shard_cp, with ep folded in).
    expert_dp ("dp","cp") flattened: expert parameters are already split ep-way, so only dp*cp
              replicates them.
    cp        the context-parallel ring (one sequence's chunks).
    """

    world: DeviceMesh
    pp: DeviceMesh
    dense_dp: DeviceMesh
    expert_dp: DeviceMesh
    ep: DeviceMesh
    tp: DeviceMesh
    cp: DeviceMesh

    def coordinate(self, dim: str) -> int:
        return self.world.get_local_rank(dim)

    @property
    def data_rank(self) -> int:
        """Index of this rank's slice of the global batch: dp-major, ep-minor (mesh order)."""
        return self.coordinate("dp") * self.world.size(MESH_DIMS.index("ep")) + self.coordinate("ep")


def build_meshes(env: DistEnv, plan: Plan) -> Meshes:
    """The plan's meshes, reused from an earlier trainer of this process with the same mesh shape (see
    ProcessGroups)."""
    shape = tuple(plan.mesh_shape[d] for d in MESH_DIMS)
    return _GROUPS.get(("mesh", env.device.type, shape), lambda: _new_meshes(env.device.type, shape))


def _new_meshes(device_type: str, shape: tuple[int, ...]) -> Meshes:
    world = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    dense_dp = world["dp", "cp", "ep"]._flatten("dp_cp_ep")
    expert_dp = world["dp", "cp"]._flatten("dp_cp") if shape[MESH_DIMS.index("cp")] > 1 else world["dp"]
    return Meshes(world=world, pp=world["pp"], dense_dp=dense_dp, expert_dp=expert_dp, ep=world["ep"],
                  tp=world["tp"], cp=world["cp"])


def new_group(ranks: list[int]) -> dist.ProcessGroup | None:
    """dist.new_group(ranks), reused from an earlier trainer of this process (see ProcessGroups)."""
    return _GROUPS.get(("group", tuple(ranks)), lambda: dist.new_group(ranks))


class ProcessGroups:
    """The process groups trainers of this process created, by what they were made for, valid while the
    default group they were made under lives.

    torch never frees a process group on its own (each holds a communicator: NCCL's buffers on the GPU,
    gloo's threads and sockets), and a DeviceMesh makes one group per dimension each time it is built. So
    every AutoParallelTrainer in one process (resuming under another plan, a sweep, a notebook) used to add
    six, and their idle threads slowed every later step: in tests/test_hf_trainer.py's four-rank gloo group
    one configuration took 1.9 s alone and 29.8 s as the 50th trainer of the process. A trainer now takes
    the groups of an earlier one whose mesh has the same shape. Making a group is collective, so every rank
    must take the same path: they do, because every rank builds the same trainers in the same order (as
    torch.distributed requires anyway). A new default group (destroy_process_group, then init again)
    starts an empty registry."""

    def __init__(self) -> None:
        self._world: object | None = None
        self._made: dict[tuple, Any] = {}

    def get(self, key: tuple, make: Callable[[], T]) -> T:
        world = dist.group.WORLD
        if world is not self._world:
            self._world, self._made = world, {}
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]


# One per process, as the process groups it holds are.
_GROUPS = ProcessGroups()
