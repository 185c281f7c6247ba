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
they rewrite patterns, not the saved set. The core ATen decompositions are passed (`decompositions=None`
takes them, `_decompositions`), the table Inductor's own (torch._inductor.decomposition.select_decomp_table)
extends, with softmax and log-softmax decomposed as Inductor's table does: on the sweep's four catalog models
they change nothing, but a Hugging Face Phi-2 block (LayerNorm, tanh GELU written out) keeps 150 MiB a row
with them, 190 without, and the measured compiled Phi-2 peak (s35) sits within 2% of the first and 10% under
the second; Gemma 2's soft-capped eager attention keeps one fp32 seq x seq tensor a layer less with the softmax
decomposed (its compiled peak on an H200, s50: +9.4% without). Inductor's full table gives the same saved bytes
on Phi-2, the llama, the catalog MoE, Qwen3-MoE and Gemma 2 (fused bytes within 2.4%), but importing it takes
~2 s a process against 0.1 s. tests/test_compiled_saved.py checks the result against
torch.compile(backend="aot_eager_decomp_partition") (Inductor's decompositions and partitioner) on a real
CPU block.

What the compiled kernels move (`fused_bytes`): the same partition gives the forward and backward graphs
Inductor compiles; their pointwise and reduction ops, grouped as Inductor fuses them, move the bytes at the
groups' boundaries only. `compiled_block` returns the saved bytes and both phases' fused bytes from one
partition (it also runs the meta backward, which AOTAutograd compiles lazily); the cost model prices a
compiled block's memory-bound work by them (cost_models.compute.compiled_times).

Expert blocks: the whole block is partitioned, although Dynamo may break the graph at the routing; the
measured compiled MoE peaks on an H200 agree (1.2B MoE, 8 x 2048: 29.4 GiB predicted, 29.5 measured).

Cost: ~0.2 s per block class (0.3 s for an expert block) at trace time, about half building the joint graph
(make_fx with functionalization) and a third the min-cut itself; the first class of a process also imports
torch._functorch.aot_autograd (which loads Dynamo, ~0.9 s). Only a trace-cache miss pays it.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from cost_models.graph import Launches

__all__ = ["CompiledBlock", "compiled_block", "compiled_saved_bytes", "fused_bytes", "launches"]


class _Flat(nn.Module):
    """The block with flat tensor arguments and a tuple output (what aot_module_simplified takes)."""

    def __init__(self, block: nn.Module, rebuild: Callable[[tuple], tuple[tuple, dict]]) -> None:
        super().__init__()
        self.block = block
        self.rebuild = rebuild

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = self.rebuild(flat)
        with _as_dynamo_sees():
            out = self.block(*args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# The tracing-state functions Dynamo answers with a constant while it traces a torch.compile'd forward
# (torch._dynamo.variables.torch.tracing_state_functions): model code branches on them
_TRACING_STATE = ("is_compiling", "is_dynamo_compiling", "is_exporting")


@functools.cache
def _dynamo_flags() -> dict[str, bool]:
    """What torch.compiler's tracing-state functions return inside a forward that this torch's Dynamo traces for
    torch.compile, asked of Dynamo itself (a one-op function compiled with the eager backend, ~0.25 s once a
    process). is_compiling is True; is_exporting depends on the torch: Dynamo folded it to True under
    torch.compile too until pytorch#176499 (torch 2.11 still does, 2.13 reads export's flag: False).
    Transformers' gated-DeltaNet fallback (Qwen3.5, Qwen3-Next) builds its chunks' triangular inverse by 63 in-place
    row updates where `is_torchdynamo_exporting()`, by torch.linalg.solve_triangular elsewhere: on an H200 under
    torch 2.11 its compiled block kept 3.85 GiB a 4096-token row, the solve_triangular partition 1.50."""
    try:
        import torch._dynamo

        def probe(x: torch.Tensor) -> tuple:
            return x, tuple(getattr(torch.compiler, n)() for n in _TRACING_STATE)

        fn = torch.compile(probe, backend="eager", fullgraph=True)
        return dict(zip(_TRACING_STATE, fn(torch.zeros(1))[1]))
    except Exception:  # Dynamo unavailable (an unsupported Python, say): what its table says
        return {"is_compiling": True, "is_dynamo_compiling": True, "is_exporting": False}


class _as_dynamo_sees:
    """Within: torch.compiler's tracing-state functions answer as under Dynamo (`_dynamo_flags`), so the block's
    own code takes the branches its compiled forward takes (`if is_torchdynamo_compiling()`,
    `if is_torchdynamo_exporting()` in Hugging Face models)."""

    def __enter__(self) -> None:
        flags = _dynamo_flags()
        self._saved = {n: getattr(torch.compiler, n) for n in flags}
        for n, v in flags.items():
            setattr(torch.compiler, n, functools.partial(bool, v))

    def __exit__(self, *exc: Any) -> None:
        for n, f in self._saved.items():
            setattr(torch.compiler, n, f)


def _flatten(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], Callable[[tuple], tuple[tuple, dict]]]:
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def rebuild(flat: tuple) -> tuple[tuple, dict]:
        full = list(leaves)
        for i, t in zip(slots, flat):
            full[i] = t
        return torch.utils._pytree.tree_unflatten(full, spec)

    return [leaves[i] for i in slots], rebuild


@functools.cache
def _decompositions() -> dict:
    """The core ATen decompositions with softmax and log-softmax decomposed as Inductor's table decomposes them
    (the same torch._decomp functions; the core table keeps both whole): the partitioner then sees their exp
    and reductions and recomputes the cheap chain around them. Gemma 2's soft-capped eager attention keeps one
    fp32 seq x seq tensor a layer less so (16.3 MB against 24.7 at 512 tokens and four heads; Inductor's full
    table, 16.3). Importing Inductor's own table (torch._inductor.decomposition) takes ~2 s a process."""
    from torch._decomp import core_aten_decompositions, get_decompositions
    aten = torch.ops.aten
    table = {**core_aten_decompositions(), **get_decompositions([aten._softmax, aten._log_softmax])}
    # Inductor keeps the scatters whole (torch._inductor.decomposition.decomps_to_exclude: for its re-inplacing
    # pass); decomposed, the partitioner saves other nodes around an in-place row update (the DeltaNet
    # forward substitution, a small Qwen3.5 block: 110 MiB where Inductor on CPU keeps 100.2, now predicted 100.2)
    for op in (aten.select_scatter, aten.slice_scatter):
        for overload in op.overloads():
            table.pop(getattr(op, overload), None)
    return table


def _remove_noop_copies(graph: torch.fx.Graph) -> None:
    """Inductor's first joint-graph pass (torch._inductor.fx_passes.joint_graph.joint_graph_passes ->
    post_grad.remove_noop_ops), for the ops it treats as always no-ops: clone, alias and a conversion to the
    dtype a tensor already has, each replaced by its input where the two have the same metadata (shape,
    strides, dtype), unless that would make a graph output alias an input or another output. A dropout of
    p = 0 in training decomposes to a clone (torch._decomp's `dropout`), which the partitioner would otherwise
    save beside its input: a whole seq x seq tensor a layer under eager attention (GPT-NeoX Japanese's compiled
    peak on an H200, s62: 88.1 GiB predicted with the clone saved, 71.0 measured). Written out here: importing
    Inductor's pass module costs ~1 s a process."""
    aten, prims = torch.ops.aten, torch.ops.prims

    def is_noop(node: torch.fx.Node) -> bool:
        if node.target in (aten.clone.default, aten.alias.default):
            return True
        return node.target is prims.convert_element_type.default and _val(node.args[0]) is not None and \
            _val(node.args[0]).dtype == node.args[1]

    def storage(node: Any) -> Any:
        val = _val(node)
        return StorageWeakRef(val.untyped_storage()) if val is not None else None

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    input_storages = {storage(n) for n in placeholders}
    output_storages = {storage(n) for n in outs if isinstance(n, torch.fx.Node)}
    for node in list(graph.nodes):
        if node.op != "call_function" or not is_noop(node) or not isinstance(node.args[0], torch.fx.Node):
            continue
        src = node.args[0]
        a, b = _val(node), _val(src)
        if a is None or b is None or not (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                                          and a.layout == b.layout and a.stride() == b.stride()):
            continue
        view = storage(node) == storage(src)
        if not view and storage(node) in output_storages and (storage(src) in input_storages
                                                              or storage(src) in output_storages):
            continue  # no new aliasing between inputs and outputs
        if view and node in outs and (src in placeholders or src in outs):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _partition(block: nn.Module, args: tuple, kwargs: dict, decompositions: dict | None,
               backward: bool = False) -> tuple[Any, Any, int, list]:
    """(forward fx graph, backward fx graph or None, number of real outputs, flat inputs) of the partitioned
    block; the backward graph only with `backward` (AOTAutograd compiles it at the first backward, so the
    meta forward and backward are run once)."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    if decompositions is None:
        decompositions = _decompositions()
    _dynamo_flags()  # asked of Dynamo here, outside the trace below, which `_Flat` runs under them
    flat, rebuild = _flatten(args, kwargs)
    mod = _Flat(block, rebuild)
    n_static = len(list(mod.parameters())) + len(list(mod.buffers()))
    graphs: dict[str, Any] = {}

    # boxed: the compiled function is called once (for the backward graph), and AOTAutograd warns of unboxed ones
    def fw_compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Callable:
        graphs["fw"] = gm
        return make_boxed_func(gm)

    def bw_compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Callable:
        graphs["bw"] = gm
        return make_boxed_func(gm)

    def partition(gm: torch.fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
        _remove_noop_copies(gm.graph)
        gm.recompile()
        # parameters are static inputs (free to save), as Dynamo marks them for Inductor
        kw["static_lifetime_input_indices"] = list(range(n_static))
        graphs["outputs"] = kw.get("num_fwd_outputs", 1)
        return min_cut_rematerialization_partition(gm, joint_inputs, compiler="inductor", **kw)

    from torch._subclasses.fake_tensor import FakeTensorMode

    from autoparallel.tracer import _FusedKernels

    # the inputs fake in a mode that admits real meta tensors: a forward that indexes with a Python list
    # (Falcon's multi-query split, qkv[..., [-2], :]) makes its index tensor outside the fake mode, which
    # Dynamo would have traced as a constant
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    fake_flat = [fake.from_tensor(t) for t in flat]
    # attention as the fused kernel a GPU runs (the meta device would pick the math path, whose seq x seq
    # probabilities the partitioner would then weigh); RMSNorm left to decompose, as Inductor does
    with torch.device("meta"), _FusedKernels(attention_only=True):
        compiled = aot_module_simplified(mod, tuple(fake_flat), fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                                         partition_fn=partition, decompositions=decompositions)
        if backward:
            try:
                outs = [o for o in compiled(*fake_flat) if isinstance(o, torch.Tensor) and o.requires_grad]
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            except Exception:  # an op without a meta kernel in the backward: the saved set still stands
                graphs.pop("bw", None)
    return graphs["fw"], graphs.get("bw"), graphs["outputs"], [*mod.parameters(), *mod.buffers(), *flat]


@dataclass(frozen=True)
class CompiledBlock:
    """What the compiled form of one block costs, per traced batch: the bytes its forward keeps for the
    backward, and the bytes Inductor's fused kernels move in each phase (`fused_bytes`; None where the meta
    backward could not run)."""
    saved_bytes: int
    fused_fwd_bytes: int | None
    fused_bwd_bytes: int | None
    launches_fwd: Launches | None = None
    launches_bwd: Launches | None = None


def compiled_saved_bytes(block: nn.Module, args: tuple, kwargs: dict | None = None,
                         decompositions: dict | None = None) -> int:
    """Bytes the compiled `block` keeps from its forward for its backward, called on meta `args`/`kwargs`
    (see the module docstring)."""
    fw, _, n_out, inputs = _partition(block, args, kwargs or {}, decompositions)
    return _saved_bytes(block, fw, n_out, inputs)


def compiled_block(block: nn.Module, args: tuple, kwargs: dict | None = None,
                   decompositions: dict | None = None) -> CompiledBlock:
    """The saved bytes and both phases' fused bytes of the compiled `block` on meta `args`/`kwargs`, from
    one partition (the module docstring)."""
    fw, bw, n_out, inputs = _partition(block, args, kwargs or {}, decompositions, backward=True)
    saved = _saved_bytes(block, fw, n_out, inputs)
    if bw is None:
        return CompiledBlock(saved, None, None)
    return CompiledBlock(saved, fused_bytes(fw), fused_bytes(bw), launches(fw), launches(bw))


def _saved_bytes(block: nn.Module, fw: Any, n_out: int, inputs: list) -> int:
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


# Ops Inductor leaves to library kernels (cuBLAS GEMMs, the flash/efficient attention kernels): each fused
# kernel ends at them. GEMMs by name, attention by a part of it (its forward and backward variants).
_EXTERN = frozenset(("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "_grouped_mm",
                     "_scaled_mm"))
_EXTERN_PARTS = ("flash_attention", "efficient_attention", "cudnn_attention", "scaled_dot_product")
# Ops Inductor runs as kernels of their own, fused with nothing around them: scatters and indexed
# accumulations (their output buffer is filled first, then updated in place), sorts, top-k and scans (library
# or template kernels): each reads its inputs and writes its outputs, and splits the groups around it
_BARRIERS = frozenset(("scatter", "scatter_add", "scatter_reduce", "index_put", "index_put_", "_unsafe_index_put",
                       "sort", "topk", "argsort", "cumsum", "cumprod", "histc", "bincount", "nonzero", "unique",
                       "_unique2", "searchsorted"))
# Ops that move no data (a layout over their input's storage), which Inductor folds into its kernels' indexing
_VIEWS = frozenset(("view", "_unsafe_view", "reshape", "_reshape_alias", "permute", "t", "transpose", "expand",
                    "unsqueeze", "squeeze", "alias", "slice", "select", "split", "split_with_sizes", "unbind",
                    "as_strided", "detach", "chunk"))


def _op_kind(node: Any) -> str:
    """"fused" (pointwise, reduction: Inductor generates it), "barrier" (a kernel of its own, _BARRIERS),
    "view", "extern" (a library kernel) or "outside" (an input, output or constant of the graph). getitem
    takes the kind of its source's output (a barrier's outputs are its own)."""
    if node.op != "call_function":
        return "outside"
    if node.target is operator.getitem:
        return "outside" if _op_kind(node.args[0]) in ("extern", "barrier") else "view"
    name = str(node.target)
    base = name.split(".")[1] if name.startswith("aten.") else name
    if base in _EXTERN or any(part in base for part in _EXTERN_PARTS):
        return "extern"
    if base in _BARRIERS:
        return "barrier"
    return "view" if base in _VIEWS else "fused"


def _groups(nodes: list, kind: dict, kinds: tuple[str, ...], joins: Callable[[Any, Any, Any, Any], bool],
            merged: Callable[[Any, Any], None] | None = None) -> list[list]:
    """The graph's nodes of `kinds` joined through their data edges (union-find) where `joins(node, input, the
    input's group, the node's group)` (groups by their root node; `merged(root, into)` after each join), as
    groups, those of views alone left out."""
    parent = {n: n for n in nodes if kind[n] in kinds}

    def root(n: Any) -> Any:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in parent:
        for u in n.all_input_nodes:
            if u not in parent:
                continue
            a, b = root(u), root(n)
            if a is not b and joins(n, u, a, b):
                parent[a] = b
                if merged is not None:
                    merged(a, b)
    groups: dict[Any, list] = {}
    for n in parent:
        groups.setdefault(root(n), []).append(n)
    return [m for m in groups.values() if not all(kind[x] == "view" for x in m)]


def fused_bytes(gm: torch.fx.GraphModule) -> int:
    """Bytes the memory-bound kernels of one compiled graph move, as Inductor fuses them: the graph's
    pointwise and reduction ops, joined through their data edges (and the views between them), form groups
    that run without materializing what stays inside (a scatter, sort, top-k or scan is a group of its own:
    _BARRIERS); each group reads every tensor it takes from outside
    (graph inputs, GEMM and attention outputs) once and writes every tensor used outside it (GEMM and
    attention inputs, graph outputs: the block's output, the saved activations, the gradients) once. A lower
    bound on what Inductor moves (it splits a group at reductions of different shapes and may re-read an
    input there); the kernels' rate on these bytes is the calibration's compiled_fused_fraction. Eager runs
    the same ops one kernel each, every intermediate written and read back: a fp32 RMSNorm of seven
    pointwise kernels moves about 7x what its one fused kernel does, a LayerNorm already one kernel eager
    the same bytes."""
    nodes = list(gm.graph.nodes)
    kind = {n: _op_kind(n) for n in nodes}
    total = 0
    # a barrier is a group of its own
    for members in _groups(nodes, kind, ("fused", "view", "barrier"), lambda n, u, *_: "barrier" not in (kind[n], kind[u])):
        inside = set(members)
        moved: set[StorageWeakRef] = set()
        for m in members:
            tensors = [u.meta.get("val") for u in m.all_input_nodes if u not in inside]
            if any(user not in inside for user in m.users):
                out = m.meta.get("val")
                tensors.extend(out if isinstance(out, (tuple, list)) else [out])  # a sort's values and indices
            for val in tensors:
                if isinstance(val, torch.Tensor):
                    key = StorageWeakRef(val.untyped_storage())
                    if key not in moved:
                        moved.add(key)
                        total += val.numel() * val.element_size()
    return total


# Reductions, each of which Inductor runs in a kernel with the other reductions of its group that have its shape
# (outputs, elements reduced into each): a norm's statistics over the hidden dimension in one, its weight's
# gradient (a sum over the tokens) in another
_REDUCTIONS = frozenset(("sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "std", "prod", "argmax",
                         "argmin", "any", "all", "logsumexp"))


def _reduction_shape(node: Any) -> tuple[int, int, bool] | None:
    """(outputs, elements reduced into each, over the leading dimensions) of a reduction node, else None."""
    name = str(node.target)
    if (name.split(".")[1] if name.startswith("aten.") else name) not in _REDUCTIONS:
        return None
    out, src = _val(node), _val(node.args[0]) if node.args else None
    if isinstance(node.meta.get("val"), (tuple, list)):  # var_mean: (var, mean) of one shape
        out = node.meta["val"][0]
    if out is None or src is None or src.dim() == 0:
        return None
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else list(range(src.dim()))
    dims = [d % src.dim() for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
    return out.numel(), src.numel() // max(out.numel(), 1), src.dim() - 1 not in dims


# a fused attention's backward launches three kernels (cuDNN's on an H200, as FlashAttention's): the dO.O row sums,
# the main kernel, dQ's conversion from its fp32 accumulator (s78's profiled blocks)
_ATTENTION_BACKWARD_KERNELS = 3


def _kernel_groups(nodes: list, kind: dict) -> list[list]:
    """The pointwise and reduction ops (with the views between them) joined through their data edges into the
    groups Inductor could run as one kernel each: two groups join unless a library kernel or barrier lies on a
    path between them (a kernel cannot both feed a GEMM and read its output), checked on each group's library
    kernels upstream and downstream (bit sets). A view of an input read by several ops joins none of them (the
    rotary table the query and the key share)."""
    bit = {n: 1 << i for i, n in enumerate(m for m in nodes if kind[m] in ("extern", "barrier"))}
    up: dict[Any, int] = {}
    for n in nodes:  # library kernels at or before each node
        up[n] = bit.get(n, 0) | functools.reduce(operator.or_, (up[u] for u in n.all_input_nodes), 0)
    down: dict[Any, int] = {}
    for n in reversed(nodes):  # ... at or after it
        down[n] = bit.get(n, 0) | functools.reduce(operator.or_, (down[w] for w in n.users), 0)

    def joins(_n: Any, u: Any, a: Any, b: Any) -> bool:
        shared_view = kind[u] == "view" and len(u.users) > 1 and all(kind[w] != "fused" for w in u.all_input_nodes)
        # joined, the group would hold a library kernel's input and its output
        return not shared_view and not (down[a] & up[b] or down[b] & up[a])

    def merged(a: Any, b: Any) -> None:
        up[b] |= up[a]
        down[b] |= down[a]

    return _groups(nodes, kind, ("fused", "view"), joins, merged)


def launches(gm: torch.fx.GraphModule) -> Launches:
    """The kernels one compiled graph launches, as Inductor fuses it (`Launches`): each library kernel
    (`_EXTERN`; an attention backward three) and barrier its own, one per reduction shape of each group of
    pointwise and reduction ops (`_kernel_groups`), one for a group without reductions, and each reduction over
    the leading dimensions in `outer` (where Inductor splits it, its second kernel)."""
    nodes = list(gm.graph.nodes)
    kind = {n: _op_kind(n) for n in nodes}
    fixed = sum(_ATTENTION_BACKWARD_KERNELS if kind[n] == "extern" and "attention_backward" in str(n.target) else 1
                for n in nodes if kind[n] in ("extern", "barrier"))
    outer: list[tuple[int, float]] = []
    for members in _kernel_groups(nodes, kind):
        shapes = [s for s in map(_reduction_shape, members) if s is not None]
        fixed += max(1, len(set(shapes)))
        outer.extend((n, float(r)) for n, r, leading in shapes if leading)
    return Launches(fixed, tuple(outer))
