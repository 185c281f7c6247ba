"""Tensor (and sequence) parallelism from the plan's per-module placements, with DTensor styles.

Placement -> ParallelStyle (Megatron-LM layout, as torchtitan applies it to Llama):

  colwise   ColwiseParallel: weight Shard(0); input Replicate: the siblings of one attention / MLP
            share one Replicate DTensor that a pre-hook on their parent makes of its input (all-
            gathered from Shard(1) under sequence parallelism), so that backward sums their input
            gradients locally and reduce-scatters (all-reduces) once, the Megatron minimum that
            tests/test_tp_collectives.py counts; output stays sharded
            on the last dim when a rowwise sibling consumes it. The LM head's logits stay
            vocab-sharded for the default cross-entropy, computed with loss_parallel() (Megatron's
            parallel cross entropy); with a user loss_fn they are gathered (Replicate) so any loss
            function sees whole logits.
  rowwise   RowwiseParallel: weight Shard(1); input Shard(-1); output all-reduced (Replicate), or
            reduce-scattered on the sequence dim (Shard(1)) under sequence parallelism.
  vocab     RowwiseParallel on an Embedding: table Shard(0) on the vocabulary, output Replicate /
            Shard(1), handed on as a plain tensor (not an AsyncCollectiveTensor: _waited_output). A
            positional table (pos_embeddings) is only a few rows: it stays replicated and its output
            is sliced to this rank's sequence chunk under sequence parallelism.
  sequence  SequenceParallel (norms on the residual stream) when plan.sequence_parallel; parameters
            replicated as DTensors, so their partial gradients are all-reduced by DTensor (one
            all-reduce of h elements per norm and micro-batch; Megatron sums them once per step).
  replicate parameters replicated, computed redundantly on every tp rank. Under sequence parallelism
            a replicated branch of a block (e.g. nn.MultiheadAttention, an MoE layer) runs on the
            gathered sequence and its output is sliced back (PrepareModuleInput/Output); a replicated
            Linear before the blocks (Gemma 4's per-layer projection of the token embeddings) runs on
            their sequence chunk as SequenceParallel, its chunks' partial weight gradients all-reduced.
  expert    nothing here (see expert_parallel.py); an MoE layer is a replicated branch for tp.

Async TP (plan.async_tp, enable_async_tp): inductor's micro-pipeline TP rewrites the compiled blocks'
all-gather -> matmul and matmul -> reduce-scatter pairs into collective matmuls over symmetric memory.

Norms inside a tensor-parallel attention (qk-norm over head_dim) see only this rank's heads; they
run as SequenceParallel on the head dim (torchtitan's qwen3 recipe) so their gradients are summed.

A Linear that stores its weight transposed ([in, out]: transformers' Conv1D) takes the same roles
with the shards on the transposed dims. A column-parallel fused projection (hf.fused_split: Phi-3's
qkv_proj / gate_up_proj, GPT-2's c_attn) feeding a row-parallel sibling is sharded piece by piece:
its rows are re-laid (Relayout) so that rank r's contiguous shard is [q_r, k_r, v_r], and its parent
slices the local output with local sizes (hf.localize_fused).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autoparallel.errors import UserError
from autoparallel.hf import (
    HEAD_COUNT_ATTRS,
    FusedSplit,
    fused_split,
    is_norm_like,
    linear_features,
    localize_fused,
    normalized_width,
    projection_heads,
    reshapes_to_input_width,
    runs_without_grad,
    transposed_linear,
)
from autoparallel.trainer.structure import ModelLayout, get_submodule
from cost_models.facts import replicated_regions, sees_split_heads, spans_split_heads, splits_whole_heads

_TP_KINDS = ("colwise", "rowwise", "vocab")


def _is_position_table(path: str, layout: ModelLayout) -> bool:
    """A learned position table: a few rows, kept replicated; its [S, h] output is sliced under SP."""
    return path.endswith("pos_embeddings") or path in layout.positions


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _check_divisible(path: str, mod: nn.Module, placement: str, tp: int) -> None:
    feats = linear_features(mod)
    if placement in ("colwise", "rowwise") and feats is None:
        raise UserError(f"plan placement {placement} on {path}: {type(mod).__name__} is not an nn.Linear (or a "
                        f"transposed one, transformers' Conv1D)")
    if placement == "colwise":
        n, what = feats[1], "out_features"
    elif placement == "rowwise":
        n, what = feats[0], "in_features"
    else:
        if not isinstance(mod, nn.Embedding):
            raise UserError(f"plan placement vocab on {path}: {type(mod).__name__} is not an nn.Embedding")
        inner = sorted({name.rpartition(".")[0] for name, _ in mod.named_parameters() if "." in name})
        if inner:  # cost_models.facts.embeddings_with_inner_modules: the planner keeps such a table whole
            raise UserError(f"plan placement vocab on {path}: {type(mod).__name__} runs modules of its own ({inner[0]}) "
                            f"on the looked-up rows, which a vocabulary split would hand partial rows; replicate it")
        n, what = mod.num_embeddings, "num_embeddings"
    if n % tp:
        raise UserError(f"plan: {path} ({placement}) has {what}={n}, not divisible by tp={tp}; pick a tp "
                        f"that divides it")


def _check_heads(root: nn.Module, placements: dict[str, str], tp: int) -> dict[str, set[int]]:
    """A column-sharded q/k/v must split whole heads: heads % tp == 0 (GQA: kv heads too). Returns the
    widths of the plain (not fused) head-split projections by parent attention, for _localize_head_counts."""
    split_widths: dict[str, set[int]] = {}
    for path, placement in placements.items():
        parent = get_submodule(root, _parent(path))
        mod = get_submodule(root, path)
        if placement in ("colwise", "rowwise") and runs_without_grad(parent):
            raise UserError(f"plan: {path} ({placement}) is a projection of {_parent(path)}, whose forward runs "
                            f"without autograd (a top-k indexer): split, each rank's head sum stays partial with no "
                            f"gradient's reduction to complete it, and the ranks would select different tokens; "
                            f"keep its projections replicated")
        head_dim = getattr(parent, "head_dim", None)
        feats = linear_features(mod)
        if placement != "colwise" or not isinstance(head_dim, int) or feats is None:
            continue
        split = fused_split(parent, path.rpartition(".")[2])
        if split is not None:  # each piece (q, k, v) splits whole heads
            if not split.divisible(tp):
                raise UserError(f"plan: {path} is a fused projection of pieces {list(split.pieces)} (heads of "
                                f"{split.unit}); tensor parallelism gives each rank whole heads of every piece, so "
                                f"pick a tp that divides each piece's (kv) head count")
            continue
        heads, unit = projection_heads(parent, feats[1])
        if not splits_whole_heads(heads, tp) and reshapes_to_input_width(parent):
            raise UserError(f"plan: {path} is a projection of {_parent(path)}, whose forward reshapes its output to "
                            f"its input's width, which no head split fits; keep its projections replicated")
        if not splits_whole_heads(heads, tp):
            raise UserError(f"plan: {path} projects to {heads} attention heads, not divisible by tp={tp}; "
                            f"tensor parallelism splits whole heads, so pick a tp that divides the (kv) "
                            f"head count")
        if unit == head_dim:  # (a per-head projection, one feature a head, reshapes by no head count)
            split_widths.setdefault(_parent(path), set()).add(feats[1])
    return split_widths


def _localize_head_counts(root: nn.Module, split_widths: dict[str, set[int]], tp: int) -> None:
    """Give each attention whose projections are split into whole heads (`_check_heads`' widths by parent) its
    rank's head counts. A forward that reshapes by a global count fails, or, where the sequence dim is -1 (OPT),
    silently attends over 1/tp of the tokens in tp times as many heads. A count is an attribute of
    HEAD_COUNT_ATTRS that times the attention's head_dim is the width of one of its column-sharded projections."""
    for parent_path, widths in split_widths.items():
        parent = get_submodule(root, parent_path)
        for attr in HEAD_COUNT_ATTRS:
            count = vars(parent).get(attr)
            if isinstance(count, int) and not isinstance(count, bool) and count * parent.head_dim in widths:
                setattr(parent, attr, count // tp)


def _map_hidden(args: tuple, kwargs: dict, fn) -> tuple[tuple, dict]:
    """Apply `fn` to a module's hidden-state input: the first positional argument, or the
    `hidden_states` keyword (HF blocks call their attention with keywords only)."""
    if args:
        return (fn(args[0]),) + tuple(args[1:]), kwargs
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
    return args, kwargs


def _shared_input_pre_hook(tp_mesh: DeviceMesh, layout_in: Shard | Replicate):
    """Forward pre-hook (with kwargs): the hidden-state input as one Replicate DTensor for all its
    colwise children: all-gathered once from the sequence shards (layout_in Shard(1)), or taken as it
    is (Replicate). In backward the children's summed gradient is reduce-scattered (all-reduced) once."""

    def share(x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, tp_mesh, (layout_in,), run_check=False)
        return x.redistribute(tp_mesh, (Replicate(),))

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _map_hidden(args, kwargs, share)

    return hook


def lm_head_path(placements: dict[str, str], layout: ModelLayout) -> str | None:
    """The model's output projection when it is column-sharded: the last root child after the blocks."""
    if layout.post and placements.get(layout.post[-1]) == "colwise":
        return layout.post[-1]
    return None


def apply_tensor_parallel(part: nn.Module, full_placements: dict[str, str], tp_mesh: DeviceMesh,
                          sequence_parallel: bool, layout: ModelLayout, loss_parallel: bool = False,
                          owned_outputs: bool = False) -> dict[str, Relayout]:
    """Parallelize `part` (the model or one pipeline stage of it) over `tp_mesh` per the plan.

    loss_parallel: the LM head keeps its logits vocab-sharded (a DTensor Shard(-1)) for
    torch.distributed.tensor.parallel.loss_parallel(); otherwise they are gathered (Replicate).
    owned_outputs: a rowwise module hands its caller a copy of its local output, not the view DTensor's
    to_local returns, which autograd forbids modifying in place (Falcon's blocks add the attention
    output into the MLP's in place); set for models whose code the trainer does not own (Hugging Face).
    Returns the parameters whose rows the trainer holds in another order (fused projections, see
    Relayout), by FQN."""
    relayout: dict[str, Relayout] = {}
    tp = tp_mesh.size()
    head = lm_head_path(full_placements, layout) if loss_parallel else None
    placements = {p: v for p, v in full_placements.items() if get_submodule(part, p) is not None}
    _localize_head_counts(part, _check_heads(part, placements, tp), tp)
    colwise_paired: set[str] = set()
    for path, v in placements.items():
        if v == "rowwise":
            colwise_paired |= {p for p, w in placements.items() if w == "colwise" and _parent(p) == _parent(path)}
    # Branches of a block that compute something replicated (routers, experts, an nn.MultiheadAttention
    # left unsharded) run on whole sequences; the sharded linears inside them use the non-SP layouts.
    regions = sorted(replicated_regions(placements, layout.block_paths,
                                        lambda p: is_norm_like(get_submodule(part, p))))

    def seq_layout(path: str) -> Shard | Replicate:
        inside = any(path.startswith(r + ".") for r in regions)
        return Shard(1) if sequence_parallel and not inside else Replicate()

    styles: dict[str, ParallelStyle] = {}
    shared_inputs: dict[str, Shard | Replicate] = {}  # parent of colwise siblings -> its input's layout
    for path, v in sorted(placements.items()):
        mod = get_submodule(part, path)
        seq_in = seq_layout(path)
        if v in _TP_KINDS and not _is_position_table(path, layout):
            _check_divisible(path, mod, v, tp)
        transposed = transposed_linear(mod) is not None
        if v == "colwise":
            colwise = _TransposedColwise if transposed else ColwiseParallel
            if path in colwise_paired:
                # (never a block's input, which its residual add and norms read as it is: OPT's fc1 / fc2)
                if _parent(path) and _parent(path) not in layout.block_paths and (
                        isinstance(seq_in, Shard) or _projections_only(part, _parent(path), placements, layout)):
                    # The parent's pre-hook makes its input one Replicate DTensor (all-gathering the
                    # sequence under SP) and hands it to every colwise sibling. Declaring that input
                    # Replicate keeps the children from converting it each: a per-child conversion is
                    # free forward but all-reduces each child's Partial input gradient in backward (q, k,
                    # v, gate, up: 5 all-reduces of b*s*h per block). Left Partial, the siblings'
                    # gradients sum locally and the hook differentiates into one reduce-scatter under SP
                    # (one all-reduce without), Megatron's g-bar (g) operator.
                    shared_inputs[_parent(path)] = seq_in
                    styles[path] = colwise(input_layouts=Replicate())
                else:
                    styles[path] = colwise(input_layouts=seq_in)
                    if isinstance(seq_in, Shard):
                        mod.register_forward_pre_hook(_sequence_dim_check(path))
                split = fused_split(get_submodule(part, _parent(path)), path.rpartition(".")[2])
                if split is not None:
                    relayout.update(_fused_relayout(part, path, split, tp, tp_mesh.get_local_rank(), transposed))
            elif path == head:
                styles[path] = colwise(input_layouts=seq_in, output_layouts=Shard(-1), use_local_output=False)
            else:
                styles[path] = colwise(input_layouts=seq_in, output_layouts=Replicate())
        elif v == "rowwise":
            styles[path] = (_TransposedRowwise if transposed else RowwiseParallel)(output_layouts=seq_in)
        elif v == "vocab":
            if _is_position_table(path, layout):  # a few rows only: kept replicated (see docstring)
                if sequence_parallel:
                    styles[path] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(-2))
            else:
                styles[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq_in)
        elif v == "sequence":
            if not sequence_parallel:
                raise UserError(f"plan: {path} has placement 'sequence' but sequence_parallel is false; use "
                                f"'replicate' or set sequence_parallel: true")
            # a norm inside a replicated branch (OLMo2's q_norm in a whole attention) runs on the
            # gathered sequence, replicated like its branch
            if not _inside_attention(part, path, placements) and isinstance(seq_in, Shard):
                styles[path] = SequenceParallel(use_local_output=True)  # post-norms feed the residual add
                get_submodule(part, path).register_forward_pre_hook(_sequence_dim_check(path))
        elif v == "replicate" and sequence_parallel and (_is_position_table(path, layout) or (
                isinstance(mod, nn.Embedding) and path in layout.pre)):
            # a table before the blocks left whole (the solver's R->Q: a position table, or a token
            # embedding it did not vocab-shard) hands the sequence-sharded residual stream its chunk
            # [S, h] ([B, S, h]) positional rows -> this rank's sequence chunk (a slice, no communication)
            styles[path] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(-2))
        elif v == "replicate" and sequence_parallel and path in layout.pre and linear_features(mod) is not None:
            # a Linear before the blocks reads the token embeddings' sequence chunk (Gemma 4's per-layer projection):
            # its weight a replicated DTensor, so the chunks' partial gradients are all-reduced, as a norm's are
            styles[path] = SequenceParallel(use_local_output=True)
            mod.register_forward_pre_hook(_sequence_dim_check(path))
        elif (v == "replicate" and sequence_parallel and layout.post and path == layout.post[-1]):
            # the solver's Q->R at the other end: a replicated LM head reads the whole sequence (all-gather)
            styles[path] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                              use_local_output=True)
        elif (v == "replicate" and sequence_parallel and is_norm_like(mod) and isinstance(seq_in, Shard)
              and not _inside_attention(part, path, placements)):
            raise UserError(f"plan: sequence_parallel is true but norm {path} is 'replicate'; norms on the "
                            f"sequence-sharded residual stream must be 'sequence'")
    # qk-norms inside a head-sharded attention: head-parallel norm (grads summed over tp).
    for path, mod in part.named_modules():
        if is_norm_like(mod) and _inside_attention(part, path, placements):
            _check_per_head(part, path, mod, placements)
            styles[path] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if sequence_parallel:
        for region in regions:
            styles[region] = _GatherScatter()
    for parent, layout_in in shared_inputs.items():
        if parent not in styles:
            get_submodule(part, parent).register_forward_pre_hook(_shared_input_pre_hook(tp_mesh, layout_in),
                                                                  with_kwargs=True)
    parallelize_module(part, tp_mesh, styles)
    for path, v in placements.items():
        if v == "vocab" and not _is_position_table(path, layout):
            get_submodule(part, path).register_forward_hook(_waited_output)
    if owned_outputs:
        for path, v in placements.items():
            if v == "rowwise":
                get_submodule(part, path).register_forward_hook(_owned_output)
    return relayout


def enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Async TP (plan.async_tp), as torchtitan's maybe_enable_async_tp: inductor's micro-pipeline TP
    pass rewrites each compiled all-gather -> matmul(s) (q/k/v, gate/up share one gather) and
    matmul -> reduce-scatter (o, down) into fused collective matmuls that run the matmul chunk by chunk
    while symmetric memory (NVLink peer copies, no NCCL kernel) moves the next chunk.

    GLOBAL STATE, set here and nowhere else: torch._inductor.config._micro_pipeline_tp applies to every
    graph inductor compiles in this process from now on (graphs compiled before keep what they were
    compiled with; the flag is not one of dynamo's guards, so a graph cached before it was set is not
    recompiled). The pass only touches tp-group collectives next to matmuls: other graphs are unchanged.
    It is never reset: another trainer in the same process that compiles TP blocks gets it too."""
    import torch._inductor.config as inductor_config
    from torch.distributed import _symmetric_memory as symm_mem

    inductor_config._micro_pipeline_tp = True
    # Older torch needs the group registered for symmetric memory; newer ones register it themselves
    # and deprecate the call (a FutureWarning, harmless).
    register = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if register is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            register(tp_mesh.get_group().group_name)


def _sequence_dim_check(path: str):
    """A module on the sequence-sharded stream (a norm, a Linear taking its own input) must read [batch, seq,
    hidden]: on a flattened [tokens, hidden] input (OPT's MLP) SP would take the hidden dim for the sequence.
    One error (every rank raises it at the same call) rather than a wrong layout or a shape error deep in
    DTensor; the planner does not choose SP there (CostModel.sequence_splits)."""
    def check(_mod: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() < 3:
            raise UserError(f"plan: sequence_parallel is true but {path} reads a {args[0].dim()}-D input "
                            f"(the block flattens batch and sequence), which sequence parallelism cannot shard; "
                            f"use sequence_parallel: false")
    return check


def _waited_output(_mod: nn.Module, _args: tuple, out: Any) -> Any:
    """The embedding's reduced output as a plain tensor, not the AsyncCollectiveTensor to_local hands
    back: the first compiled block would otherwise be compiled twice (a dynamo guard on the input's
    type), once for that wrapper and once for the plain tensors the other blocks pass on. A clone (one
    copy of b*s*h/tp, differentiable) rather than wait(), whose plain result autograd does not track."""
    return out.clone() if isinstance(out, AsyncCollectiveTensor) else out


def _projections_only(root: nn.Module, parent: str, placements: dict[str, str], layout: ModelLayout) -> bool:
    """Without sequence parallelism the parent's input is a plain tensor that other code may use too:
    it is shared as a DTensor only where the parent is an attention / MLP whose parametric children
    are all tp projections (not a block, whose residual add and norms read its input as it is)."""
    mod = get_submodule(root, parent)
    if mod is None or parent in layout.block_paths:
        return False
    return all(placements.get(f"{parent}.{name}") in ("colwise", "rowwise")
               for name, child in mod.named_children() if any(True for _ in child.parameters()))


def _owned_output(_mod: nn.Module, _args: tuple, out: Any) -> Any:
    return out.clone() if isinstance(out, torch.Tensor) and not isinstance(out, DTensor) else out


@dataclass(frozen=True)
class Relayout:
    """A parameter whose rows (along `dim`) the trainer keeps in another order than the model's: a
    column-parallel fused projection (q/k/v, gate/up) stored so that each tp rank's contiguous shard
    is its slice of every piece. `order[i]` is the model's index of the trainer's row i. Every place
    that exchanges values by name (materialization from the user's model, full_state_dict, export,
    checkpoints) converts, so names, shapes and saved values stay the model's own."""

    dim: int
    order: torch.Tensor

    def to_trainer(self, t: torch.Tensor) -> torch.Tensor:
        return t.index_select(self.dim, self.order.to(t.device))

    def to_model(self, t: torch.Tensor) -> torch.Tensor:
        return t.index_select(self.dim, torch.argsort(self.order).to(t.device))


def _fused_relayout(part: nn.Module, path: str, split: FusedSplit, tp: int, rank: int, transposed: bool
                    ) -> dict[str, Relayout]:
    """Column-parallel fused projection: its rows are re-laid so that the contiguous Shard(0) of rank r
    holds [q_r, k_r, v_r] (gate_r, up_r), and its parent's forward is made to cut that local output
    (hf.localize_fused, which also hands rank r's heads their rows of a per-head position bias). The
    output-feature dim is the weight's 0 (Linear) or 1 (Conv1D), the bias's 0."""
    parent, child = get_submodule(part, _parent(path)), path.rpartition(".")[2]
    if not split.divisible(tp):
        raise UserError(f"plan: {path} is a fused projection of pieces {list(split.pieces)} (units of {split.unit}); "
                        f"each piece must divide by tp={tp}")
    localize_fused(parent, child, tp, rank)
    order = split.rank_order(tp)
    mod = get_submodule(part, path)
    out = {f"{path}.weight": Relayout(1 if transposed else 0, order)}
    if getattr(mod, "bias", None) is not None:
        out[f"{path}.bias"] = Relayout(0, order)
    return out


def _distribute_params(module: nn.Module, mesh: DeviceMesh, layouts: dict[str, Shard | Replicate]) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        dist = distribute_tensor(param, mesh, [layouts[name]])
        module.register_parameter(name, nn.Parameter(dist, requires_grad=param.requires_grad))


class _TransposedColwise(ColwiseParallel):
    """ColwiseParallel of a Linear whose weight is stored [in, out] (transformers' Conv1D): the output
    features are the weight's dim 1 (and the bias's dim 0); inputs and outputs as for an nn.Linear."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh, lambda _n, m, mesh: _distribute_params(m, mesh, {"weight": Shard(1), "bias": Shard(0)}),
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class _TransposedRowwise(RowwiseParallel):
    """RowwiseParallel of a Conv1D: the input features are the weight's dim 0; the bias is replicated
    (added once, after the partial sums)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh,
            lambda _n, m, mesh: _distribute_params(m, mesh, {"weight": Shard(0), "bias": Replicate()}),
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


def _check_per_head(root: nn.Module, path: str, norm: nn.Module, placements: dict[str, str]) -> None:
    """A norm over all heads' features (OLMo2's q_norm: as wide as q_proj's output) would normalize
    only this rank's heads: refuse it (head-parallel norms must be per head, like Qwen3's)."""
    width = next(norm.parameters()).numel()
    for p, v in placements.items():
        feats = linear_features(get_submodule(root, p))
        if v == "colwise" and _parent(p) == _parent(path) and spans_split_heads(width, [feats]):
            raise UserError(f"plan: norm {path} spans all heads of {p} (width {width}); a head split would "
                            f"normalize each rank's heads separately: place {_parent(path)}'s projections "
                            f"'replicate'")


def _inside_attention(root: nn.Module, path: str, placements: dict[str, str]) -> bool:
    """A norm whose siblings are column-sharded projections (qk-norm): it sees sharded heads. A norm as
    wide as those projections' input is not one: it normalizes the residual stream of a flat block
    whose norms and projections are all children of the block (a user model's own layout)."""
    parent = _parent(path)
    modules = dict(root.named_modules())
    if not parent or path not in modules:
        return False
    cols = [linear_features(modules.get(p)) for p, v in placements.items() if v == "colwise" and _parent(p) == parent]
    return sees_split_heads(normalized_width(modules[path]), cols)


class _GatherScatter(ParallelStyle):
    """Run a module on the whole sequence and hand back this rank's chunk: a replicated branch inside
    a sequence-parallel block. Every tensor positional input goes Shard(1) -> Replicate (all-gather),
    the (first) tensor output Replicate -> Shard(1) (a local slice). The branch computes identically on
    every tp rank, so the gradients of its inputs are declared Replicate: no extra reduction."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def gather(x: object) -> object:
            if not isinstance(x, torch.Tensor) or x.dim() < 2:
                return x
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, (Shard(1),), run_check=False)
            return x.redistribute(device_mesh, (Replicate(),)).to_local()

        def scatter(x: object) -> object:
            if not isinstance(x, torch.Tensor) or x.dim() < 2:
                return x
            dt = DTensor.from_local(x, device_mesh, (Replicate(),), run_check=False)
            return dt.redistribute(device_mesh, (Shard(1),)).to_local()

        def pre_hook(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            args, kwargs = _map_hidden(args, kwargs, gather)
            return tuple(a if i == 0 else gather(a) for i, a in enumerate(args)), kwargs

        def post_hook(_mod: nn.Module, _args: tuple, out: object) -> object:
            if isinstance(out, tuple):  # e.g. nn.MultiheadAttention: (output, weights)
                return (scatter(out[0]),) + out[1:]
            return scatter(out)

        module.register_forward_pre_hook(pre_hook, with_kwargs=True)
        module.register_forward_hook(post_hook)
        return module


