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

from autoparallel.graph import OpGraph
from autoparallel.linear_output import output_structure, reader_modules
from cost_models.facts import convolution_mixers, embeddings_with_inner_modules, no_grad_modules


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
    inner = embeddings_with_inner_modules(graph)
    out: dict[str, str] = {}
    for path, kind in sorted(kinds.items()):
        if kind == "embedding":
            out[path] = "vocab" if _is_token_embedding(graph, path) and path not in inner else "replicate"
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


def _fused_outputs(graph: OpGraph, kinds: dict[str, str]) -> set[str]:
    """Linears whose output is cut into pieces before another parametric op reads it: fused q/k/v or gate/up
    projections (linear_output.output_structure, the sharding solver's reading too)."""
    readers = reader_modules(graph)
    own: dict[str, list[int]] = {}
    for n, a in graph.g.nodes(data=True):
        if a.get("phase") == "fwd" and kinds.get(a.get("module", "")) == "linear":
            own.setdefault(a["module"], []).append(n)
    return {path for path, nodes in own.items()
            if output_structure(graph.g, nodes, graph.parametric_ops[path].out_features, readers).fused}


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
