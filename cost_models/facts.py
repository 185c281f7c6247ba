"""Model facts the cost model and planner need, read from the OpGraph (and its ModelSpec when traced
from one): head counts for tensor-parallel divisibility, the attention kernels' geometry, expert counts,
vocabulary size, whether the model scales its logits."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

from cost_models.compute import is_matmul, moved_bytes
from cost_models.graph import OpGraph


def attention_heads(graph: OpGraph) -> tuple[int, int]:
    """(query heads, key/value heads); (0, 0) when the graph has no recognizable attention.

    From the ModelSpec when known, else from a Hugging Face config (OpGraph.config_heads); otherwise from the
    fused attention kernels' outputs [B, H, S, D] (GQA key/value heads are then not distinguishable and taken
    equal to H)."""
    spec = getattr(graph, "spec", None)
    if spec is not None and getattr(spec, "num_heads", 0):
        return spec.num_heads, spec.num_kv_heads or spec.num_heads
    heads, kv = getattr(graph, "config_heads", (0, 0))
    if heads:
        return heads, kv or heads
    heads = max((int(shape[1]) for shape in _fused_attention_outputs(graph)), default=0)
    return heads, heads


CONVOLUTIONS = ("Conv1d", "Conv2d", "Conv3d")  # torch's classes (transformers' Conv1D is a Linear)


def convolution_mixers(graph: OpGraph) -> set[str]:
    """Paths of the modules that hold a convolution among their own children: a state-space or short-convolution
    mixer (Mamba's, LFM2's, Qwen3.5's linear attention), whose depthwise conv runs over the channels its input
    projection makes. Tensor parallelism keeps such a module whole: a column split of the projection would hand
    the convolution 1/tp of the channels its weight expects (the trainer failed on the shapes)."""
    return {path.rpartition(".")[0] for path, op in graph.parametric_ops.items()
            if op.kind == "other" and op.module_class in CONVOLUTIONS}


def flattens_tokens(graph: OpGraph) -> bool:
    """Whether a block's norm or Linear hands on its tokens flattened, [batch * seq, features] rather than
    [batch, seq, features] (OPT's blocks reshape around their MLP): sequence parallelism shards dim 1, which
    is then the features, so it cannot run such a model (the trainer refuses it; the planner does not choose
    it). The last op of a module gives its output (a Linear on 3-D input views its 2-D matmul back); an MoE
    layer, which flattens its tokens to route them and which SP runs on the gathered sequence, is exempt."""
    ops = graph.parametric_ops
    moe = tuple(path.rpartition(".")[0] + "." for path, op in ops.items() if op.kind == "experts")
    checked = {p for p, op in ops.items() if op.kind in ("linear", "norm") and op.block is not None
               and not p.startswith(moe)}
    last: dict[str, Sequence[int]] = {}
    for _, a in graph.nodes(phase="fwd"):
        if a.get("module") in checked and a["out_shapes"]:
            last[a["module"]] = a["out_shapes"][0]
    return any(len(shape) == 2 for shape in last.values())


def attention_geometry(graph: OpGraph) -> tuple[int, int]:
    """(key sequence length, head dimension) of the fused attention kernels, from the first one's output
    [B, H, S, D]; (0, 0) without any (compute.attention_times then falls back to the FLOP curve)."""
    shape = next(_fused_attention_outputs(graph), None)
    return (0, 0) if shape is None else (int(shape[2]), int(shape[3]))


def _fused_attention_outputs(graph: OpGraph) -> Iterator[Sequence[int]]:
    """The [B, H, S, D] outputs of the forward's fused attention kernels, in graph order."""
    for _, a in graph.nodes(phase="fwd"):
        if "scaled_dot_product" in a["op"] and a["out_shapes"] and len(a["out_shapes"][0]) == 4:
            yield a["out_shapes"][0]


def num_experts(graph: OpGraph) -> int:
    return max((g.num_experts for g in graph.expert_groups.values()), default=0)


def vocab_size(graph: OpGraph) -> int:
    """Rows of the largest embedding table (the token embedding), 0 without embeddings."""
    return max((op.in_features or 0 for op in graph.parametric_ops.values() if op.kind == "embedding"), default=0)


def scales_logits(graph: OpGraph) -> bool:
    """Whether the model's forward runs an op on the LM head's output before returning it (Cohere's logit_scale,
    Granite's logits_scaling, Gemma 2's soft-cap): a forward op of the post segment after its last matmul,
    outside the loss (the ops the tracer marks `loss`), that moves data and writes as many elements as the head."""
    post = [a for _, a in sorted(graph.g.nodes(data=True)) if a.get("region") == "post" and a.get("phase") == "fwd"]
    heads = [i for i, a in enumerate(post) if is_matmul(a.get("op", ""))]
    if not heads or not post[heads[-1]].get("out_shapes"):
        return False
    logits = math.prod(post[heads[-1]]["out_shapes"][0])
    return any(not a.get("loss") and moved_bytes(a) > 0 and bool(a.get("out_shapes"))
               and math.prod(a["out_shapes"][0]) == logits for a in post[heads[-1] + 1:])


def no_grad_modules(graph: OpGraph) -> set[str]:
    """Paths of the modules whose own projections ran without autograd in the traced step (ParamOp.no_grad: a
    top-k indexer's @torch.no_grad forward). Tensor parallelism keeps such a module whole: a head split of its
    query and weight projections would leave each rank's head sum partial (nothing reduces it: no gradient flows
    there), so the ranks would pick different tokens, and the trainer's per-head norm would cut its key norm."""
    return {path.rpartition(".")[0] for path, op in graph.parametric_ops.items() if op.no_grad}


def embeddings_with_inner_modules(graph: OpGraph) -> set[str]:
    """Embeddings that hold parametric modules of their own (Inkling's InklingNormedEmbedding: an RMSNorm over
    the looked-up rows inside the embedding's forward). A vocabulary split hands those modules each rank's
    partial rows (RowwiseParallel all-reduces the embedding's output, after its forward), and torch's style
    cannot shard a table whose module owns more parameters: such an embedding stays whole under tp."""
    embeddings = [p for p, op in graph.parametric_ops.items() if op.kind == "embedding"]
    return {e for e in embeddings if any(p.startswith(e + ".") for p in graph.parametric_ops)}


# ---- tensor-parallel rules the trainer checks (trainer/tensor_parallel.py) and the planner keeps (estimate.CostModel):
# torch-free, on plain numbers, so that the two apply one rule.
def splits_whole_heads(heads: int | None, tp: int) -> bool:
    """Whether a column split over tp ranks gives each whole heads of a projection of `heads` heads (None: not an
    attention's projection, any split)."""
    return heads is None or heads % tp == 0


def sees_split_heads(normalized: int | None, colwise_siblings: Sequence[tuple[int, int] | None]) -> bool:
    """Whether a norm among column-sharded sibling projections ((in, out) features each, None: not a Linear) sees
    their split heads (qk-norm): unless it declares the width (`normalized`) of every one's input, the residual
    stream of a flat block whose norms and projections are all children of the block (a user model's own layout)."""
    return any(c is None or c[0] != normalized for c in colwise_siblings)


def spans_split_heads(width: int, colwise_siblings: Sequence[tuple[int, int] | None]) -> bool:
    """Whether a norm of `width` parameters spans all heads of a column-sharded sibling (OLMo2's q_norm, as wide as
    q_proj's output): a head split would normalize each rank's heads separately."""
    return any(c is not None and c[1] == width for c in colwise_siblings)


def replicated_regions(placements: dict[str, str], blocks: Iterable[str], norm_like: Callable[[str], bool]) -> set[str]:
    """The children of each block (not norm-like themselves) holding a replicated or expert module that is not
    norm-like: under sequence parallelism they run on the gathered sequence (the trainer's _GatherScatter), and the
    norms inside them run replicated with them."""
    out = set()
    for path, pl in placements.items():
        if pl not in ("replicate", "expert") or norm_like(path):
            continue
        for block in blocks:
            if path.startswith(block + "."):
                child = f"{block}.{path[len(block) + 1:].split('.')[0]}"
                if not norm_like(child):
                    out.add(child)
    return out
