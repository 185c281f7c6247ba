"""Low precision in the trainer: int8 gradient reduction inside FSDP2, FP8 linears through torchao.

INT8 gradient reduction (plan.grad_reduce_dtype == "int8"), ZeRO++'s quantized gradients (qgZ):
FSDP2 hands every reduce-scatter to a `ReduceScatter` object (torch.distributed.fsdp's _fsdp_api.py),
which `FSDPModule.set_custom_reduce_scatter` replaces. `Int8ReduceScatter` receives FSDP2's fp32
reduce-scatter input (the reduce dtype is fp32, so accumulation stays fp32) and

  1. splits it into the n destination chunks and each chunk into blocks of INT8_BLOCK elements,
  2. quantizes every block to int8 with its own absmax scale (scale = absmax / 127, q = round(x / scale)),
  3. exchanges the int8 chunks and their fp32 scales with one all-to-all each (one hop, as qgZ),
  4. dequantizes the n received chunks and sums them in fp32 (then divides by n for an average).

Error bound: rounding to the nearest multiple of `scale` errs by at most scale / 2 = absmax_block / 254
per element, so the reduced sum errs by at most sum over ranks of absmax_{rank,block} / 254 (divided
by n for the average), on top of the fp32 summation rounding.

ZeRO-0 runs on `replicate`, whose all-reduce is a plain dist.all_reduce inside FSDP2's foreach_reduce
with no hook (torch 2.13): Plan.check_runnable refuses int8 there, and ZeRO-1 (one reduce-scatter per
step) is the int8 plan with ZeRO-0's traffic pattern.

FP8 linears (plan.fp8, one recipe per block): torchao's float8 training
(`torchao.float8.convert_to_float8_training` with `Float8LinearConfig.from_recipe_name`) swaps each
nn.Linear of an FP8 block whose in and out features are multiples of 16 (torch._scaled_mm's
requirement; torchtitan's filter) for a Float8Linear; embeddings and the LM head, outside the blocks,
stay in high precision. torchao is an optional dependency (`pip install -e .[fp8]`). The conversion
runs on the meta model before tensor parallelism and FSDP2, as torchtitan does. Under tensor
parallelism the Float8Linears take the plain DTensor styles (ColwiseParallel / RowwiseParallel): the
activations are gathered in high precision and each rank casts its shards (tensorwise scales are
reduced over the DTensor, so they equal one device's); torchao's Float8 styles, which gather in FP8
(tensorwise only), are not used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule

from autoparallel.errors import UserError
from autoparallel.trainer.structure import ModelLayout, get_submodule
from cost_models.comm import INT8_BLOCK
from cost_models.segments import FP8_DIM_MULTIPLE

try:  # the public interface class (torch >= 2.8); FSDP2 only calls the object, so a plain base works too
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover - older torch
    _ReduceScatterBase = object  # type: ignore[assignment,misc]

INT8_MAX = 127


def quantize_blocks(x: torch.Tensor, block: int = INT8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] fp32 -> (int8 [rows, nb, block], fp32 scales [rows, nb, 1]), cols zero-padded to
    nb * block; scale = absmax / 127 per block (1 for an all-zero block, whose q is 0 anyway)."""
    pad = (-x.shape[1]) % block
    blocks = (F.pad(x, (0, pad)) if pad else x).reshape(x.shape[0], -1, block)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, cols: int) -> torch.Tensor:
    """Inverse of quantize_blocks: [rows, nb, block] int8 and scales -> [rows, cols] fp32."""
    return (q.to(torch.float32) * scale).reshape(q.shape[0], -1)[:, :cols]


class Int8ReduceScatter(_ReduceScatterBase):
    """FSDP2 reduce-scatter with block-scaled int8 on the wire and fp32 accumulation (module docstring)."""

    def __init__(self, block: int = INT8_BLOCK) -> None:
        self.block = block

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: object, async_op: bool = False) -> None:
        n = group.size()
        if op == dist.ReduceOp.AVG:
            divide = True
        elif op == dist.ReduceOp.SUM:
            divide = False
        else:  # PREMUL_SUM comes only with a gradient divide factor, which the trainer never sets
            raise UserError(f"int8 gradient reduction supports SUM and AVG, not {op}")
        chunks = input_tensor.float().reshape(n, -1)
        cols = chunks.shape[1]
        q, scale = quantize_blocks(chunks, self.block)
        q_in, s_in = torch.empty_like(q), torch.empty_like(scale)
        # row j goes to rank j; row i of the result came from rank i (one hop: every rank sends each
        # peer only that peer's chunk, as ZeRO++'s qgZ)
        dist.all_to_all_single(q_in, q, group=group)
        dist.all_to_all_single(s_in, scale, group=group)
        reduced = dequantize_blocks(q_in, s_in, cols).sum(dim=0)
        if divide:
            reduced /= n
        output_tensor.copy_(reduced.to(output_tensor.dtype))
        return None


def install_int8_reduce_scatter(modules: Sequence[FSDPModule]) -> None:
    """Every FSDP2 unit reduce-scatters its gradients through Int8ReduceScatter."""
    comm = Int8ReduceScatter()
    for mod in modules:
        mod.set_custom_reduce_scatter(comm)


# ---- FP8 ---------------------------------------------------------------------------------------------
def _torchao_float8():
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise UserError(f"plan asks for FP8 linears (fp8 = tensorwise/rowwise) but torchao's float8 training is "
                        f"not importable ({e}); pip install torchao (or `pip install -e .[fp8]`), or re-plan with "
                        f"--precision bf16") from None
    return Float8LinearConfig, convert_to_float8_training


def fp8_linear_filter(module: nn.Module, fqn: str) -> bool:
    """Linears torchao converts: dims multiples of FP8_DIM_MULTIPLE (the cost model's same filter,
    cost_models.segments._fp8_linear_gemm)."""
    return (isinstance(module, nn.Linear) and module.in_features % FP8_DIM_MULTIPLE == 0
            and module.out_features % FP8_DIM_MULTIPLE == 0)


def apply_fp8(part: nn.Module, layout: ModelLayout, recipes: tuple[str, ...]) -> list[str]:
    """Convert the linears of every block whose recipe is not "none" to torchao Float8Linear (in place);
    returns the converted module paths relative to `part`."""
    if not recipes or all(r == "none" for r in recipes):
        return []
    container = get_submodule(part, layout.container or "")
    if container is None:
        raise UserError("plan asks for FP8 blocks but the model has no repeated-block container")
    config_cls, convert = _torchao_float8()
    converted: list[str] = []
    prefix = f"{layout.container}." if layout.container else ""
    for key, recipe in zip(layout.blocks, recipes, strict=True):
        block = get_submodule(container, key)
        if block is None or recipe == "none":
            continue
        convert(block, config=config_cls.from_recipe_name(recipe), module_filter_fn=fp8_linear_filter)
        converted += [f"{prefix}{key}.{n}" for n, m in block.named_modules() if type(m).__name__ == "Float8Linear"]
    return converted
