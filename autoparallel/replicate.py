"""Identical blocks traced once: the tracer runs a reduced model and copies each block's ops.

A transformer's blocks mostly repeat, so tracing all of them records the same ops L times. Here the
block container (`find_blocks`) is temporarily cut down to a few representatives, the step is traced
once, and the op list is expanded back to every block, with module paths renamed and node ids,
`fwd_node` links and edges remapped. The result is the graph the full trace gives, node for node.

Which blocks are traced: blocks get a structural class (module classes, plain attributes, parameter
and buffer shapes, hooks). A block's ops can also depend on its neighbours (the saved-for-backward
bytes of a block's input are attributed to the previous block's op that produced them), so the unit
of reuse is the triple (class of the previous block, own class, class of the next block), with the
model's ends as pseudo-classes. The first block of each distinct triple is a template; it is traced
with its two neighbours so the triple appears in the reduced model as in the full one (a uniform
model traces blocks 0, 1, 2, L-2, L-1).

Checked, with a fallback to the full trace (`expand` returns None): every phase runs the traced
blocks as contiguous runs in block order (backward reversed); blocks of one class run the same op
sequence; a block's ops refer only to its own and its adjacent blocks' ops. A model whose forward
treats structurally identical blocks differently by position alone (`if i == 3:` in the root's loop)
cannot be detected this way: `trace(..., replicate_blocks=False)` traces every block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_FIRST, _LAST = -1, -2       # pseudo-classes of the model's ends (before block 0, after block L-1)
MIN_BLOCKS = 6               # below this the reduced model saves too little to bother


@dataclass(frozen=True)
class ReplicationPlan:
    """blocks: every block path in order; kept: indices of the blocks actually traced (sorted);
    template: per block, the index of the traced block whose ops it copies."""

    container: str
    blocks: tuple[str, ...]
    kept: tuple[int, ...]
    template: tuple[int, ...]
    block_class: tuple[int, ...]


def plan_replication(model: nn.Module, blocks: list[str]) -> ReplicationPlan | None:
    """The reduced set of blocks to trace, or None when every block must be traced."""
    if len(blocks) < MIN_BLOCKS:
        return None
    container = blocks[0].rsplit(".", 1)[0] if "." in blocks[0] else ""
    if any((b.rsplit(".", 1)[0] if "." in b else "") != container for b in blocks):
        return None
    mods = [model.get_submodule(b) for b in blocks]
    if _shares_parameters(mods):
        return None  # weights shared across blocks (ALBERT-style): gradients accumulate across them
    ids: dict[tuple, int] = {}
    cls = [ids.setdefault(_structure_key(m), len(ids)) for m in mods]
    L = len(blocks)
    first_of: dict[tuple[int, int, int], int] = {}
    kept: set[int] = set()
    template = []
    for i in range(L):
        triple = (cls[i - 1] if i else _FIRST, cls[i], cls[i + 1] if i + 1 < L else _LAST)
        if triple not in first_of:
            first_of[triple] = i
            kept.update(j for j in (i - 1, i, i + 1) if 0 <= j < L)
        template.append(first_of[triple])
    if len(kept) >= L:
        return None
    return ReplicationPlan(container, tuple(blocks), tuple(sorted(kept)), tuple(template), tuple(cls))


def _shares_parameters(mods: list[nn.Module]) -> bool:
    seen: set[int] = set()
    for m in mods:
        own = {id(p) for p in m.parameters()}
        if own & seen:
            return True
        seen |= own
    return False


def _plain(v: Any) -> Any:
    """A hashable stand-in for an attribute value that may steer the block's forward."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return repr(v)
    return (type(v).__qualname__, getattr(v, "__qualname__", None))


def _layer_entries(config: Any, idx: int) -> tuple:
    """What a Hugging Face config (the block's: some module of it holds it) says about layer `idx`: its entry in
    every per-layer list (layer_types, no_rope_layers, ...), whether idx is listed in its index lists
    (mlp_only_layers, ...), and where idx falls against its layer thresholds and periods (first_k_dense_replace,
    decoder_sparse_step, ...). A module's `layer_idx` stands for these (and for its cache slot): two blocks whose
    entries agree trace the same ops, although their indices differ."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        return ("layer_idx", idx)  # nothing to read the index against: it keeps the block apart
    out = []
    for k, v in sorted(vars(config).items()):
        if isinstance(v, (list, tuple)) and len(v) == layers:
            out.append((k, _plain(v[idx])))
        elif isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            out.append((k, idx in v))
        elif isinstance(v, int) and not isinstance(v, bool) and k.endswith(("_replace", "_start", "_offset",
                                                                              "_step", "_period", "_interval")):
            out.append((k, idx >= v, idx % v if v > 0 else 0))  # first_k_dense_replace, decoder_sparse_step, ...
    return ("layer_idx", tuple(out))


def _structure_key(mod: nn.Module) -> tuple:
    """Everything about a block that can change its traced ops, short of running it (a Hugging Face module's
    `layer_idx` through what its config says about that layer: `_layer_entries`)."""
    parts = []
    config = next((c for m in mod.modules() if isinstance(getattr(c := getattr(m, "config", None),
                                                                  "num_hidden_layers", None), int)), None)
    for path, m in mod.named_modules():
        attrs = tuple(sorted((k, _layer_entries(config, v) if k == "layer_idx" and isinstance(v, int) else _plain(v))
                             for k, v in vars(m).items() if not k.startswith("_") and k != "training"))
        params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                       for n, p in m._parameters.items() if p is not None)
        bufs = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in m._buffers.items() if b is not None)
        hooks = (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
                 len(m._backward_pre_hooks))
        parts.append((path, type(m).__module__, type(m).__qualname__, m.training, attrs, params, bufs, hooks))
    return tuple(parts)


@contextmanager
def reduced(model: nn.Module, plan: ReplicationPlan) -> Iterator[list[str]]:
    """The model with only the kept blocks in its block container (original names, so module paths
    stay those of the full model); yields the kept block paths. Restored on exit."""
    container = model.get_submodule(plan.container) if plan.container else model
    full = container._modules
    names = [b.rsplit(".", 1)[-1] for b in plan.blocks]
    container._modules = type(full)((names[i], full[names[i]]) for i in plan.kept)
    try:
        yield [plan.blocks[i] for i in plan.kept]
    finally:
        container._modules = full


class _Mismatch(Exception):
    """The reduced trace does not have the shape replication relies on."""


def expand(nodes: list[dict[str, Any]], edges: list[tuple[int, int]],
           plan: ReplicationPlan) -> tuple[list[dict[str, Any]], list[tuple[int, int]]] | None:
    """Nodes and edges of the full model from those of the reduced trace, whose nodes carry their
    kept block path in "block" (tracer._assign_regions); None when the trace breaks an assumption."""
    try:
        return _Expander(nodes, plan).run(edges)
    except _Mismatch:
        return None


class _Expander:
    def __init__(self, nodes: list[dict[str, Any]], plan: ReplicationPlan) -> None:
        self.nodes = nodes
        self.plan = plan
        self.kept = plan.kept
        self.pos_of_path = {plan.blocks[i]: r for r, i in enumerate(plan.kept)}
        self.prefix = plan.container + "." if plan.container else ""
        self.L = len(plan.blocks)
        self.pos_of_index = {i: r for r, i in enumerate(plan.kept)}
        self.seg: list[int | None] = [None if a["block"] is None else self.pos_of_path[a["block"]]
                                      for a in nodes]
        self.runs: dict[tuple[str, int], list[int]] = {}
        self.idx: list[int] = [0] * len(nodes)
        self.fixed: dict[int, int] = {}
        self.inst: dict[tuple[str, int], list[int]] = {}

    # ---- layout
    def _segments(self) -> list[tuple[str, int | None, list[int]]]:
        """(phase, kept position or None, node ids) of maximal runs, checked against the expected
        order: fixed nodes, every kept block once (fwd ascending, bwd descending), fixed nodes."""
        segs: list[tuple[str, int | None, list[int]]] = []
        for n, a in enumerate(self.nodes):
            key = (a["phase"], self.seg[n])
            if segs and (segs[-1][0], segs[-1][1]) == key:
                segs[-1][2].append(n)
            else:
                segs.append((key[0], key[1], [n]))
        for phase in ("fwd", "bwd"):
            mine = [s for s in segs if s[0] == phase]
            order = [s[1] for s in mine if s[1] is not None]
            if not order:
                continue
            want = list(range(len(self.kept)))
            if order != (want if phase == "fwd" else want[::-1]):
                raise _Mismatch
            inner = mine[next(k for k, s in enumerate(mine) if s[1] is not None):]
            inner = inner[:max(k for k, s in enumerate(inner) if s[1] is not None) + 1]
            if any(s[1] is None for s in inner):
                raise _Mismatch
        for phase, r, ids in segs:
            if r is not None:
                self.runs[phase, r] = ids
                for k, n in enumerate(ids):
                    self.idx[n] = k
        self._check_templates()
        return segs

    def _check_templates(self) -> None:
        """Blocks of one class run one op sequence (a block's ops copied to another of its class)."""
        sig: dict[tuple[str, int], tuple] = {}
        for (phase, r), ids in self.runs.items():
            base = self.plan.blocks[self.kept[r]]
            s = tuple((self.nodes[n]["op"], self._relative(self.nodes[n]["module"], base)) for n in ids)
            key = (phase, self.plan.block_class[self.kept[r]])
            if sig.setdefault(key, s) != s:
                raise _Mismatch

    def _relative(self, module: str, base: str) -> str:
        if module == base or module.startswith(base + "."):
            return module[len(base):]
        return "\0" + module

    # ---- references
    def _target(self, r: int | None, i: int | None, q: int) -> int:
        """The block that traced block q stands for, seen from block i copying traced block r
        (seen from the model's ends, r and i None: q itself)."""
        if r is None or i is None:
            return self.kept[q]
        delta = self.kept[q] - self.kept[r]
        if abs(delta) > 1 or not 0 <= i + delta < self.L:
            raise _Mismatch
        return i + delta

    def _resolve(self, old: int, r: int | None, i: int | None) -> int:
        q = self.seg[old]
        if q is None:
            return self.fixed[old]
        copies = self.inst.get((self.nodes[old]["phase"], self._target(r, i, q)))
        if copies is None or self.idx[old] >= len(copies):
            raise _Mismatch
        return copies[self.idx[old]]

    def _rename_spec(self, module: str, r: int) -> tuple[int, str] | None:
        """How a module path of traced block r's ops reads in a copy: (offset of its block from the
        copy's block, path below that block); None for paths outside the blocks (kept as they are)."""
        if not module.startswith(self.prefix):
            return None
        head = module[len(self.prefix):].split(".", 1)[0]
        q = self.pos_of_path.get(self.prefix + head)
        if q is None:
            return None
        delta = self.kept[q] - self.kept[r]
        if abs(delta) > 1:
            raise _Mismatch
        return delta, module[len(self.prefix + head):]

    # ---- assembly
    def run(self, edges: list[tuple[int, int]]) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
        segs = self._segments()
        out: list[dict[str, Any]] = []
        origin: list[tuple[int, int | None, int | None]] = []   # new id -> (old id, r, i)
        emitted: set[str] = set()
        for phase, r, ids in segs:
            if r is None:
                for n in ids:
                    self.fixed[n] = len(out)
                    out.append({**self.nodes[n], "block": None, "region": ""})
                    origin.append((n, None, None))
                continue
            if phase in emitted:
                continue
            emitted.add(phase)
            order = range(self.L) if phase == "fwd" else range(self.L - 1, -1, -1)
            renames: dict[int, list[tuple[int, str] | None]] = {}   # per template: (delta, suffix) per node
            for i in order:
                t = self.pos_of_index[self.plan.template[i]]
                run = self.runs[phase, t]
                if t not in renames:
                    renames[t] = [self._rename_spec(self.nodes[n]["module"], t) for n in run]
                new_ids = list(range(len(out), len(out) + len(run)))
                for n, spec in zip(run, renames[t]):
                    # block and region are reassigned on the full list (tracer._assign_regions)
                    a = {**self.nodes[n], "block": None, "region": ""}
                    if spec is not None:
                        target = i + spec[0]
                        if not 0 <= target < self.L:
                            raise _Mismatch
                        a["module"] = self.plan.blocks[target] + spec[1]
                    out.append(a)
                    origin.append((n, t, i))
                self.inst[phase, i] = new_ids
        for new, (_, r, i) in enumerate(origin):
            f = out[new]["fwd_node"]
            if f is not None:
                out[new]["fwd_node"] = self._resolve(f, r, i)
        preds: dict[int, list[int]] = {}
        for s, d in edges:
            preds.setdefault(d, []).append(s)
        # per node its predecessors in increasing id, as the tracer records them
        new_edges = [(s, new) for new, (old, r, i) in enumerate(origin)
                     for s in sorted(self._resolve(s, r, i) for s in preds.get(old, ()))]
        return out, new_edges
