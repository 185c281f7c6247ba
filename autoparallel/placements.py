"""Megatron-LM's tensor-parallel layout derived from the operator graph (no model-family table).

The rule (Shoeybi et al. 2019): a Linear that feeds another Linear directly (through non-parametric
ops only: activations, attention, reshapes) is column-parallel; a Linear fed by a column-parallel
Linear is row-parallel, so each MLP / attention pair costs one all-reduce forward and one backward.
Norms run replicated (or sequence-parallel), the token embedding is vocab-parallel, the LM head is
column-parallel (vocab-sharded logits, parallel cross entropy), routers replicate and expert groups
are sharded over expert-parallel ranks. The sharding solver (issue 5) searches beyond this layout;
this function is the fixed baseline the planner uses until then and the yardstick it must beat.
"""

from __future__ import annotations

import math

from autoparallel.graph import OpGraph
from cost_models.facts import convolution_mixers, no_grad_modules


def megatron_placements(graph: OpGraph, sequence_parallel: bool = False) -> dict[str, str]:
    """Module path -> placement (values documented in autoparallel/plan.py)."""
    kinds = {path: op.kind for path, op in graph.parametric_ops.items()}
    preds, succs = _linked_through_head_norms(graph, kinds)
    fused = _fused_outputs(graph, kinds)
    # A fused projection (Phi-3's qkv_proj / gate_up_proj, GPT-2's c_attn) whose pieces the tracer
    # recognized is column-parallel piece by piece (each rank its slice of q, k and v: the trainer
    # re-lays the rows); any other stays whole, since a contiguous column split would cut across
    # q/k/v (or gate/up) instead of heads, and its consumers then see a whole input.
    for path in fused:
        if not graph.parametric_ops[path].fused_pieces:
            kinds[path] = "fused"
    experts = {p for p, k in kinds.items() if k == "experts"}
    out: dict[str, str] = {}
    for path, kind in sorted(kinds.items()):
        if kind == "embedding":
            out[path] = "vocab" if _is_token_embedding(graph, path) else "replicate"
        elif kind == "norm":
            out[path] = "sequence" if sequence_parallel else "replicate"
        elif kind == "experts":
            out[path] = "expert"
        elif kind == "linear":
            if succs[path] & experts:
                out[path] = "replicate"  # a router: its logits must be whole on every rank
            elif _outside_blocks(graph, path):
                # around the blocks only the LM head (the Linear no parametric op reads) is split; OPT's
                # input and output projections (project_in / project_out) stay whole
                out[path] = "replicate" if succs[path] else "colwise"
            elif any(kinds[p] == "linear" and _feeds_linear(p, kinds, succs, experts)
                     and p.rpartition(".")[0] == path.rpartition(".")[0] for p in preds[path]):
                # fed by a column-parallel sibling (q/k/v -> o, gate/up -> down): the trainer hands a rowwise
                # Linear only a colwise sibling's local shard. A Linear of another module before it (OLMo's and
                # nanochat's norms have no parameters, so o_proj is gate_proj's nearest parametric producer)
                # starts a pair instead
                out[path] = "rowwise"
            elif any(kinds[s] == "linear" for s in succs[path]):
                out[path] = "colwise"
            else:
                out[path] = "replicate"
        else:
            out[path] = "replicate"
    return _whole_or_split_together(out, kinds, graph, preds)


def _whole_or_split_together(out: dict[str, str], kinds: dict[str, str], graph: OpGraph,
                             preds: dict[str, set[str]]) -> dict[str, str]:
    """The Linears of one module (an attention: q/k/v/o) split together or not at all: when some of
    them must stay whole (OLMo2's q/k feed a norm over all heads, which a head split would cut), the
    head-split siblings would hand attention mismatched head counts, so the module is replicated. So is a
    module with a norm over all the heads its column-parallel projections split: fed by one of them and as
    wide as one's output (MiniMax's norm after its linear attention, before output_gate's product); a head
    split would normalize each rank's heads alone, which the trainer refuses (tensor_parallel._check_per_head),
    and a module holding a convolution (facts.convolution_mixers) or run without autograd (facts.no_grad_modules),
    norms included."""
    parents: dict[str, list[str]] = {}
    norms: dict[str, list[str]] = {}
    for path, kind in kinds.items():
        if kind in ("linear", "fused", "norm"):  # a fused projection kept whole is a replicated sibling
            (norms if kind == "norm" else parents).setdefault(path.rpartition(".")[0], []).append(path)
    ops = graph.parametric_ops
    mixers = convolution_mixers(graph) | no_grad_modules(graph)
    for parent, siblings in parents.items():
        if parent in mixers:  # a convolution between its projections, or no autograd: the module stays whole
            for p in siblings + norms.get(parent, []):
                out[p] = "replicate"
            continue
        values = {out[p] for p in siblings}
        cols = [p for p in siblings if out[p] == "colwise"]
        spans = any(preds[n] & set(cols) and any(ops[p].out_features == ops[n].in_features for p in cols)
                    for n in norms.get(parent, ()))
        if ("rowwise" in values and "replicate" in values) or spans:
            for p in siblings:
                out[p] = "replicate"
    return out


def _linked_through_head_norms(graph: OpGraph, kinds: dict[str, str]
                               ) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Producer/consumer links between parametric ops, seeing through per-head norms: Qwen3's q_norm
    (over head_dim, narrower than q_proj's output) sits between q_proj and attention, and a head split
    commutes with it, so q_proj -> o_proj is a column -> row pair like v_proj -> o_proj."""
    preds: dict[str, set[str]] = {p: set() for p in kinds}
    succs: dict[str, set[str]] = {p: set() for p in kinds}
    for a, b in graph.param_op_edges:
        if a in kinds and b in kinds:
            succs[a].add(b)
            preds[b].add(a)
    ops = graph.parametric_ops
    for norm in [p for p, k in kinds.items() if k == "norm"]:
        width = ops[norm].in_features
        for a in list(preds[norm]):
            out = ops[a].out_features
            if kinds[a] == "linear" and width and out and width < out and out % width == 0:
                succs[a] |= succs[norm] - {a}
                for b in succs[norm]:
                    preds[b].add(a)
    return preds, succs


_SPLIT_OPS = ("split", "split_with_sizes", "slice", "chunk", "narrow", "unbind")


def _fused_outputs(graph: OpGraph, kinds: dict[str, str]) -> set[str]:
    """Linears whose output is cut into pieces along its feature dim (the last dim still has all
    out_features) before any other parametric op reads it: fused q/k/v or gate/up projections. A slice
    of a per-head view (rotary's rotate_half on [.., head_dim]) does not count."""
    g = graph.g
    by_module: dict[str, list[int]] = {}
    for n, a in g.nodes(data=True):
        if a.get("phase") == "fwd":
            by_module.setdefault(a.get("module", ""), []).append(n)
    out: set[str] = set()
    for path, kind in kinds.items():
        width = graph.parametric_ops[path].out_features
        own = set(by_module.get(path, ()))
        if kind != "linear" or not width or not own:
            continue
        frontier = [s for n in own for s in g.successors(n) if s not in own]
        # the module's output: what its ops hand to ops outside it (not a transposed weight inside it)
        out_shape = next((sh for n in own if any(s not in own and g.nodes[s].get("phase") == "fwd"
                                                 for s in g.successors(n))
                          for sh in g.nodes[n].get("out_shapes") or [] if len(sh) and int(sh[-1]) == width), None)
        tokens = math.prod(int(d) for d in out_shape[:-1]) if out_shape else 0
        seen: set[int] = set()
        while frontier and path not in out:
            n = frontier.pop()
            a = g.nodes[n]
            if n in seen or a.get("phase") != "fwd" or a.get("module", "") in kinds:
                continue
            seen.add(n)
            base = _op_base(a.get("op", ""))
            ins = [sh for p in g.predecessors(n) for sh in g.nodes[p].get("out_shapes") or []]
            if base in _SPLIT_OPS and any(len(sh) and int(sh[-1]) == width for sh in ins) and all(
                    int(sh[-1]) < width for sh in a.get("out_shapes") or [] if len(sh)):
                out.add(path)
            # the features viewed as pieces right after the tokens ([tokens.., k, .., d], the product width) and
            # read piece by piece: Moshi's gating MLP (view(b, s, 2, -1)[..., 0, :]), Persimmon's per-head fused
            # qkv (view(b, s, H, 3, d)[..., 0, :]), GPT-NeoX Japanese's (view(b, s, H, 3 d).chunk(3, -1)); not a
            # per-head view that attention reads whole
            if base in _SPLIT_OPS + ("select", "unbind") and _reads_pieces(g, n, own, tokens, width):
                out.add(path)
            if len(seen) < 64:  # the split follows within a few ops of the projection
                frontier.extend(g.successors(n))
    return out


_VIEWS = ("view", "_unsafe_view", "reshape", "unflatten")


def _op_base(op: str) -> str:
    """An aten op's name without its namespace and overload ("aten.select.int" -> "select")."""
    return op.split(".")[1] if op.startswith("aten.") else op


def _pieces_of(shape: tuple, tokens: int, width: int) -> bool:
    """Whether `shape` is a projection's [tokens.., width] output with its features viewed as two or more dims."""
    dims = [int(d) for d in shape]
    for k in range(1, len(dims) - 1):
        if math.prod(dims[:k]) == tokens and math.prod(dims[k:]) == width and len(dims) - k >= 2:
            return True
    return False


def _reads_pieces(g, n: int, own: set[int], tokens: int, width: int) -> bool:
    """Whether node n (a split, select or unbind) cuts a view of the module's own output into pieces: its input a
    direct view of that output with the features as two or more dims, and its outputs keeping the last dim (a
    select or unbind of a piece dim) or narrowing it (a chunk of the last dim); not rotary's unbind of the last
    dim into pairs, whose outputs are wider than the pairs it unbinds."""
    for p in g.predecessors(n):
        a = g.nodes[p]
        base = _op_base(a.get("op", ""))
        shape = (a.get("out_shapes") or [()])[0]
        if base not in _VIEWS or not any(q in own for q in g.predecessors(p)) or not _pieces_of(shape, tokens, width):
            continue
        outs = [sh for sh in g.nodes[n].get("out_shapes") or [] if len(sh)]
        if outs and all(int(sh[-1]) <= int(shape[-1]) for sh in outs):
            return True
    return False


def _feeds_linear(path: str, kinds: dict[str, str], succs: dict[str, set[str]], experts: set[str]) -> bool:
    return not (succs[path] & experts) and any(kinds[s] == "linear" for s in succs[path])


def _is_token_embedding(graph: OpGraph, path: str) -> bool:
    """An embedding with the most rows, the vocabulary's (OPT's position table is wider than its token
    embedding, which project_in widens); each of several (Gemma 4's per-layer table beside its token embedding,
    the LM head's tied weight: by name the per-layer table had been the one, the tied pair split two ways)."""
    rows = [op.in_features or 0 for op in graph.parametric_ops.values() if op.kind == "embedding"]
    return bool(rows) and (graph.parametric_ops[path].in_features or 0) == max(rows)


def _outside_blocks(graph: OpGraph, path: str) -> bool:
    return not any(path == b or path.startswith(b + ".") for b in graph.blocks)
