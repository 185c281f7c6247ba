"""Meta copies, pipeline splitting and shard-by-shard materialization.

The trainer never parallelizes the user's module in place. It works on a copy whose parameters live
on the meta device (no memory), splits that copy into pipeline stages torchtitan-style (deep-copy,
delete the blocks other stages own, set the embeddings / final norm / head of middle stages to None),
applies TP/EP/AC/FSDP while still on meta, and only then allocates this rank's shards (`to_empty`).
The shards are filled either

* from the user's materialized model: rank 0's full parameters are broadcast once and every rank
  copies out exactly its slice (so all ranks start from the same weights even if they were built
  with different seeds, and the parallel run starts bit-identical to a single-process one), or
* for a model built on the meta device: by the user's init function, else the model's own
  `init_weights()` (catalog models), run on the sharded modules: nothing full-size is ever allocated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autoparallel.errors import UserError
from autoparallel.trainer.structure import ModelLayout, clean_fqn, get_submodule, pipelineable


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor; a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def is_meta_model(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy whose parameters are on the meta device (ties kept); buffers are copied as they are."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    return copy.deepcopy(model, memo)


def fp32_masters(meta_model: nn.Module) -> None:
    """A model loaded in 16 bits (from_pretrained(dtype=torch.bfloat16), .half()) trains with fp32 master
    parameters in the trainer's copy, as the plan's mixed precision assumes (FSDP2's MixedPrecisionPolicy
    computes in the plan's param_dtype from fp32 shards; local mode runs fp32 parameters under autocast), as
    torchtitan and Megatron-LM train: its AdamW state is fp32 too, and updates smaller than a bf16 rounding step
    are not lost. Buffers keep their dtype. In place, so tied names keep sharing one parameter."""
    for p in meta_model.parameters():
        if p.dtype in (torch.bfloat16, torch.float16):
            p.data = p.data.to(torch.float32)


def pipeline_part(meta_model: nn.Module, layout: ModelLayout, keep: set[str], first: bool,
                  last: bool) -> nn.Module:
    """The model of one (virtual) pipeline stage: only the blocks in `keep`, embeddings only on the
    first stage, final norm / head only on the last. Parameter names stay those of the full model
    (a ModuleList keeps its original indices as keys; iterating it yields the kept blocks in order)."""
    part = copy.deepcopy(meta_model)
    container = get_submodule(part, layout.container or "")
    if not pipelineable(meta_model, layout):
        raise UserError("pipeline parallelism needs the model's blocks in a root-level nn.ModuleDict (or a "
                        "Hugging Face causal LM's layers), so that stages keep parameter names and skip what "
                        "they do not own (docs/architecture.md); use a plan with pp=1 for this model")
    # Drop the other stages' blocks from the container's registry directly: `del module_list[i]`
    # would renumber the remaining blocks and so rename their parameters.
    for key in layout.blocks:
        if key not in keep:
            del container._modules[key]
    for path in (layout.pre if not first else ()) + (layout.post if not last else ()):
        parent, _, name = path.rpartition(".")
        setattr(get_submodule(part, parent), name, None)
    return part


def full_source(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the user's model by clean FQN (tied names each appear)."""
    out = {clean_fqn(n): p.detach() for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({clean_fqn(n): b.detach() for n, b in model.named_buffers(remove_duplicate=False)})
    return out


def broadcast_source(source: dict[str, torch.Tensor], device: torch.device,
                     bucket_bytes: int = 256 * 2**20) -> dict[str, torch.Tensor]:
    """Rank 0's values on every rank, kept on the CPU: flattened broadcasts of at most `bucket_bytes`
    per dtype (a handful of collectives for small models, bounded device memory for large ones)."""
    by_dtype: dict[torch.dtype, list[str]] = {}
    for n in sorted(source):
        by_dtype.setdefault(source[n].dtype, []).append(n)
    buckets: list[list[str]] = []
    for dtype in sorted(by_dtype, key=str):
        current: list[str] = []
        size = 0
        for n in by_dtype[dtype]:
            nbytes = source[n].numel() * source[n].element_size()
            if current and size + nbytes > bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(n)
            size += nbytes
        buckets.append(current)
    out: dict[str, torch.Tensor] = {}
    for names in buckets:
        tensors = [source[n].to(device) for n in names]
        flat = _flatten_dense_tensors(tensors).clone()  # clone: never write into the user's tensors
        dist.broadcast(flat, src=0)
        for n, t in zip(names, _unflatten_dense_tensors(flat, tensors), strict=True):
            out[n] = t.cpu()
    return out


def cast_buffers(part: nn.Module, dtypes: dict[str, torch.dtype]) -> None:
    """Give each buffer of `part` named in `dtypes` (by clean FQN) that dtype."""
    if not dtypes:
        return
    for prefix, mod in part.named_modules():
        for name, buf in list(mod._buffers.items()):
            want = dtypes.get(clean_fqn(f"{prefix}.{name}" if prefix else name))
            if buf is not None and want is not None and buf.dtype != want:
                mod._buffers[name] = buf.to(want)


@torch.no_grad()
def fill_from_full(target: torch.Tensor, full: torch.Tensor, name: str) -> None:
    """Copy this rank's part of the full value `full` into `target` (a DTensor shard or a tensor)."""
    if isinstance(target, DTensor):
        if tuple(full.shape) != tuple(target.shape):
            raise UserError(f"parameter {name}: source shape {tuple(full.shape)} != {tuple(target.shape)}")
        shape, offset = compute_local_shape_and_global_offset(full.shape, target.device_mesh, target.placements)
        local = target.to_local()
        if local.numel():
            local.copy_(full[tuple(slice(o, o + s) for s, o in zip(shape, offset, strict=True))])
    else:
        target.copy_(full)  # copy_ moves host values to the device


def shared_seed(device: torch.device) -> int:
    """A seed drawn on rank 0 and broadcast: meta-model initialization draws the same numbers on every
    rank for parameters that are replicated as plain tensors (whatever seed each process set)."""
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64).to(device)
    dist.broadcast(seed, src=0)
    return int(seed.item())


def materialize(part: nn.Module, device: torch.device, source: dict[str, torch.Tensor] | None,
                init_fn: Callable[[nn.Module], None] | None, seed: int | None = None) -> None:
    """Allocate `part`'s (sharded) parameters on `device` and fill them (see the module docstring).
    A meta model is initialized under `seed` (when given) without disturbing the caller's RNG state."""
    real_buffers = {n: b.detach().clone() for n, b in part.named_buffers() if not b.is_meta}
    part.to_empty(device=device)
    with torch.no_grad():
        for n, b in part.named_buffers():
            if n in real_buffers:
                b.copy_(real_buffers[n])
    if source is not None:
        for name, t in list(part.named_parameters()) + list(part.named_buffers()):
            key = clean_fqn(name)
            if key in source:
                fill_from_full(t, source[key], key)
            elif name not in real_buffers:
                raise UserError(f"parameter {key} of the parallel model has no value in the source model")
        return
    init = init_fn if init_fn is not None else getattr(part, "init_weights", None)
    if init is None:
        raise UserError(f"model {type(part).__name__} is on the meta device but has no init_weights() "
                        "method; pass init_fn=callable(module) to AutoParallelTrainer to initialize it")
    devices = [device] if device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices, enabled=seed is not None):
        for p in part.parameters():  # what the init leaves unset stays NaN, not whatever memory held
            if p.is_floating_point():
                local_shard(p).fill_(float("nan"))
        if seed is not None:
            torch.manual_seed(seed)
        init(part) if init_fn is not None else init()
        unset = next((n for n, p in part.named_parameters() if p.is_floating_point()
                      and bool(local_shard(p).isnan().any())), None)
    if unset is not None:
        what = "init_fn" if init_fn is not None else f"{type(part).__name__}.init_weights()"
        raise UserError(f"model on the meta device: after {what}, parameter {clean_fqn(unset)} still holds NaN "
                        f"(left unset, or set to NaN); initialize every parameter in it (e.g. "
                        f"module.reset_parameters() for each submodule that has one)")

