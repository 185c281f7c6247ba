"""Meta-device tracer: any PyTorch model -> OpGraph with exact per-op costs, no weights allocated.

How (torch's own machinery, no hand formulas):
  * the model is built on (or copied to) the meta device: shapes and dtypes, no storage;
  * one training step (forward, loss, backward) runs under a TorchDispatchMode that records every aten
    op: FLOPs from torch.utils.flop_counter's registry, bytes from tensor sizes, edges from tensor
    identity (producer of each input tensor, falling back to the storage's creator / last in-place
    writer so views and in-place ops keep their dependencies);
  * module attribution by forward pre/post hooks on every module (fwd) and, in backward, by the
    autograd Node being executed: its sequence number maps to the fwd op that created it
    (`fwd_node`), whose module the bwd op inherits (AccumulateGrad maps to its parameter's module);
  * saved-for-backward bytes from torch.autograd.graph.saved_tensors_hooks, deduplicated by storage
    and attributed to the op that created the storage;
  * F.scaled_dot_product_attention is costed as the fused kernel a GPU runs (flash attention for 16-bit
    inputs without a mask, memory-efficient attention otherwise) instead of the math fallback the
    meta device would pick: the fused kernels save O(s) statistics, not the s x s probabilities.

A model that cannot run on meta tensors (data-dependent control flow: `.item()`, `if x.sum() > 0:`)
yields a module-level graph (one node per leaf module) with a warning instead of an exception.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from autoparallel.blocks import find_blocks
from autoparallel.errors import UserError
from autoparallel.graph import ExpertGroup, OpGraph, ParamOp
from autoparallel.hf import (
    config_values,
    fused_split,
    is_hf_causal_lm,
    is_norm_like,
    linear_features,
    normalized_width,
    projection_heads,
)
from autoparallel.plan import fingerprint
from autoparallel.replicate import ReplicationPlan, expand, plan_replication, reduced

__all__ = ["trace", "find_blocks"]

_ACCUMULATE_GRAD_SEQ = 2**64 - 1   # sequence number of AccumulateGrad nodes (UINT64_MAX)
# Ops one block may run in one forward. The largest blocks of the Hugging Face configs measured record <= 280
# (Longcat-Flash's, Qwen3-Next's; a per-expert loop adds ~10 an expert: 256 experts ~2,600); a block past this
# loops in Python over its tokens (Jamba's Mamba mixer on transformers' reference path: ~16 ops a token), which
# at 4096 tokens is ~65,000 ops a layer, a trace of many minutes and gigabytes, and a step of as many kernels
MAX_BLOCK_FORWARD_OPS = 20_000
_NORM_CLASSES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm,
                                              nn.BatchNorm1d, nn.BatchNorm2d)


# ============================================================================ public entry point
def trace(model: nn.Module | Any | str, *, batch: int = 1, seq_len: int = 2048,
          dtype: torch.dtype = torch.bfloat16, example_inputs: Any = None,
          loss_fn: Callable[..., torch.Tensor] | None = None,
          model_name: str | None = None, replicate_blocks: bool = True, compiled_saved: bool = True,
          padded: bool = False) -> OpGraph:
    """Trace one training step (forward + loss + backward) of `model` into an OpGraph.

    model: an nn.Module (real or meta weights: it is never modified, and real weights are not
        copied: the tracer works on a meta copy that shares nothing), a ModelSpec, a spec reference
        string (catalog name, config path) or `package.module:callable` (see specs.load_model).
    batch, seq_len: shape of the default input, token ids [batch, seq_len] (int64) fed to models with
        an nn.Embedding at their input. Other models need `example_inputs`: a tensor, a tuple of
        positional inputs, or a dict of keyword inputs (moved to meta; floating ones cast to dtype).
    dtype: floating parameters, buffers and inputs are cast to it (bf16: 16-bit activations).
    padded: a Hugging Face causal LM's default input carries an attention_mask (batches with padding), so its
        attention runs as the trainer then runs it: a kernel given a mask, which computes every score.
    loss_fn: loss_fn(output, *positional_inputs) -> scalar tensor. Default: cross entropy of the
        logits (in fp32, as torchtitan) against the input tokens for language models, else
        output.sum().
    replicate_blocks: trace one representative of each run of identical blocks and copy its ops to
        the others (autoparallel.replicate; the same graph, in time independent of depth). False
        traces every block (for a model whose forward treats identical blocks differently by position).
    compiled_saved: run AOTAutograd's partitioner on each block class for what its compiled form saves
        (OpGraph.compiled_saved: most of a small model's trace time). False leaves it empty, so compiled
        blocks are priced with eager's saved bytes: for callers that read only the graph's structure (a
        placement derivation).
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise UserError(f"trace: batch must be a positive integer, got {batch!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise UserError(f"trace: seq_len must be a positive integer, got {seq_len!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise UserError(f"trace: dtype must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}")
    meta_model, name, spec = _meta_model(model, dtype)
    no_pipeline = _use_training_forward(meta_model)
    name = model_name or name
    meta_model.train()  # training step: dropout active, as in the runs being planned
    blocks = find_blocks(meta_model)
    args, kwargs, tokens, vocab = _inputs(meta_model, blocks, name, batch, seq_len, dtype, example_inputs)
    if padded and example_inputs is None:
        if not is_hf_causal_lm(meta_model):
            raise UserError(f"trace {name}: padded batches carry an attention mask, which only a Hugging Face causal "
                            f"LM built by transformers takes here (an nn.Module, or a config of a type autoparallel "
                            f"does not implement itself); plan without padding")
        kwargs = {**kwargs, "attention_mask": torch.ones(batch, seq_len, dtype=torch.long, device="meta")}

    def loss_of(out: Any) -> torch.Tensor:
        return _loss(out, args, tokens, vocab, loss_fn)

    plan = plan_replication(meta_model, blocks) if replicate_blocks else None
    tr = _traced_replicated(meta_model, plan, args, kwargs, loss_of) if plan is not None else None
    error: BaseException | None = None
    if tr is None:
        tr, error = _traced(meta_model, blocks, args, kwargs, loss_of)
    if error is not None and not _meta_limitation(error):
        what = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no message'}"
        if is_hf_causal_lm(meta_model):  # our forward ran its layers (autoparallel/hf.py), not the user's code
            raise UserError(f"trace: {name}'s layers raised {what}{_raised_at(error)} under autoparallel's Hugging "
                            f"Face forward (autoparallel/hf.py: rotary or learned positions, causal masks); where "
                            f"the config leaves a value that code reads unset (None), fix the config; else this "
                            f"architecture is not supported there; pass a package.module:callable whose forward "
                            f"runs a step")
        raise UserError(f"trace: {name}'s forward raised {what}{_raised_at(error)} (on a batch of {batch} x {seq_len} "
                        f"tokens); fix the model so that one training step runs, then plan it")

    graph = OpGraph(g=nx.DiGraph(), model_name=name, batch=batch, seq_len=seq_len,
                    dtype=str(dtype).removeprefix("torch."), parameters=0, param_bytes=0,
                    blocks=blocks, spec=spec,
                    fingerprint=fingerprint([(n, tuple(p.shape)) for n, p in meta_model.named_parameters()]))
    _fill_parameters(graph, meta_model, blocks, tr.no_grad_paths)
    graph.selective_as_op = [p for p in blocks if not any(hasattr(m, "recompute_core")
                                                          for m in meta_model.get_submodule(p).modules())]
    graph.config_heads = _config_heads(meta_model)
    graph.no_pipeline = no_pipeline
    if error is None:
        _build_op_graph(graph, tr)
        if compiled_saved:
            _fill_compiled_saved(graph, meta_model, tr.block_inputs)
    else:
        msg = (f"{name}: traced at module level only ({type(error).__name__}: "
               f"{str(error).splitlines()[0] if str(error) else 'no message'}); data-dependent control "
               "flow (.item(), `if tensor:`) cannot run on the meta device. FLOPs cover the ops reached "
               "before that point (backward: 2x forward), so predicted step times and memory are lower bounds")
        warnings.warn(msg, stacklevel=2)
        graph.warnings.append(msg)
        _build_module_level_graph(graph, tr, meta_model)
    graph.warnings.extend(tr.warnings)
    _find_expert_groups(graph, meta_model, blocks)
    return graph


def _raised_at(error: BaseException) -> str:
    """" at <file>:<line> (<function>)" of the innermost frame of `error` outside torch and this module's dispatch
    modes (the model's own code, where the cause is to be read), the file from its package's directory on; ""
    without one."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if f"{os.sep}torch{os.sep}" not in f.filename and "<" not in f.filename and f.filename != __file__]
    if not frames:
        return ""
    path = Path(frames[-1].filename)
    root = path.parent
    while (root / "__init__.py").exists():  # up to the directory above the outermost package
        root = root.parent
    return f" at {path.relative_to(root).as_posix()}:{frames[-1].lineno} ({frames[-1].name})"


def _meta_limitation(error: BaseException) -> bool:
    """Whether a failed trace hit what meta tensors cannot do (data-dependent control flow such as
    `.item()` or `if tensor:`, an op without a meta kernel: RuntimeError / NotImplementedError, or a
    message naming the meta device), rather than a bug of the model itself (ValueError, TypeError,
    KeyError, ... on any device), which is the user's to fix and must not be planned around."""
    return isinstance(error, (RuntimeError, NotImplementedError)) or "meta" in str(error).lower()


def _traced(model: nn.Module, blocks: list[str], args: tuple, kwargs: dict,
            loss_of: Callable[[Any], torch.Tensor]) -> tuple[_Tracer, BaseException | None]:
    """The recorded step, and the exception that stopped it (None when it completed)."""
    tr = _Tracer(model, blocks)
    error: BaseException | None = None
    try:
        tr.run(args, kwargs, loss_of)
    except UserError:
        raise
    except Exception as e:  # data-dependent control flow and anything else meta tensors cannot run
        error = e
    finally:
        tr.remove_hooks()
    return tr, error


def _traced_replicated(model: nn.Module, plan: ReplicationPlan, args: tuple, kwargs: dict,
                       loss_of: Callable[[Any], torch.Tensor]) -> _Tracer | None:
    """The step traced on the reduced model, its ops expanded to every block (autoparallel.replicate);
    None when the model does not fit the pattern and every block has to be traced."""
    with reduced(model, plan) as kept:
        tr, error = _traced(model, kept, args, kwargs, loss_of)
    for p in model.parameters():  # the full trace a failed expansion falls back to starts without gradients
        p.grad = None             # (else its first accumulations are add_ where a first backward assigns)
    if error is not None:
        return None
    _assign_regions(tr.nodes, kept)
    full = expand(tr.nodes, tr.edges, plan)
    if full is None:
        return None
    tr.nodes, tr.edges = full
    return tr


def _config_heads(model: nn.Module) -> tuple[int, int]:
    """(query heads, key/value heads) of a model with a Hugging Face style config, (0, 0) without one. Where they
    differ by layer (a heterogeneous config) their greatest common divisor: what a tensor-parallel degree must
    divide in every layer."""
    config = getattr(model, "config", None)

    def count(key: str) -> int:
        values = config_values(config, key)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            return 0
        return math.gcd(*values)

    heads = count("num_attention_heads")
    if not heads:
        return 0, 0
    return heads, count("num_key_value_heads") or count("num_kv_heads") or heads


# ============================================================================ model preparation
def _meta_model(model: Any, dtype: torch.dtype) -> tuple[nn.Module, str, Any]:
    """(meta copy of the model, its name, its ModelSpec or None)."""
    if isinstance(model, nn.Module):
        return _meta_copy(model, dtype), type(model).__name__, getattr(model, "spec", None)
    from autoparallel.specs import ModelSpec, load_model

    if not isinstance(model, (str, dict, ModelSpec)):
        raise UserError(f"trace: expected an nn.Module, a ModelSpec or a model name, got "
                        f"{type(model).__name__}")
    with torch.device("meta"):
        built, spec = load_model(model)
    name = spec.name if spec is not None else (model if isinstance(model, str) else type(built).__name__)
    if all(t.device.type == "meta" for t in itertools.chain(built.parameters(), built.buffers())):
        # Our own meta model: cast in place (Module._apply keeps Parameter identity, hence ties).
        built._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
        return built, name, spec
    return _meta_copy(built, dtype), name, spec


def _use_training_forward(meta_model: nn.Module) -> str:
    """A Hugging Face causal LM traces through autoparallel.hf's forward (installed on the meta copy,
    the user's module and transformers stay untouched): the training step the trainer runs, without
    a KV cache and without transformers' mask builders, whose data-dependent checks
    (find_packed_sequence_indices(...).all()) cannot run on meta tensors. Returns why its blocks cannot be cut
    into pipeline stages (HFParts.no_pipeline; "" where they can, and for every other model)."""
    from autoparallel.hf import hf_parts, install_forward, is_hf_causal_lm

    if not is_hf_causal_lm(meta_model):
        return ""
    parts = hf_parts(meta_model)
    install_forward(meta_model, parts)
    return parts.no_pipeline


def _meta_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy of the module tree whose parameters and buffers are meta tensors.

    Pre-seeding deepcopy's memo with a meta stand-in for every parameter and buffer means the real
    tensors are never copied (no weight memory) and shared parameters stay shared in the copy.
    """
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) in memo:
            continue
        cast = dtype if t.is_floating_point() else t.dtype
        m = torch.empty_like(t, device="meta", dtype=cast)
        if isinstance(t, nn.Parameter):
            m = nn.Parameter(m, requires_grad=t.requires_grad)
        memo[id(t)] = m
    try:
        return copy.deepcopy(model, memo)
    except Exception as e:
        raise UserError(f"trace: cannot copy {type(model).__name__} to the meta device "
                        f"({type(e).__name__}: {e}); build it under `with torch.device('meta'):` "
                        "and pass that instead") from None


# ============================================================================ structure
def _block_lookup(blocks: Sequence[str]) -> Callable[[str], str | None]:
    block_set = set(blocks)
    cache: dict[str, str | None] = {}

    def block_of(path: str) -> str | None:
        if path in cache:
            return cache[path]
        found = None
        parts = path.split(".") if path else []
        for i in range(1, len(parts) + 1):
            p = ".".join(parts[:i])
            if p in block_set:
                found = p
                break
        cache[path] = found
        return found

    return block_of


def _root_embedding(model: nn.Module, blocks: Sequence[str]) -> nn.Embedding | None:
    block_of = _block_lookup(blocks)
    for path, mod in model.named_modules():
        if isinstance(mod, nn.Embedding) and block_of(path) is None:
            return mod
    return None


def _inputs(model: nn.Module, blocks: list[str], name: str, batch: int, seq_len: int, dtype: torch.dtype,
            example_inputs: Any) -> tuple[tuple, dict, torch.Tensor | None, int | None]:
    if example_inputs is not None:
        def to_meta(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return torch.empty_like(x, device="meta",
                                        dtype=dtype if x.is_floating_point() else x.dtype)
            return x
        if isinstance(example_inputs, dict):
            return (), {k: to_meta(v) for k, v in example_inputs.items()}, None, None
        if isinstance(example_inputs, (tuple, list)):
            return tuple(to_meta(x) for x in example_inputs), {}, None, None
        return (to_meta(example_inputs),), {}, None, None
    emb = _root_embedding(model, blocks)
    if emb is None:
        raise UserError(f"trace {name}: the model has no nn.Embedding at its input, so the default "
                        "token-id input does not apply; pass example_inputs=(tensor, ...)")
    tokens = torch.zeros(batch, seq_len, dtype=torch.long, device="meta")
    return (tokens,), {}, tokens, emb.num_embeddings


def _main_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    leaves = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
    if not leaves:
        raise UserError(f"trace: the model returned {type(out).__name__} with no tensor; pass loss_fn=")
    return leaves[0]


def _loss(out: Any, args: tuple, tokens: torch.Tensor | None, vocab: int | None,
          loss_fn: Callable[..., torch.Tensor] | None) -> torch.Tensor:
    if loss_fn is not None:
        return loss_fn(out, *args)
    y = _main_output(out)
    if tokens is not None and y.dim() == tokens.dim() + 1 and y.shape[:-1] == tokens.shape \
            and y.shape[-1] == vocab:
        # torchtitan's cross_entropy_loss: logits upcast to fp32, mean over tokens.
        return F.cross_entropy(y.flatten(0, -2).float(), tokens.flatten())
    return y.sum()


# ============================================================================ recording
def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dense(t: torch.Tensor) -> bool:
    import torch._prims_common as prims  # torch 2.13 names it ..._or_false; 2.11 has both
    dense = getattr(prims, "is_non_overlapping_and_dense_or_false", None) or prims.is_non_overlapping_and_dense
    return bool(dense(t))


def _gapped(t: torch.Tensor) -> bool:
    """A tensor whose elements do not fill the memory they span (a slice, a strided view), other than a
    broadcast (a zero stride: its own kernel class)."""
    return 0 not in t.stride() and not _dense(t)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether an elementwise kernel reads `a` and writes `b` element for element through memory (equal
    shapes and strides, both dense): TensorIterator's vectorized path."""
    return a.shape == b.shape and a.stride() == b.stride() and _dense(a) and _dense(b)


def _edge_broadcast(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether `shape`, broadcast to `out`, is repeated along a run of leading or of trailing dimensions only
    (a [h] weight over rows, a [rows, 1] column over features), not along dimensions on both sides of the
    ones it spans (a [S, 1, D] table over [B, S, H, D])."""
    aligned = (1,) * (len(out) - len(shape)) + shape
    repeated = [i for i, (a, o) in enumerate(zip(aligned, out)) if a == 1 and o > 1]
    n = len(repeated)
    return repeated == list(range(n)) or repeated == list(range(len(out) - n, len(out)))


def _detached(x: Any) -> Any:
    """A tensor as a fresh leaf with its requires_grad (no autograd history); anything else as is."""
    return x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _skey(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


class _FusedKernels(TorchFunctionMode):
    """Routes attention and RMSNorm to the fused kernels a GPU runs instead of the composite
    (decomposed) paths the meta device would take, so saved-activation bytes match a GPU step.

    F.scaled_dot_product_attention: the meta device picks the math path (materialized scores, fp32
    softmax, s x s saved tensors); a CUDA GPU runs flash attention for fp16/bf16 without an explicit
    mask (GQA native via enable_gqa) and memory-efficient attention otherwise. Shapes outside those
    kernels, and a mask whose last dimension is not contiguous, fall back unchanged (the math path).
    F.rms_norm: CUDA runs aten._fused_rms_norm (saves the input and fp32 rstd); on meta it decomposes
    into fp32 copies that autograd would save. Costed as autoparallel::fused_rms_norm (below).
    F.dropout (training, 0 < p < 1): CUDA runs aten.native_dropout (a 1-byte bool mask is saved); off
    CUDA it becomes empty_like(x).bernoulli_() whose mask has x's dtype (2 bytes in bf16).
    attention_only: route attention alone (autoparallel.compiled_saved: Inductor decomposes the rest).
    """

    def __init__(self, attention_only: bool = False) -> None:
        super().__init__()
        self.attention_only = attention_only

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _fused_sdpa(*args, **kwargs)
            if out is not None:
                return out
        elif self.attention_only:
            pass
        elif func is F.rms_norm:
            return _rms_norm(*args, **kwargs)
        elif func is F.dropout:
            out = _native_dropout(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


# A fused RMSNorm (forward and backward) as custom ops with meta kernels only: the trace records one
# op each, and autograd saves exactly what the CUDA kernel saves (input, rstd, weight).
@torch.library.custom_op("autoparallel::fused_rms_norm", mutates_args=())
def _fused_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                    ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("autoparallel::fused_rms_norm exists for meta-device tracing only")


@_fused_rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor | None, eps: float, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    rstd_shape = tuple(x.shape[: x.dim() - ndim]) + (1,) * ndim
    return torch.empty_like(x), x.new_empty(rstd_shape, dtype=torch.float32)


@torch.library.custom_op("autoparallel::fused_rms_norm_backward", mutates_args=())
def _fused_rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                             weight: torch.Tensor | None, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("autoparallel::fused_rms_norm_backward exists for meta-device tracing only")


@_fused_rms_norm_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None,
      ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), (torch.empty_like(weight) if weight is not None else x.new_empty(0))


def _rms_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, weight, _eps, ndim = inputs
    ctx.save_for_backward(x, output[1], weight)
    ctx.ndim = ndim


def _rms_backward(ctx: Any, grad: torch.Tensor, _grad_rstd: torch.Tensor) -> tuple:
    x, rstd, weight = ctx.saved_tensors
    gx, gw = _fused_rms_norm_backward(grad, x, rstd, weight, ctx.ndim)
    return gx, (gw if weight is not None else None), None, None


_fused_rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


def _rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
              eps: float | None = None) -> torch.Tensor:
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    return _fused_rms_norm(input, weight, float(eps), len(normalized_shape))[0]


def _native_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
                    inplace: bool = False) -> torch.Tensor | None:
    if inplace or not training or not 0.0 < p < 1.0 or not input.is_floating_point():
        return None
    return torch.ops.aten.native_dropout(input, p, True)[0]


# fused attention ops -> the position of the query among their arguments (key and value follow it)
_SDPA_QUERY_ARG = {
    **{getattr(torch.ops.aten, n): 0 for n in ("_scaled_dot_product_flash_attention",
                                               "_scaled_dot_product_efficient_attention",
                                               "_scaled_dot_product_cudnn_attention") if hasattr(torch.ops.aten, n)},
    **{getattr(torch.ops.aten, n): 1 for n in ("_scaled_dot_product_flash_attention_backward",
                                               "_scaled_dot_product_efficient_attention_backward",
                                               "_scaled_dot_product_cudnn_attention_backward")
       if hasattr(torch.ops.aten, n)},
}


def _gqa_expanded(packet: Any, args: tuple) -> tuple:
    """The arguments of a fused attention op with grouped key/value heads repeated to the query's, for
    flop_counter's formula: torch 2.11's asserts equal head counts (2.13's broadcasts them), and the
    formula that rejects the args counts the attention as 0 FLOPs, which made plans made under torch
    2.11 price long sequences far too cheap (a 7B at 4096 tokens lost 15% of its FLOPs). The count is
    the same either way: the kernel computes every query head against its group's key/value head."""
    q = _SDPA_QUERY_ARG.get(packet)
    if q is None or len(args) < q + 3:
        return args
    query, key, value = args[q:q + 3]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return args
    hq, hk = query.shape[1], key.shape[1]
    if hk == hq or hk == 0 or hq % hk:
        return args
    rep = hq // hk
    return (*args[:q + 1], key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1), *args[q + 3:])


def _fused_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor | None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.shape[-1] > 256:
        return None
    if attn_mask is not None and attn_mask.dim() and attn_mask.shape[-1] != 1 and attn_mask.stride(-1) != 1:
        # every fused kernel wants the mask's last dim at stride 1 (torch's check_last_dim_stride_equals_1_dense):
        # Doge's learned mask, a transposed view, ran SDPA's math path on an H200, in fp32 (the meta device's too)
        return None
    hq, hk = query.shape[1], key.shape[1]
    if hq != hk and not (enable_gqa and hq % hk == 0):
        return None
    # flash needs one head dim for q, k and v; DeepSeek's latent attention (q/k 192, v 128) runs memory-efficient
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) and value.shape[-1] == query.shape[-1]:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    if hq != hk:  # memory-efficient attention has no GQA: K/V are expanded as the math path does
        key = key.repeat_interleave(hq // hk, dim=1)
        value = value.repeat_interleave(hq // hk, dim=1)
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~bias, float("-inf"))
    if bias is not None:
        bias = bias.expand(query.shape[0], hq, query.shape[2], key.shape[2])
    need_lse = query.requires_grad or key.requires_grad or value.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, need_lse, dropout_p, is_causal, scale=scale)[0]


def _is_causal(func: Any, args: tuple, kwargs: dict) -> bool | None:
    """The `is_causal` argument of a fused attention op (flash, memory-efficient, cuDNN; forward or backward), None
    for other ops: a causal kernel skips the masked half of the scores, one given a mask computes them all
    (compute.attention_times)."""
    schema = getattr(func, "_schema", None)
    if schema is None or "attention" not in schema.name:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.name == "is_causal":
            value = kwargs.get("is_causal", args[i] if i < len(args) else arg.default_value)
            return bool(value)
    return None


class _Recorder(TorchDispatchMode):
    def __init__(self, tracer: _Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default:
            out = _grouped_mm_meta(*args, **kwargs)
        elif func is torch.ops.aten.nonzero.default and args[0].is_meta:
            out = _nonzero_meta(self.tracer, args[0])
        else:
            out = func(*args, **kwargs)
        self.tracer.record(func, args, kwargs, out)
        return out


class _UniformRouting(TorchFunctionMode):
    """Runs a per-expert loop on the meta device as under uniform routing. Hugging Face's loop MoEs (DBRX; the
    eager experts of transformers 4.x) find the experts hit with `nonzero` on a `one_hot` mask of the router's
    choices, iterate over them and index stacked weights with each 0-d index: neither has a meta kernel (the
    count and the index are data). Here an F.one_hot output is known to be 1 / num_classes nonzero (one class a
    row), so the tokens an expert's slice of it selects are tokens x top_k / E, as the cost model assumes for
    grouped experts; a tensor of unknown density counts as wholly nonzero (every expert is hit: many tokens
    a step); and a 0-d integer index reads slice 0 (every expert's slice has the same shape)."""

    def __init__(self, tracer: _Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and len(args) == 2:
            index = args[1]
            if isinstance(index, tuple):
                index = tuple(_static_index(i) for i in index)
            else:
                index = _static_index(index)
            return func(args[0], index)
        out = func(*args, **kwargs)
        if func is F.one_hot and isinstance(out, torch.Tensor) and out.is_meta and out.shape[-1] > 0:
            self.tracer.nonzero_density[_skey(out)] = 1.0 / out.shape[-1]
        return out


def _static_index(index: Any) -> Any:
    """A 0-d integer meta tensor used as an index (an expert's number from a loop over `nonzero`) as 0."""
    if isinstance(index, torch.Tensor) and index.is_meta and index.dim() == 0 and not index.is_floating_point() \
            and index.dtype is not torch.bool:
        return 0
    return index


def _nonzero_meta(tracer: _Tracer, x: torch.Tensor) -> torch.Tensor:
    """aten.nonzero of a meta tensor (_UniformRouting): numel x its known density rows, all of them otherwise."""
    density = tracer.nonzero_density.get(_skey(x), 1.0)
    msg = ("nonzero (data-dependent, as a per-expert loop's routing) traced as under uniform routing: a one_hot "
           "mask's 1 / num_classes of its elements, any other tensor all of them; skewed routing runs slower")
    if msg not in tracer.warnings:
        tracer.warnings.append(msg)
    return torch.empty((round(x.numel() * density), x.dim()), dtype=torch.long, device="meta")


def _grouped_mm_meta(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The output of aten._grouped_mm without its meta kernel's CUDA checks (bf16 only, 16-byte strides),
    so models in any dtype and width trace; the CPU kernel accepts them too. Shapes as the kernel's:
    2D x 3D -> [M, N]; 3D x 2D -> [M, N_total]; 2D x 2D (groups along K) -> [G, M, N]; 3D x 3D -> bmm."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        shape = (offs.shape[0], mat_a.shape[0], mat_b.shape[1])
    elif mat_a.dim() == 3 and mat_b.dim() == 3:
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1])
    else:
        shape = (mat_a.shape[-2], mat_b.shape[-1])
    return mat_a.new_empty(shape, dtype=out_dtype or mat_a.dtype)


def _grouped_mm_flops(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any, out_val: torch.Tensor,
                      **kwargs: Any) -> float:
    """2 * sum over groups of m * n * k: 2 * numel(out) * K, except for 2D x 2D (groups along the
    contraction, out [G, M, N]) where each output element of group g sums only that group's K rows:
    2 * M * N * K_total. (torch.utils.flop_counter has no formula for this op.)"""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        return 2.0 * mat_a.shape[0] * mat_a.shape[1] * mat_b.shape[1]
    return 2.0 * out_val.numel() * mat_a.shape[-1]


def _is_depthwise(packet: Any, args: tuple) -> bool:
    """A convolution (or its backward) with one input channel a group: PyTorch runs it in its own
    depthwise kernels (conv_depthwise2d, for a conv1d too), which move bytes, not FLOPs
    (compute.classify: conv_depthwise)."""
    if packet is torch.ops.aten.convolution:
        weight, groups = args[1], args[8] if len(args) > 8 else 1
    elif packet is torch.ops.aten.convolution_backward:
        weight, groups = args[2], args[9] if len(args) > 9 else 1
    else:
        return False
    return int(groups) > 1 and isinstance(weight, torch.Tensor) and weight.dim() >= 2 and weight.shape[1] == 1


def _conv_backward_flops(grad_out: Any, x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                         transposed: bool, output_padding: Any, groups: int, output_mask: list[bool], *,
                         out_val: Any, **kwargs: Any) -> float:
    """flop_counter's convolution_backward formula with its weight gradient divided by `groups`: the formula
    takes no groups (torch 2.11-2.13), and its weight gradient, a convolution of the input and the output's
    gradient, counts every input channel against every output channel. A depthwise convolution (Qwen3-Next's
    and LFM2's short convolutions: 8192 groups) had its backward counted at 8192x its forward."""
    f = flop_registry[torch.ops.aten.convolution_backward]
    args = (grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    grad_input = f(*args, [output_mask[0], False, False], out_val=out_val) if output_mask[0] else 0
    grad_weight = f(*args, [False, output_mask[1], False], out_val=out_val) if output_mask[1] else 0
    return float(grad_input) + float(grad_weight) / max(int(groups), 1)


# FLOP formulas of our own where flop_counter has none or a wrong one (read once per traced op)
_OWN_FLOPS: dict[Any, Callable[..., float]] = {torch.ops.aten._grouped_mm: _grouped_mm_flops,
                                               torch.ops.aten.convolution_backward: _conv_backward_flops}


class _Tracer:
    """Holds the state of one traced step; nodes are plain dicts, edges (src, dst) pairs."""

    def __init__(self, model: nn.Module, blocks: list[str]) -> None:
        self.model = model
        self.blocks = blocks
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int]] = []
        self.phase = "fwd"
        self.in_loss = False            # forward ops after the model returned: the loss (node attribute "loss")
        self.warnings: list[str] = []
        self.module_stack: list[str] = []
        self.no_grad_paths: set[str] = set()    # modules called with autograd off in the forward
        self.producer: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor -> node id
        self.storage_owner: dict[StorageWeakRef, int] = {}           # storage -> creating node
        self.storage_writer: dict[StorageWeakRef, int] = {}          # storage -> last in-place writer
        self.saved_storages: set[StorageWeakRef] = set()
        # storage -> fraction of its elements that are nonzero, where the model made it by F.one_hot (a router's
        # expert mask): what aten.nonzero counts on the meta device (_UniformRouting)
        self.nonzero_density: dict[StorageWeakRef, float] = {}
        self.pending_saved = 0          # saved bytes of graph inputs, given to the next op
        self.seq_to_node: dict[int, int] = {}
        self.last_seq = torch.autograd._get_sequence_nr()
        # Parameters (and buffers: not activations) by storage; params also by identity for AccumulateGrad.
        self.param_storage: dict[StorageWeakRef, tuple[int, int, int]] = {}  # -> (index, numel, bytes)
        self.param_owner: dict[int, str] = {}
        for mod_path, mod in model.named_modules(remove_duplicate=False):
            for _, p in mod.named_parameters(recurse=False):
                if id(p) not in self.param_owner:
                    self.param_owner[id(p)] = mod_path
                    self.param_storage[_skey(p)] = (len(self.param_storage), p.numel(), _nbytes(p))
        self.state_storages = set(self.param_storage)
        self.state_storages.update(_skey(b) for b in model.buffers())
        self.hooks: list[Any] = []
        for path, mod in model.named_modules():
            self.hooks.append(mod.register_forward_pre_hook(self._push(path)))
            self.hooks.append(mod.register_forward_hook(self._pop, always_call=True))
        # each block's first forward arguments: what compiled_saved runs the block on (detached after the
        # step, outside the recorder: a detach inside it would be a traced op)
        self.block_inputs: dict[str, tuple[tuple, dict]] = {}
        self.block: str | None = None   # the block whose forward runs now, and the ops it has run
        self.block_ops = 0
        for path in blocks:
            mod = model.get_submodule(path)
            self.hooks.append(mod.register_forward_pre_hook(self._keep_inputs(path), with_kwargs=True))
            self.hooks.append(mod.register_forward_pre_hook(self._enter_block(path)))
            self.hooks.append(mod.register_forward_hook(self._leave_block, always_call=True))

    # -- module attribution
    def _push(self, path: str) -> Callable[..., None]:
        def hook(_mod: nn.Module, _args: Any) -> None:
            self.module_stack.append(path)
            if self.phase == "fwd" and not torch.is_grad_enabled():
                self.no_grad_paths.add(path)
        return hook

    def _pop(self, _mod: nn.Module, _args: Any, _out: Any) -> None:
        if self.module_stack:
            self.module_stack.pop()

    def _keep_inputs(self, path: str) -> Callable[..., None]:
        def hook(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
            if self.phase == "fwd" and path not in self.block_inputs:
                self.block_inputs[path] = (args, kwargs)
        return hook

    def _enter_block(self, path: str) -> Callable[..., None]:
        def hook(_mod: nn.Module, _args: Any) -> None:
            self.block, self.block_ops = path, 0
        return hook

    def _leave_block(self, _mod: nn.Module, _args: Any, _out: Any) -> None:
        self.block = None

    def _count_block_op(self) -> None:
        """One more forward op of the current block; past MAX_BLOCK_FORWARD_OPS, one error line instead of a
        trace that runs for many minutes."""
        self.block_ops += 1
        if self.block_ops <= MAX_BLOCK_FORWARD_OPS:
            return
        inner = self.module_stack[-1] if self.module_stack else self.block
        where = f"{inner} ({type(self.model.get_submodule(inner)).__name__})" if inner else str(self.block)
        raise UserError(f"trace: block {self.block} ran more than {MAX_BLOCK_FORWARD_OPS:,} ops in one forward "
                        f"(the largest transformer blocks run a few hundred), the last in {where}: it loops in "
                        f"Python, most likely over the tokens (a recurrent mixer's reference path, which "
                        f"transformers takes where its fused kernels do not run, the meta device included), a step "
                        f"of that many kernels a layer, which autoparallel does not trace or price at this length; "
                        f"plan it at a shorter --seq-len, or give a model whose mixer runs whole-sequence kernels")

    def remove_hooks(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()

    # -- saved tensors
    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.phase == "fwd":
            key = _skey(t)
            if key not in self.saved_storages and key not in self.state_storages:
                self.saved_storages.add(key)
                nb = t.untyped_storage().nbytes()
                owner = self.storage_owner.get(key)
                if owner is None:
                    self.pending_saved += nb
                else:
                    self.nodes[owner]["saved_bytes"] += nb
        return t

    # -- the step
    def run(self, args: tuple, kwargs: dict, loss_of: Callable[[Any], torch.Tensor]) -> None:
        with torch.device("meta"), _FusedKernels(), _UniformRouting(self), _Recorder(self), \
                torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            self.phase = "fwd"
            out = self.model(*args, **kwargs)
            self.in_loss = True
            loss = loss_of(out)
            self.in_loss = False
            del out
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise UserError("trace: the loss must be a scalar tensor; check loss_fn")
            if not loss.requires_grad:
                self.warnings.append("the loss does not require grad (no trainable parameters "
                                     "reached); only the forward pass was traced")
                return
            self.phase = "bwd"
            self.module_stack.clear()
            loss.backward()
        self.phase = "done"

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        nid = len(self.nodes)
        ins = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_leaves(out) if isinstance(a, torch.Tensor)]
        is_view = getattr(func, "is_view", False)
        preds: set[int] = set()
        params: dict[int, tuple[int, int]] = {}
        for t in ins:
            key = _skey(t)
            p = self.producer.get(t)
            if p is None:
                p = self.storage_owner.get(key)
            if p is not None:
                preds.add(p)
            w = self.storage_writer.get(key) if self.storage_writer else None
            if w is not None and w != nid and (p is None or w > p):
                preds.add(w)
            if not is_view:
                info = self.param_storage.get(key)
                if info is not None:
                    # The slice actually read (w1[e] of stacked expert weights), not the whole storage.
                    n = min(t.numel(), info[1])
                    if n > params.get(info[0], (0, 0))[0]:
                        params[info[0]] = (n, n * t.element_size())
        flops = 0.0
        packet = getattr(func, "_overloadpacket", func)
        f = _OWN_FLOPS.get(packet) or flop_registry.get(packet)
        if f is not None:
            try:
                flops = float(f(*_gqa_expanded(packet, args), **kwargs, out_val=out))
            except Exception:  # a formula that rejects these args: counted as 0, noted once
                msg = f"no FLOP count for {func} (flop_counter formula failed)"
                if msg not in self.warnings:
                    self.warnings.append(msg)
        fwd_node = None
        if self.phase == "fwd":
            if self.block is not None:
                self._count_block_op()
            module = self.module_stack[-1] if self.module_stack else ""
            cur = torch.autograd._get_sequence_nr()
            if cur != self.last_seq:  # this op created an autograd Node: sequence number cur - 1
                self.seq_to_node[cur - 1] = nid
                self.last_seq = cur
        else:
            module = ""
            node = torch._C._current_autograd_node()
            if node is not None:
                seq = node._sequence_nr()
                fwd_node = self.seq_to_node.get(seq)
                if fwd_node is not None:
                    module = self.nodes[fwd_node]["module"]
                elif seq == _ACCUMULATE_GRAD_SEQ:
                    var = getattr(node, "variable", None)
                    module = self.param_owner.get(id(var), "") if var is not None else ""
            if self.module_stack:  # forward recomputed inside backward (activation checkpointing)
                module = self.module_stack[-1]
        read = 0 if is_view else sum(_nbytes(t) for t in ins)
        written = 0 if is_view else sum(_nbytes(t) for t in outs)
        # an elementwise op with an input broadcast to its output (x * cos of RoPE, routed tokens times
        # their [T*k, 1] scores): GPUs run these on a slower, non-vectorized path
        broadcast = (not is_view and flops == 0 and len(outs) == 1 and len(ins) >= 2
                     and any(1 < t.numel() < outs[0].numel() for t in ins))
        # ... in fp32 throughout and along the leading or the trailing dimensions only (a Hugging Face RMSNorm's
        # x * rsqrt and weight * x in its fp32 compute): twice the bytes per element on the same path, at a
        # higher fraction of the bandwidth; a table broadcast over batch and heads at once (RoPE's [S, 1, D]
        # over [B, S, H, D]) runs at the bf16 rate even in fp32 (an H200's profiles, docs/trainer_sweep_notes.md)
        fp32_broadcast = (broadcast and all(t.dtype == torch.float32 for t in (*ins, *outs))
                          and all(_edge_broadcast(tuple(t.shape), tuple(outs[0].shape)) for t in ins
                                  if 1 < t.numel() < outs[0].numel()))
        # an elementwise (or concatenating) op that reads an input with gaps (a slice of a fused qkv or
        # gate_up projection, the halves rotate_half concatenates), reads a same-sized input laid out unlike
        # its output (a transposed head view made contiguous) or writes into a slice: the same path
        strided = (not is_view and flops == 0 and len(outs) == 1 and outs[0].numel() > 1 and not broadcast
                   and (_gapped(outs[0]) or any(
                       _gapped(t) or (t.numel() == outs[0].numel() and not _same_layout(t, outs[0]))
                       for t in ins if 1 < t.numel() <= outs[0].numel() and 0 not in t.stride())))
        self.nodes.append({
            "op": str(func),
            "module": module,
            "phase": self.phase,
            "region": "",
            "block": None,
            "out_shapes": [tuple(t.shape) for t in outs],
            "out_dtypes": [str(t.dtype).removeprefix("torch.") for t in outs],
            "flops": flops,
            "bytes_read": read,
            "bytes_written": written,
            "param_count": sum(n for n, _ in params.values()),
            "param_bytes": sum(b for _, b in params.values()),
            "saved_bytes": 0,
            "fwd_node": fwd_node,
            "broadcast": broadcast,
            "fp32_broadcast": fp32_broadcast,
            "strided": strided,
        })
        if self.in_loss:
            self.nodes[nid]["loss"] = True
        causal = _is_causal(func, args, kwargs)
        if causal is not None:
            self.nodes[nid]["causal"] = causal
        if _is_depthwise(packet, args):
            self.nodes[nid]["depthwise"] = True
        if self.pending_saved and self.phase == "fwd":
            self.nodes[nid]["saved_bytes"] += self.pending_saved
            self.pending_saved = 0
        for p in sorted(preds):  # sorted: the edge order does not depend on set iteration
            self.edges.append((p, nid))
        schema = getattr(func, "_schema", None)
        mutable = schema is not None and schema.is_mutable
        for t in outs:
            self.producer[t] = nid
            if not is_view:
                key = _skey(t)
                if key not in self.storage_owner:
                    self.storage_owner[key] = nid
                elif mutable:
                    self.storage_writer[key] = nid
                    if self.phase == "fwd":  # its creator's output changes after it was made
                        self.nodes[self.storage_owner[key]]["mutated_in_place"] = True


# ============================================================================ graph assembly
def _classify(mod: nn.Module, own: dict[str, torch.Tensor], path: str = ""
              ) -> tuple[str, int | None, int | None, int | None]:
    """(kind, in_features, out_features, num_experts) of a module (at `path`) owning parameters directly."""
    feats = linear_features(mod)  # nn.Linear, or transformers' Conv1D (weight stored [in, out])
    if feats is not None:
        return "linear", feats[0], feats[1], None
    if isinstance(mod, nn.Embedding):
        return "embedding", mod.num_embeddings, mod.embedding_dim, None
    name = type(mod).__name__
    if isinstance(mod, _NORM_CLASSES) or name.endswith(("Norm", "LayerNorm", "RMSNorm")):
        dims = [p.shape[-1] for p in own.values() if p.dim() >= 1]
        return "norm", (dims[0] if dims else None), (dims[0] if dims else None), None
    # Stacked expert weights [E, in, out], in a module named for its experts (`experts` in the catalog,
    # transformers and torchtitan alike). Other 3-D weights are not E experts to shard over ranks: a
    # convolution's [out, in / groups, kernel] (the depthwise conv1d of Mamba, Jamba, Falcon-H1, Qwen3-Next's
    # linear attention), RecurrentGemma's per-head block-diagonal gates [heads, width, width].
    named = "expert" in path.rpartition(".")[2].lower() or "expert" in name.lower()
    stacked = {n: p for n, p in own.items() if p.dim() == 3} if named else {}
    if stacked:
        first = next(iter(stacked.values()))
        w1, w2 = stacked.get("w1"), stacked.get("w2")
        fin = int(w1.shape[-1]) if w1 is not None else int(first.shape[-1])
        fout = int(w2.shape[1]) if w2 is not None else None
        return "experts", fin, fout, int(first.shape[0])
    return "other", None, None, None


def _fill_parameters(graph: OpGraph, model: nn.Module, blocks: list[str], no_grad: set[str] = frozenset()) -> None:
    """Graph totals (tied parameters once) and the parametric ops, from the module structure. `no_grad`: the
    module paths the traced forward called with autograd off; a replicated trace runs some blocks only, so
    a path inside a block counts for every block by its path within the block."""
    block_of = _block_lookup(blocks)

    def within(path: str) -> str:
        block = block_of(path)
        return path[len(block) + 1:] if block and path.startswith(block + ".") else path

    no_grad_within = {within(p) for p in no_grad}
    first_owner: dict[int, str] = {}
    total = total_bytes = 0
    for path, mod in model.named_modules():
        own = {n: p for n, p in mod._parameters.items() if p is not None}
        if not own:
            continue
        count = nbytes = 0
        tied: dict[str, str] = {}
        for n, p in own.items():
            if id(p) in first_owner:
                tied[n] = first_owner[id(p)]
                continue
            first_owner[id(p)] = path
            count += p.numel()
            nbytes += _nbytes(p)
        total += count
        total_bytes += nbytes
        kind, fin, fout, experts = _classify(mod, own, path)
        parent, _, child = path.rpartition(".")
        parent_mod = model.get_submodule(parent)
        split = fused_split(parent_mod, child) if kind == "linear" else None
        heads = projection_heads(parent_mod, fout) if kind == "linear" and split is None else None
        graph.parametric_ops[path] = ParamOp(
            path=path, kind=kind, module_class=type(mod).__name__, param_count=count, param_bytes=nbytes,
            shapes={n: tuple(int(d) for d in p.shape) for n, p in own.items()}, in_features=fin,
            out_features=fout, num_experts=experts, block=block_of(path), tied=tied,
            fused_pieces=split.pieces if split else (), fused_unit=split.unit if split else 1,
            no_grad=within(path) in no_grad_within, heads=heads[0] if heads else None, norm_like=is_norm_like(mod),
            normalized=normalized_width(mod))
    graph.parameters = total
    graph.param_bytes = total_bytes


def _assign_regions(nodes: list[dict[str, Any]], blocks: list[str]) -> None:
    """Set each node's `block` (owning repeated block) and `region` (pre | block | post).

    fwd: ops of a block's modules belong to it; other ops are "pre" before the first block op and
    "post" after the last (root-level ops between blocks go to the preceding block). bwd: ops
    inherit their fwd node's placement; the rest are placed by position, mirrored (bwd runs the
    post part first).
    """
    block_of = _block_lookup(blocks)
    for a in nodes:
        a["block"] = block_of(a["module"])
    for phase, before, after in (("fwd", "pre", "post"), ("bwd", "post", "pre")):
        idx = [i for i, a in enumerate(nodes) if a["phase"] == phase]
        if phase == "bwd":
            for i in idx:
                a = nodes[i]
                if a["block"] is None and a["fwd_node"] is not None:
                    f = nodes[a["fwd_node"]]
                    a["block"], a["region"] = f["block"], f["region"]
        in_block = [i for i in idx if nodes[i]["block"] is not None]
        first, last = (in_block[0], in_block[-1]) if in_block else (math.inf, -math.inf)
        if not in_block:  # a model without repeated blocks is all "pre"
            before = "pre"
        current = None
        for i in idx:
            a = nodes[i]
            if a["block"] is not None:
                a["region"] = "block"
                current = a["block"]
            elif a["region"]:
                continue
            elif i < first:
                a["region"] = before
            elif i > last:
                a["region"] = after
            else:
                a["region"], a["block"] = "block", current


def _block_classes(graph: OpGraph, model: nn.Module, nodes: list[dict[str, Any]] | None) -> None:
    """Blocks with the same class, parameter shapes/dtypes and traced fwd op sequence share an id."""
    ops: dict[str, list[tuple]] = {b: [] for b in graph.blocks}
    if nodes is not None:
        for a in nodes:
            b = a["block"]
            if a["phase"] == "fwd" and b is not None and b in ops:
                rel = a["module"][len(b) + 1:]
                ops[b].append((a["op"], rel, tuple(a["out_shapes"]), tuple(a["out_dtypes"])))
    ids: dict[tuple, int] = {}
    for b in graph.blocks:
        mod = model.get_submodule(b)
        params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in mod.named_parameters())
        key = (type(mod).__name__, params, tuple(ops[b]))
        graph.block_class[b] = ids.setdefault(key, len(ids))


def _param_op_edges(graph: OpGraph, nodes: list[dict[str, Any]], edges: list[tuple[int, int]]) -> None:
    """(producer, consumer) pairs of parametric ops linked by a forward activation path that crosses
    no other parametric op. At a region boundary (pre -> block i -> block i+1 -> post) only sources
    from the producing region are kept, so the residual stream links each block to the previous
    one instead of to every earlier block."""
    pops = graph.parametric_ops
    cache: dict[str, str | None] = {}

    def pop_of(path: str) -> str | None:
        if path not in cache:
            found = None
            p = path
            while True:
                if p in pops:
                    found = p
                    break
                if not p:
                    break
                p = p.rsplit(".", 1)[0] if "." in p else ""
            cache[path] = found
        return cache[path]

    def key(a: dict[str, Any]) -> str:
        return a["block"] if a["block"] is not None else a["region"]

    n_fwd = sum(1 for a in nodes if a["phase"] == "fwd")
    preds: list[list[int]] = [[] for _ in range(n_fwd)]
    for s, d in edges:
        if d < n_fwd and s < n_fwd and nodes[d]["phase"] == "fwd" and nodes[s]["phase"] == "fwd":
            preds[d].append(s)
    pkey: dict[str, str] = {}
    src: list[frozenset[str]] = []
    found: dict[tuple[str, str], None] = {}
    empty: frozenset[str] = frozenset()
    for n in range(n_fwd):
        a = nodes[n]
        if a["phase"] != "fwd":
            src.append(empty)
            continue
        here = pop_of(a["module"])
        k = key(a)
        incoming: set[str] = set()
        for p in preds[n]:
            pa = nodes[p]
            if here is not None and pop_of(pa["module"]) == here:
                continue
            s = src[p]
            pk = key(pa)
            if s and pk != k:
                kept = frozenset(x for x in s if pkey.get(x) == pk)
                s = kept or s
            incoming |= s
        if here is not None:
            pkey.setdefault(here, k)
            for s in incoming:
                if s != here:
                    found[(s, here)] = None
            src.append(frozenset((here,)))
        else:
            src.append(frozenset(incoming))
    graph.param_op_edges = list(found)


def _build_op_graph(graph: OpGraph, tr: _Tracer) -> None:
    nodes = tr.nodes
    _assign_regions(nodes, graph.blocks)
    _block_classes(graph, tr.model, nodes)
    _param_op_edges(graph, nodes, tr.edges)
    g = graph.g
    g.add_nodes_from(enumerate(nodes))
    g.add_edges_from(tr.edges)


def _fill_compiled_saved(graph: OpGraph, model: nn.Module, block_inputs: dict[str, tuple[tuple, dict]]) -> None:
    """graph.compiled_saved, graph.compiled_fused and graph.compiled_launches: per block class, the bytes per
    sample its compiled form keeps for the backward, the bytes its fused kernels move and the kernels it launches
    in each phase (autoparallel.compiled_saved:
    AOTAutograd's partitioner on the block, once per class, on the inputs the traced step gave it). A class
    whose block the partitioner cannot take (an op without a meta kernel, data-dependent shapes) is left out:
    the cost model then counts eager's saved bytes and compiled_memory_fraction for it."""
    from autoparallel.compiled_saved import compiled_block

    done: set[int] = set()
    per_sample = 1.0 / max(graph.batch, 1)
    for path in graph.blocks:
        cls = graph.block_class.get(path)
        if cls is None or cls in done or path not in block_inputs:
            continue
        done.add(cls)
        args, kwargs = tree_map(_detached, block_inputs[path])
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves((args, kwargs))):
            continue  # no gradient flows into the block's inputs (its saved set is not an activation chain)
        try:
            block = compiled_block(model.get_submodule(path), args, kwargs)
        except Exception:  # the partitioner's limits, not the model's: eager accounting stands
            continue
        graph.compiled_saved[cls] = block.saved_bytes * per_sample
        if block.fused_fwd_bytes is not None and block.fused_bwd_bytes is not None:
            graph.compiled_fused[cls] = (block.fused_fwd_bytes * per_sample, block.fused_bwd_bytes * per_sample)
        if block.launches_fwd is not None and block.launches_bwd is not None:
            graph.compiled_launches[cls] = (block.launches_fwd.per_sample(graph.batch),
                                            block.launches_bwd.per_sample(graph.batch))


def _build_module_level_graph(graph: OpGraph, tr: _Tracer, model: nn.Module) -> None:
    """Fallback: one node per module (leaf modules, plus modules whose own code ran ops), forward in
    the order reached (unreached leaves after, in registration order), then backward reversed.
    Costs are what the partial trace measured; backward FLOPs are estimated as 2x forward."""
    graph.module_level = True
    partial = [a for a in tr.nodes if a["phase"] == "fwd"]
    _assign_regions(partial, graph.blocks)
    _param_op_edges(graph, partial, [(s, d) for s, d in tr.edges if d < len(partial)])
    agg: dict[str, dict[str, Any]] = {}
    for a in partial:
        c = agg.setdefault(a["module"], {"flops": 0.0, "bytes_read": 0, "bytes_written": 0,
                                         "saved_bytes": 0, "out_shapes": [], "out_dtypes": []})
        for k in ("flops", "bytes_read", "bytes_written", "saved_bytes"):
            c[k] += a[k]
        c["out_shapes"], c["out_dtypes"] = a["out_shapes"], a["out_dtypes"]
    leaves = [p for p, m in model.named_modules() if next(m.children(), None) is None]
    order = list(agg) + [p for p in leaves if p not in agg]
    nodes: list[dict[str, Any]] = []
    for path in order:
        mod = model.get_submodule(path) if path else model
        c = agg.get(path, {"flops": 0.0, "bytes_read": 0, "bytes_written": 0, "saved_bytes": 0,
                           "out_shapes": [], "out_dtypes": []})
        pop = graph.parametric_ops.get(path)
        nodes.append({"op": type(mod).__name__, "module": path, "phase": "fwd", "region": "", "block": None,
                      "out_shapes": c["out_shapes"], "out_dtypes": c["out_dtypes"], "flops": c["flops"],
                      "bytes_read": c["bytes_read"], "bytes_written": c["bytes_written"],
                      "param_count": pop.param_count if pop else 0,
                      "param_bytes": pop.param_bytes if pop else 0,
                      "saved_bytes": c["saved_bytes"], "fwd_node": None, "estimated": path not in agg})
    n_fwd = len(nodes)
    for i in reversed(range(n_fwd)):
        f = nodes[i]
        nodes.append({**f, "phase": "bwd", "region": "", "flops": 2.0 * f["flops"],
                      "bytes_read": f["bytes_read"] + f["bytes_written"],
                      "bytes_written": f["bytes_read"], "saved_bytes": 0, "fwd_node": i,
                      "estimated": True})
    _assign_regions(nodes, graph.blocks)
    _block_classes(graph, model, None)
    g = graph.g
    g.add_nodes_from(enumerate(nodes))
    g.add_edges_from((i, i + 1) for i in range(len(nodes) - 1))
    g.add_edges_from((i, 2 * n_fwd - 1 - i) for i in range(n_fwd - 1))


def _find_expert_groups(graph: OpGraph, model: nn.Module, blocks: list[str]) -> None:
    block_of = _block_lookup(blocks)
    groups: list[tuple[str, int, int]] = [(p, op.num_experts or 0, op.param_count)
                                          for p, op in graph.parametric_ops.items() if op.kind == "experts"]
    for path, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.ModuleDict)) or path.rsplit(".", 1)[-1] != "experts":
            continue
        children = list(mod.children())
        if len(children) >= 2 and len({type(c) for c in children}) == 1:
            groups.append((path, len(children), sum(p.numel() for p in mod.parameters())))
    for path, num, count in groups:
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        prefix = parent + "." if parent else ""
        router = next((p for p, op in graph.parametric_ops.items()
                       if op.kind == "linear" and p.startswith(prefix) and not p.startswith(path + ".")
                       and p != path and op.out_features == num), None)
        parent_mod = model.get_submodule(parent) if parent else model
        shared = tuple(prefix + n for n, _ in parent_mod.named_children()
                       if "shared" in n and not n.endswith("gate"))
        top_k = None
        holders = [parent_mod]
        if router is not None:
            holders += [model.get_submodule(router)]
            if "." in router:
                holders.append(model.get_submodule(router.rsplit(".", 1)[0]))
        for holder in holders:
            for attr in ("top_k", "num_experts_per_tok", "topk"):
                v = getattr(holder, attr, None)
                if isinstance(v, int) and not isinstance(v, bool) and top_k is None:
                    top_k = v
        graph.expert_groups[path] = ExpertGroup(path=path, block=block_of(path), num_experts=num,
                                                param_count=count, router=router, shared_experts=shared,
                                                top_k=top_k)
