"""Context parallelism: each sequence split over the "cp" mesh dim, attention as a ring (PyTorch's
`torch.distributed.tensor.experimental.context_parallel`, as torchtitan runs it).

Per micro-batch, forward and backward run inside `cp_context(mesh, inputs, labels, positions)`:

* the buffers that depend on the sequence position -- token inputs, labels and the positions the model
  derives rotary tables / learned position embeddings from -- are sharded along the sequence with
  causal load balancing (torch's head-tail balancer: the sequence is cut into 2*cp chunks and rank i
  keeps chunks i and 2*cp-1-i, so every rank does the same share of the causal attention);
* F.scaled_dot_product_attention is patched to ring attention: q, k, v become DTensors sharded on the
  sequence dim; K and V chunks rotate around the cp ranks (cp - 1 exchanges forward; K, V and their
  gradients backward), and the partial outputs merge through their log-sum-exp.

Everything outside attention is per token, so it needs no change: each rank computes the loss on its
own tokens and the data-parallel gradient reduction runs over dp*cp*ep ranks (FSDP2 on the flattened
mesh), which averages the cp ranks' gradients like those of any other data-parallel rank.

torch 2.13 ships ring kernels for the CUDA SDPA backends (flash, memory-efficient, cuDNN) only; on a CPU
SDPA runs `aten._scaled_dot_product_flash_attention_for_cpu`, which DTensor neither shards nor routes to
the ring. `_cpu_ring_handlers` adds that op (forward and backward) to the ring with torch's own
`_templated_ring_attention(_backward)`: the same ring, merge and load-balancing code the CUDA backends
use, with the CPU kernel as the per-step attention op (its signature and log-sum-exp layout [B, H, S]
match the flash backend's). It is installed only inside the context, next to torch's own handlers.

The model must accept `positions` (autoparallel's models do); attention must be SDPA with a causal mask
and no explicit mask. Hugging Face models are refused (their rotary tables come from position ids that
transformers' forward builds and its masks are explicit).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

from autoparallel.errors import UserError

aten = torch.ops.aten
SEQ_DIM = 2  # of q, k, v [B, H, S, D]: the dim ring attention shards
_CPU_FWD = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def check_cp_model(model: nn.Module, is_hf: bool, cp: int) -> None:
    """Refuse (UserError) a model context parallelism cannot run correctly."""
    if cp == 1:
        return
    if is_hf:
        raise UserError(f"plan: cp={cp} (context parallelism) is not supported for Hugging Face models yet: their "
                        f"rotary tables and masks are built inside transformers' forward from the whole sequence; "
                        f"use an autoparallel model (catalog name) or a plan with cp=1")
    params = inspect.signature(model.forward).parameters
    if "positions" not in params:
        raise UserError(f"plan: cp={cp} needs the model's forward to accept `positions` (the sequence positions of "
                        f"its input columns, which context parallelism load-balances); "
                        f"{type(model).__name__}.forward takes {', '.join(params)}; add it or use cp=1")
    for name, mod in model.named_modules():
        if getattr(mod, "attn_impl", "sdpa") != "sdpa":
            raise UserError(f"plan: cp={cp} needs SDPA attention (F.scaled_dot_product_attention), but {name} uses "
                            f"attn_impl={mod.attn_impl!r}; set attn_impl: sdpa or use cp=1")


def _global_spec(local: torch.Tensor, mesh: DeviceMesh) -> DTensorSpec:
    """Spec of a tensor sharded on SEQ_DIM whose local shard is `local` (equal shards: seq divides 2*cp)."""
    shape = list(local.shape)
    shape[SEQ_DIM] *= mesh.size()
    stride = torch.empty(shape, device="meta").stride()
    return DTensorSpec(mesh, (Shard(SEQ_DIM),), tensor_meta=TensorMeta(torch.Size(shape), stride, local.dtype))


def _wrap(local: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor(local, _global_spec(local, mesh), requires_grad=False)


def _locals(args: tuple, n: int) -> tuple[list[torch.Tensor], DeviceMesh]:
    tensors = list(args[:n])
    for t in tensors:
        if not isinstance(t, DTensor) or tuple(t.placements) != (Shard(SEQ_DIM),):
            raise UserError("context parallelism: attention inputs must be sharded on the sequence only; "
                            "another parallelism turned them into other DTensors")
    return [t._local_tensor for t in tensors], tensors[0].device_mesh


def _cpu_forward(op_call, args: tuple, kwargs: dict):
    (q, k, v), mesh = _locals(args, 3)
    dropout_p = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
    is_causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
    if kwargs.get("attn_mask") is not None or dropout_p:
        raise UserError("context parallelism: ring attention takes no attn_mask and no attention dropout")
    out, lse = cp_attention._templated_ring_attention(
        mesh.get_group(), SEQ_DIM, _CPU_FWD, q, k, v, is_causal=is_causal, scale=kwargs.get("scale"))
    return _wrap(out, mesh), _wrap(lse, mesh)


def _cpu_backward(op_call, args: tuple, kwargs: dict):
    (grad_out, q, k, v, out, lse), mesh = _locals(args, 6)
    is_causal = args[7] if len(args) > 7 else kwargs["is_causal"]
    dq, dk, dv = cp_attention._templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, _CPU_BWD, grad_out=grad_out, grad_out_name="grad_out", query=q, key=k,
        value=v, out=out, logsumexp=lse, is_causal=is_causal, dropout_p=0.0, scale=kwargs.get("scale"))
    return _wrap(dq, mesh), _wrap(dk, mesh), _wrap(dv, mesh)


@contextmanager
def _cpu_ring_handlers() -> Iterator[None]:
    """Route the CPU flash-attention ops of sequence-sharded DTensors to the ring (see module docstring).
    Installed into the handler table context_parallel() put in place, and taken out again."""
    handlers = DTensor._op_dispatcher._custom_op_handlers
    added = {op: fn for op, fn in ((_CPU_FWD, _cpu_forward), (_CPU_BWD, _cpu_backward)) if op not in handlers}
    handlers.update(added)
    try:
        yield
    finally:
        for op in added:
            handlers.pop(op, None)


@contextmanager
def cp_context(mesh: DeviceMesh, buffers: list[torch.Tensor], seq_dims: list[int]) -> Iterator[None]:
    """Shard `buffers` (owned tensors: they are resized in place) along `seq_dims` with causal load
    balancing and run ring attention for forward and backward inside. The buffers are left sharded."""
    seq = buffers[0].shape[seq_dims[0]]
    if seq % (2 * mesh.size()):
        raise UserError(f"batch sequence length {seq} is not divisible by 2*cp = {2 * mesh.size()} (causal load "
                        f"balancing); pad or crop the sequences")
    # torch keeps this option process-wide and its _context_parallel_shard API turns it off; the plan's
    # cost (and the trainer's equality with one process) assume the balanced layout, so ask for it.
    cp_attention._cp_options.enable_load_balance = True
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=set(buffers)):
        with _cpu_ring_handlers():
            yield
