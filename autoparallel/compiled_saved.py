"""What a torch.compile'd block keeps for its backward: AOTAutograd's own partitioner run on the meta device.

AutoParallelTrainer compiles each transformer block (trainer._compile_blocks). AOTAutograd traces the
block's joint forward/backward graph and the default partitioner (min_cut_rematerialization_partition, as
Inductor calls it) chooses the forward values saved for the backward: it recomputes cheap pointwise chains
(SwiGLU's product, a norm's output from its input and rstd) where eager autograd saves every operand. So a
compiled block keeps fewer activation bytes than the eager trace says (a 1.3B llama block at 2048 tokens:
about 118 MiB per row against eager's 140).

`compiled_saved_bytes(block, args)` runs that partitioner on meta tensors with forward/backward
"compilers" that only keep the graphs, and sums the forward graph's saved tensors: deduplicated by storage
(a view keeps its base alive), without parameters and buffers (resident anyway) and without inputs that
need no gradient (rotary tables and masks, shared by all blocks and counted once by the eager trace). The
block's activation input (the residual stream) stays in: eager accounting counts each block's output, which
the next block saves, so the total over a stage is the same.

Attention runs as the fused kernel a GPU runs (tracer._fused_sdpa: flash attention saves q, k, v, its
output and the log-sum-exp, not the seq x seq probabilities). RMSNorm is left to decompose, as Inductor
decomposes it. Inductor's joint-graph passes are not run: on meta inputs they constant-fold the graph away;
they rewrite patterns, not the saved set. Inductor's decomposition table is not passed by default: on the
sweep's four models (1.3B and 7B llama, 350M gpt, 1.2B MoE) and the tiny catalog ones it changed the saved
bytes of tiny-moe only (by 0.3%), and it costs ~0.8 s of imports and ~0.1 s per class more;
tests/test_compiled_saved.py checks the result against torch.compile(backend="aot_eager_decomp_partition")
(Inductor's decompositions and partitioner) on a real CPU block.

Expert blocks: the whole block is partitioned, although Dynamo may break the graph at the routing; the
measured compiled MoE peaks on an H200 agree (1.2B MoE, 8 x 2048: 29.4 GiB predicted, 29.5 measured).

Cost: ~0.2 s per block class (0.3 s for an expert block) at trace time, about half building the joint graph
(make_fx with functionalization) and a third the min-cut itself; the first class of a process also imports
torch._functorch.aot_autograd (which loads Dynamo, ~0.9 s). Only a trace-cache miss pays it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["compiled_saved_bytes"]


class _Flat(nn.Module):
    """The block with flat tensor arguments and a tuple output (what aot_module_simplified takes)."""

    def __init__(self, block: nn.Module, rebuild: Callable[[tuple], tuple[tuple, dict]]) -> None:
        super().__init__()
        self.block = block
        self.rebuild = rebuild

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = self.rebuild(flat)
        out = self.block(*args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _flatten(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], Callable[[tuple], tuple[tuple, dict]]]:
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def rebuild(flat: tuple) -> tuple[tuple, dict]:
        full = list(leaves)
        for i, t in zip(slots, flat):
            full[i] = t
        return torch.utils._pytree.tree_unflatten(full, spec)

    return [leaves[i] for i in slots], rebuild


def _partition(block: nn.Module, args: tuple, kwargs: dict, decompositions: dict | None) -> tuple[Any, int, list]:
    """(forward fx graph, number of real outputs, flat inputs) of the partitioned block."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    flat, rebuild = _flatten(args, kwargs)
    mod = _Flat(block, rebuild)
    n_static = len(list(mod.parameters())) + len(list(mod.buffers()))
    graphs: dict[str, Any] = {}

    def fw_compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Callable:
        graphs["fw"] = gm
        return gm

    def bw_compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Callable:
        return gm

    def partition(gm: torch.fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
        # parameters are static inputs (free to save), as Dynamo marks them for Inductor
        kw["static_lifetime_input_indices"] = list(range(n_static))
        graphs["outputs"] = kw.get("num_fwd_outputs", 1)
        return min_cut_rematerialization_partition(gm, joint_inputs, compiler="inductor", **kw)

    # attention as the fused kernel a GPU runs (the meta device would pick the math path, whose seq x seq
    # probabilities the partitioner would then weigh); RMSNorm left to decompose, as Inductor does
    from autoparallel.tracer import _FusedKernels

    with torch.device("meta"), _FusedKernels(attention_only=True):
        aot_module_simplified(mod, tuple(flat), fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                              partition_fn=partition, decompositions=decompositions)
    return graphs["fw"], graphs["outputs"], [*mod.parameters(), *mod.buffers(), *flat]


def compiled_saved_bytes(block: nn.Module, args: tuple, kwargs: dict | None = None,
                         decompositions: dict | None = None) -> int:
    """Bytes the compiled `block` keeps from its forward for its backward, called on meta `args`/`kwargs`
    (see the module docstring)."""
    fw, n_out, inputs = _partition(block, args, kwargs or {}, decompositions)
    out_node = next(n for n in fw.graph.nodes if n.op == "output")
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    skip: set[StorageWeakRef] = set()
    for node, real in zip(placeholders, inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and (isinstance(real, nn.Parameter) or not real.requires_grad
                                              or any(real is b for b in block.buffers())):
            skip.add(StorageWeakRef(val.untyped_storage()))
    seen: set[StorageWeakRef] = set()
    total = 0
    for node in out_node.args[0][n_out:]:
        val = getattr(node, "meta", {}).get("val")
        if not isinstance(val, torch.Tensor):
            continue
        key = StorageWeakRef(val.untyped_storage())
        if key in skip or key in seen:
            continue
        seen.add(key)
        total += val.untyped_storage().nbytes()
    return total
