"""How a Linear's output is read: the heads of its per-head view and whether it is a fused projection.

The one reading of it that the sharding solver (`sharding.build_segment`: a Linear's `heads` and `fused`,
which decide whether and how a column split is legal) and Megatron's rule (`placements.megatron_placements`:
a fused projection without recognized pieces stays whole) both use. From the operator graph alone: the
Linear's output followed through the non-parametric ops after it, until a parametric op that reads it with
its weights (`reader_modules`).

Fused: the features cut into pieces (q/k/v, gate/up) before such an op reads them, which a contiguous
column split would cut across:

  * a split of the whole features ([.., out_features] cut along the last dim: GPT-2's c_attn, Phi-3's
    qkv_proj, DBRX's Wqkv after its clamp, Qwen3.5's linear-attention in_proj_qkv after its depthwise
    convolution; also rotary's halves of a one-head projection, whose features are one head no column split
    divides),
  * a split of the output, viewed or transposed but not yet viewed by head, that narrows its last dim
    (Mamba's in_proj.transpose(1, 2).chunk(2, dim=1), LFM2's conv in_proj),
  * a view with the features as three or more dims ([.., H, 3, D]: BLOOM's and Persimmon's query_key_value),
  * a view of the features as pieces ([tokens.., k, .., d]) read piece by piece by a split, select or unbind,
    whose pieces are not put back together into that view's shape: Moshi's gating MLP (view(b, s, 2, -1)[..., 0,
    :]), Falcon's and Ergo's [q heads | k | v] (view(b, s, H + 2 KV, D) split on the heads), GPT-NeoX
    Japanese's, CodeGen's and Qwen3-Next's per-head q/k/v or q/gate (view(b, s, H, k D) cut along the last
    dim). Rotary embeddings cut a per-head view too (GPT-J's q_rot / q_pass and rotate_every_two, DeepSeek
    V3.2's indexer's split into rope / nope dims), but rejoin the halves into it: not fused, nor is rotary's
    unbind into pairs, whose outputs are wider than the pairs.

Heads: H of the first view of the output as [tokens.., H, D] (H, D > 1, after dropping dims of 1), a
per-head view; recorded for a fused output too (Ergo's per-head norm over the [q | k | v] heads reads it),
where no column split uses it. A per-head view cut only after its heads moved off the token dims (GPT-NeoX's
view(b, s, H, 3 D).transpose(1, 2).chunk(3, -1)) is read per head: a contiguous split of whole heads keeps
each head's q, k and v together.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass

from autoparallel.graph import OpGraph

# ops that re-describe or copy a tensor, along which the output keeps its features (the view chain)
VIEW_OPS = ("view", "_unsafe_view", "reshape", "unflatten", "transpose", "permute", "clone", "contiguous", "_to_copy",
            "alias", "expand", "unsqueeze", "squeeze", "t")
# ops that cut a tensor into pieces (select and unbind drop the dim they cut)
SPLIT_OPS = ("split", "split_with_sizes", "chunk", "narrow", "slice", "select", "unbind")
READER_KINDS = ("linear", "embedding", "norm", "experts")  # parametric ops that read an activation with weights
WALK_LIMIT = 64    # ops followed after a projection: its split follows within a few
REJOIN_LIMIT = 32  # ops followed after a cut looking for its pieces put back together (a rotary embedding's)


@dataclass(frozen=True)
class OutputStructure:
    heads: int | None = None  # H of the output's per-head view [.., H, D]
    fused: bool = False       # its features are cut into pieces before a parametric op reads them


def op_base(op: str) -> str:
    """An aten op's name without its namespace and overload ("aten.select.int" -> "select")."""
    return op.split(".")[1] if op.startswith("aten.") else op


def reader_modules(graph: OpGraph) -> set[str]:
    """Module paths of the parametric ops that end the walk after a projection (READER_KINDS). A module with
    parameters of its own that runs other ops (Mamba's mixer with A_log and D: kind "other") does not: the
    split of its in_proj's output is one of those ops."""
    return {p for p, op in graph.parametric_ops.items() if op.kind in READER_KINDS}


def _feature_dims(shape, tokens: int, width: int) -> tuple[int, ...] | None:
    """The dims of `shape` that hold the `width` features when it is the output's [tokens.., features..] with
    the features viewed as one or more dims (dims of 1 dropped); None for any other shape. Without a token count,
    the shortest trailing dims whose product is `width`."""
    dims = [int(d) for d in shape]
    if tokens:
        feats = next((dims[k:] for k in range(1, len(dims)) if math.prod(dims[:k]) == tokens), None)
    else:
        k, prod = len(dims), 1
        while k > 0 and prod < width:
            k -= 1
            prod *= dims[k]
        feats = dims[k:]
    if feats is None or math.prod(feats) != width:
        return None
    return tuple(d for d in feats if d != 1)


def _shapes(a: dict) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in sh) for sh in a.get("out_shapes") or []]


def output_structure(g, own: Iterable[int], width: int | None, readers: Container[str]) -> OutputStructure:
    """(heads, fused) of the output of a Linear whose forward ops are `own` (graph nodes) and that has `width`
    output features, in the graph `g` (OpGraph.g); `readers`: reader_modules(graph). See the module docstring."""
    own = set(own)

    def fwd(n: int) -> bool:
        return g.nodes[n].get("phase") == "fwd"

    roots = [n for n in own if fwd(n) and any(s not in own and fwd(s) for s in g.successors(n))
             and any(sh and sh[-1] == width for sh in _shapes(g.nodes[n]))]
    if not width or not roots:
        return OutputStructure()
    out_shape = next(sh for n in roots for sh in _shapes(g.nodes[n]) if sh and sh[-1] == width)
    tokens = math.prod(out_shape[:-1])
    # the view chain: the output and the views of it (True: a view of the features as two or more dims, where
    # the chain ends)
    chain: dict[int, bool] = {n: False for n in roots}
    heads, fused = None, False
    seen = set(own)
    queue = [s for n in sorted(own) for s in sorted(g.successors(n)) if s not in own]
    i = 0
    while i < len(queue):
        n = queue[i]
        i += 1
        a = g.nodes[n]
        if n in seen or not fwd(n) or a.get("module", "") in readers:
            continue
        seen.add(n)
        base = op_base(a.get("op", ""))
        outs = [sh for sh in _shapes(a) if sh]
        preds = list(g.predecessors(n))
        on_chain = any(chain.get(p) is False for p in preds)  # reads the output or a view of it, not yet by head
        if base in VIEW_OPS and on_chain and outs:
            feats = _feature_dims(outs[0], tokens, width)
            chain[n] = feats is not None and len(feats) >= 2
            if chain[n] and len(feats) == 2 and heads is None:
                heads = feats[0]
            elif chain[n] and len(feats) > 2:
                fused = True  # [.., 3, H, D]
        elif base in SPLIT_OPS and not fused:
            ins = [sh for p in preds for sh in _shapes(g.nodes[p]) if sh]
            if base not in ("select", "unbind") and any(sh[-1] == width for sh in ins) and outs and all(
                    sh[-1] < width for sh in outs):
                fused = True  # the whole features cut along the last dim
            elif on_chain and outs and outs[0][-1] < width:
                fused = True  # the output, not yet viewed by head, narrowed
            else:
                fused = any(_cuts_pieces(g, n, p, outs, readers) for p in preds if chain.get(p))
        if len(seen) < WALK_LIMIT + len(own):
            queue.extend(sorted(g.successors(n)))
    return OutputStructure(heads, fused)


def _cuts_pieces(g, n: int, view: int, outs: list[tuple[int, ...]], readers: Container[str]) -> bool:
    """Whether the split, select or unbind `n` of `view` (a view of the output's features as two or more dims)
    reads it piece by piece: its outputs keep or narrow the view's last dim (a select of a piece dim, a cut of
    the last dim; not rotary's unbind of pairs, whose outputs are wider than the pairs), and nothing within a
    few ops after it has the view's shape again (rotary's halves rejoined into the heads they came from)."""
    shape = next(iter(_shapes(g.nodes[view])), ())
    if not outs or not shape or any(sh[-1] > shape[-1] for sh in outs):
        return False
    seen, queue, i = {n}, list(g.successors(n)), 0
    while i < len(queue) and len(seen) < REJOIN_LIMIT:
        m = queue[i]
        i += 1
        a = g.nodes[m]
        if m in seen or a.get("phase") != "fwd" or a.get("module", "") in readers:
            continue
        seen.add(m)
        if shape in _shapes(a):
            return False
        queue.extend(g.successors(m))
    return True
