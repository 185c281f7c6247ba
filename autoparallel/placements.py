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


def megatron_placements(graph: OpGraph, sequence_parallel: bool = False) -> dict[str, str]:
    """Module path -> placement (values documented in autoparallel/plan.py)."""
    kinds = {path: op.kind for path, op in graph.parametric_ops.items()}
    preds: dict[str, set[str]] = {p: set() for p in kinds}
    succs: dict[str, set[str]] = {p: set() for p in kinds}
    for a, b in graph.param_op_edges:
        if a in kinds and b in kinds:
            succs[a].add(b)
            preds[b].add(a)
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
            elif any(kinds[p] == "linear" and _feeds_linear(p, kinds, succs, experts) for p in preds[path]):
                out[path] = "rowwise"
            elif any(kinds[s] == "linear" for s in succs[path]) or _is_lm_head(graph, path):
                out[path] = "colwise"
            else:
                out[path] = "replicate"
        else:
            out[path] = "replicate"
    return out


def _feeds_linear(path: str, kinds: dict[str, str], succs: dict[str, set[str]], experts: set[str]) -> bool:
    return not (succs[path] & experts) and any(kinds[s] == "linear" for s in succs[path])


def _is_token_embedding(graph: OpGraph, path: str) -> bool:
    """The embedding whose table is as large as the vocabulary (largest embedding table)."""
    embs = [(op.param_count, p) for p, op in graph.parametric_ops.items() if op.kind == "embedding"]
    return bool(embs) and max(embs)[1] == path


def _is_lm_head(graph: OpGraph, path: str) -> bool:
    """A Linear outside every block, after the last block: the output projection."""
    return not any(path == b or path.startswith(b + ".") for b in graph.blocks)
