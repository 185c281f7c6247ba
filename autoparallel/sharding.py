"""Sharding solver: per-op tensor / sequence / expert-parallel placements found from the operator graph.

Tensor parallelism comes from the model's own graph, not from a table of architectures: for each
distinct block class (identical blocks share one solution) and for the model's two ends (embeddings
before the first block, final norm / LM head after the last), an integer program over the parametric
ops (Linear, Embedding, norms, expert groups, other modules owning parameters) and the activation
edges between them picks a placement per op at a tensor-parallel degree t. The plan records the
result for EVERY parametric op by module path, e.g. ``"layers.0.mlp.up_proj": "colwise"``.

Placement values (plan.py; the trainer applies them with DTensor parallel styles)
-------------------------------------------------------------------------------
  colwise    Linear weight sharded on out_features (ColwiseParallel): needs its input whole and
             replicated, produces feature-sharded output. Attention projections split whole heads.
  rowwise    Linear weight sharded on in_features (RowwiseParallel): needs feature-sharded input,
             produces partial sums reduced at once: all-reduce, or reduce-scatter onto the sequence dim
             under sequence parallelism.
  replicate  parameters replicated over tp, computed redundantly on every tp rank; under sequence
             parallelism a replicated branch runs on the gathered sequence and its output is sliced.
  vocab      Embedding table sharded on num_embeddings (RowwiseParallel on an Embedding): output
             partial sums reduced (all-reduce / reduce-scatter).
  sequence   norm with replicated parameters on sequence-sharded activations (SequenceParallel); also
             a head-wise norm (qk-norm) on head-sharded activations under sequence parallelism.
  expert     routed expert group sharded over the plan's ep ranks on the expert dim; inside a tp
             group it runs as a replicated branch (expert parallelism is the planner's ep dimension).

At t = 1 nothing is sharded: every op is "replicate" (expert groups "expert").

Modes and activation states
---------------------------
Each placement is run in a *mode* that fixes what the op needs on its input and gives on its output:
  R  replicated, whole tensor on every rank           S  sharded on the feature (last) dim
  Q  sharded on the sequence dim (sequence parallel)   D  input data (no gradient flows back)
  requirements additionally: Rc (whole input for a colwise op: its input gradient is a partial sum),
  L (the loss), * (anything: an embedding reads token ids).
  colwise Rc->S | rowwise S->R (all-reduce) or S->Q (reduce-scatter, SP) | replicate R->R |
  vocab *->R (all-reduce) or *->Q (reduce-scatter, SP) | norm R->R, Q->Q (SP), S->S (head-wise norm)
  | expert R->R | block input gives R (Q under SP) and block output needs it (the residual stream).
  Under sequence parallelism a norm that is not head-wise has only its Q->Q mode (the trainer keeps
  the residual stream sequence-sharded around norms).

Resharding of an edge u -> v (state s given by u, requirement r of v), on the tensor's bytes B:
  R->Rc  bwd all-reduce              R->Q  fwd slice, bwd all-gather
  S->R, Q->R  fwd all-gather          S->Rc, Q->Rc  fwd all-gather + bwd reduce-scatter
  S->S  nothing, only between a colwise op and its rowwise sibling (same parent module: the trainer
        keeps a colwise output sharded exactly when a rowwise sibling consumes it)
  S->L  vocab-parallel cross entropy: 3 all-reduces of b*s fp32 values
  equal states, D->anything but S, anything->*: nothing
  R->S, Q->S, D->S, S->Q  not allowed: the trainer's RowwiseParallel takes only a colwise sibling's
        local shard, and a sharded feature dim never turns into a sharded sequence without a gather
A collective is paid once per (producer tensor, component): q, k and v reading one norm output share
its all-gather, as Megatron-LM and torchtitan's PrepareModuleInput do.

The integer program (one per segment and degree t; CP-SAT, coefficients in 0.1 ns)
-------------------------------------------------------------------------------
Variables (all binary):
  x[o,m]        op o runs in mode m
  y[e,p,q]      edge e = (u, v) carries u in mode p to v in mode q
  z[u,k,p,c]    u in mode p pays resharding component c on tensor k it hands to its consumers
  wS[g], wQ[g]  the non-parametric ops whose nearest parametric producers are the set g run feature-
                (S) or sequence- (Q) sharded; neither: whole (R)
Constraints (one method of PlacementILP each, formula in its docstring):
  add_assignment        sum_m x[o,m] = 1
  add_edge_consistency  sum_q y[e,p,q] = x[u,p],  sum_p y[e,p,q] = x[v,q],  y = 0 for forbidden pairs
  add_resharding        z[u,k,p,c] >= y[e,p,q]  for c in reshard_components(gives(u,p), needs(v,q))
  add_join_states       wS[g] <= S(u) + D(u), wQ[g] <= Q(u) + R(u) + D(u) for u in g,
                        wS[g] <= sum_u S(u), wQ[g] <= sum_u Q(u), wS[g] + wQ[g] <= 1
                        (X(u) = sum of x[u,p] over the modes of u giving state X)
  add_token_mixing      x[u,p] = 0 for modes giving Q of every producer of an attention group
  add_tied_parameters   sum_{p: dim d} x[a,p] = sum_{q: dim d} x[b,q] for a weight shared by a and b
  add_memory_budget     sum x[o,m] * params(o) / d_w(m) * 2 B <= budget   (optional)
Objective:
  minimize  sum x[o,m] C_op(o,m) + sum z[u,k,p,c] C_comm(k,c) + sum_g (F_g - (F_g - F_g/t)(wS[g] + wQ[g]))
  C_op(o,m) = roofline time of o's forward and backward ops at its shard (cost_models.compute.op_times
              with kernel classes, the CostModel's per-op formula: FLOPs*b/d, activation bytes*b/d +
              weight bytes/d_w) + its mandatory collective (rowwise / vocab) + the optimizer step and
              gradient accumulation of its local parameters (compute.update_time, bf16 parameters,
              fp32 gradients) / num_micro_batches. Parameter memory enters through that update time
              and, optionally, the per-rank budget. Not modelled: the host floor of calibrated
              profiles (compute.host_floor), non-linear in the op count.
  C_comm    alpha-beta collectives of cost_models.comm on the tensor's bytes and the tp link (intra-node
            when t fits a node); seconds per micro-batch throughout.
  F_g       roofline time of the non-parametric ops (attention core, activations, residual adds) of g.
Legality: colwise needs out_features % t == 0 and, for attention projections (output viewed as
[..., H, D]), H % t == 0 (GQA key/value heads counted on their own projections); rowwise needs
in_features % t == 0; a Linear whose output is split (fused q/k/v; heads and fused read by
linear_output.output_structure, as Megatron's rule reads them) stays replicated unless the tracer
recognized its pieces (ParamOp.fused_pieces: Phi-3's qkv_proj / gate_up_proj, GPT-2's c_attn), which
the trainer shards piece by piece (each piece, in whole heads, divisible by t); a Linear that owns no
ops of its own (nn.MultiheadAttention's out_proj) stays replicated; tied weights (LM head and token embedding) shard
the same dim; vocab needs the lookup indices to come from the batch (token ids: a position table indexed
by arange stays replicated, as in Megatron-LM). The vocabulary dim is the exception to divisibility:
the token embedding (vocab) and a Linear with one output per vocabulary row that feeds only the loss
(the LM head, colwise) may shard unevenly, ceil(V/t) rows on the first ranks (DTensor chunks uneven
dims; Megatron-LM pads the vocabulary instead), costed at the largest shard.
The join state of non-parametric ops (_join_state), constants (rotary tables, masks: inputs from
outside the segment much smaller than the stream) aside: S when every producer gives S; Q when one
gives Q and the others Q or R (replicated inputs are sliced for free); else R. Token-mixing ops (attention:
non-parametric matmuls, [.., s, s] scores) never take a sequence shard (add_token_mixing).

Approximations: non-parametric ops between two parametric ops run in the producers' join state and
the conversion happens just before the consumer, on the tensor it reads; producers joined into one
tensor (q, k, v into the attention output) each pay that tensor's conversion (conservative); a
feature-sharded router's softmax / top-k is costed like a sharded elementwise op; gradients of
replicated parameters under sequence parallelism are reduced once per step, coalesced (Megatron-LM),
and not costed; EP all-to-alls depend on ep, not on the placements here, and are left to the
CostModel. Speed: per segment a few dozen ops and edges, so each CP-SAT solve takes milliseconds.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from autoparallel.errors import UserError
from autoparallel.graph import OpGraph, ParamOp
from autoparallel.linear_output import op_base, output_structure, reader_modules
from cost_models.comm import (
    Link,
    all_gather_time,
    all_reduce_time,
    link_for,
    reduce_scatter_time,
)
from cost_models.compute import classify_node, copy_bytes_of, is_matmul, moved_bytes, op_times, update_time
from cost_models.estimate import TRAINER, CostModel, RuntimeVariant
from cost_models.facts import embeddings_with_inner_modules
from cost_models.segments import SegmentCache
from hardware_profiles import Cluster

UpdateRate = Callable[[int], float]

PARAM_BYTES, GRAD_BYTES = 2, 4  # Plan defaults (bf16 parameters, fp32 gradient reduction) for the update
COST_SCALE = 1e10             # ILP objective unit: 0.1 ns
ENDS = "ends"                 # segment name of the embeddings + final norm / LM head problem

# (state given, requirement) -> resharding components, see the module docstring
_RESHARD: dict[tuple[str, str], tuple[str, ...]] = {
    ("R", "R"): (), ("R", "Rc"): ("bwd_allreduce",), ("R", "Q"): ("bwd_allgather",), ("R", "L"): (),
    ("S", "R"): ("fwd_allgather",), ("S", "Rc"): ("fwd_allgather", "bwd_reducescatter"), ("S", "S"): (),
    ("S", "L"): ("loss_parallel",),
    ("Q", "R"): ("fwd_allgather",), ("Q", "Rc"): ("fwd_allgather", "bwd_reducescatter"), ("Q", "Q"): (),
    ("Q", "L"): (),
}
COMPONENTS = ("fwd_allgather", "bwd_allgather", "bwd_allreduce", "bwd_reducescatter", "loss_parallel")


def reshard_components(given: str, needs: str) -> tuple[str, ...] | None:
    """Collectives that turn an output in state `given` into an input that needs `needs`; None when
    the conversion is not allowed (see the module docstring)."""
    if needs in ("*", "-") or given == "-":
        return ()
    if given == "D":  # the batch: every rank loads it whole; rowwise still takes only a colwise shard
        return None if needs == "S" else ()
    return _RESHARD.get((given, needs))


def _edge_components(seg: _SegmentData, u: int, v: int, p: Mode, q: Mode) -> tuple[str, ...] | None:
    """Components of edge u -> v with u in mode p and v in mode q (None: the pair is not allowed)."""
    comps = reshard_components(p.gives, q.needs)
    if comps is not None and p.gives == "S" and q.needs == "S" and seg.nodes[u].parent != seg.nodes[v].parent:
        return None
    return comps


@dataclass(frozen=True)
class Mode:
    """One way to run a parametric op: the placement recorded in the plan plus its layouts."""
    name: str                 # unique per op, e.g. "colwise", "rowwise_rs", "heads"
    placement: str            # plan value
    needs: str                # input requirement (R, Rc, S, Q, L, *, -)
    gives: str                # output state (R, S, Q, D, -)
    split_work: bool = False  # compute and activations at 1/t
    split_params: bool = False  # weights sharded t-way
    reduce: str = ""          # mandatory collective on the output: "all_reduce" | "reduce_scatter"
    shard_dim: int | None = None  # weight dim sharded (0: rows of [out, in] / vocab rows, 1: columns)


@dataclass
class _Node:
    """A parametric op of a segment, or a virtual one (input, output, loss) with a fixed mode."""
    path: str
    kind: str                       # linear | embedding | norm | experts | other | in_data | in_const |
    #                                 in_stream | out | loss
    op: ParamOp | None = None
    heads: int | None = None        # attention heads of the output ([.., H, D] view)
    fused: bool = False             # output split before use (fused projections)
    headwise: bool = False          # a norm over head_dim (qk-norm)
    vocab_like: bool = False        # its sharded dim is a vocabulary: may shard unevenly (see legality)
    data_indexed: bool = False      # an embedding looked up with indices from the batch (token ids)
    inner_modules: bool = False     # an embedding holding parametric modules of its own (facts.embeddings_with_inner_modules)
    has_ops: bool = True
    out_bytes: float = float("inf")  # first output of its last forward op, per sample
    rows: float = 0.0               # tokens of that output, per sample (loss-parallel statistics)

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]


@dataclass
class _SegmentData:
    """Degree-independent facts of one segment: nodes, edges, per-op arrays, owners."""
    name: str
    nodes: list[_Node]
    edges: list[tuple[int, int, float, Any]]  # (producer, consumer, bytes per sample, tensor key)
    groups: list[tuple[int, ...]]           # producer sets of the non-parametric owners
    flops: np.ndarray                       # per traced op (fwd and bwd), per sample
    act_bytes: np.ndarray
    param_bytes: np.ndarray
    matmul: np.ndarray
    op_class: np.ndarray                    # cost_models.compute.CLASSES code
    copy_bytes: np.ndarray                  # implicit input copy (baddbmm), per sample
    owner: np.ndarray                       # node index, len(nodes) + group index, or -1 (constant)
    ties: list[tuple[int, int]] = field(default_factory=list)
    mixing: list[bool] = field(default_factory=list)   # per group: mixes tokens (attention)

    def index(self, path: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.path == path:
                return i
        raise KeyError(path)


@dataclass
class SegmentSolution:
    """The chosen modes of one segment at one degree and its cost per micro-batch [s]."""
    segment: str
    tp: int
    sequence_parallel: bool
    modes: dict[str, Mode]               # op path (in the representative block) -> mode
    cost_s: float
    breakdown: dict[str, float]          # compute_s, comm_s, update_s
    status: str = "OPTIMAL"

    @property
    def placements(self) -> dict[str, str]:
        return {p: m.placement for p, m in self.modes.items()}


@dataclass(frozen=True)
class Choice:
    """One legal (or illegal, with the reason) placement of one op and the segment cost with it."""
    mode: str
    placement: str
    cost_s: float | None
    breakdown: dict[str, float]
    chosen: bool
    illegal: str = ""


# ============================================================================ legality and modes
def legal_modes(node: _Node, t: int, sp: bool) -> tuple[list[Mode], dict[str, str]]:
    """Modes an op may run in at degree t (and why each excluded sharding is illegal)."""
    k = node.kind
    if k in ("in_data", "in_const"):
        return [Mode("input", "", "*", "D")], {}
    if k == "in_stream":
        return [Mode("input", "", "*", "Q" if sp else "R")], {}
    if k == "out":
        return [Mode("output", "", "Q" if sp else "R", "-")], {}
    if k == "loss":
        return [Mode("loss", "", "L", "-")], {}
    if k == "experts":
        return [Mode("expert", "expert", "R", "R")], {}
    rep = Mode("replicate", "replicate", "*" if k == "embedding" else "R", "R")
    if t == 1:
        return [rep], {}
    illegal: dict[str, str] = {}
    modes = [rep]
    op = node.op
    if k == "linear":
        if not node.has_ops:
            why = ("its weight is used inside its parent's own computation (no ops of its own), so it "
                   "cannot be sharded on its own")
            return modes, {"colwise": why, "rowwise": why}
        out_f, in_f = op.out_features or 0, op.in_features or 0
        pieces, unit = op.fused_pieces, op.fused_unit
        fused = node.fused or bool(pieces)  # recognized pieces cut by view and indexing count as fused too
        if fused and not pieces:
            illegal["colwise"] = f"its {out_f} outputs are split into several tensors (fused projection)"
        elif fused and any(p % (unit * t) for p in pieces):
            illegal["colwise"] = (f"it is a fused projection of pieces {list(pieces)}"
                                  f"{f' (heads of {unit})' if unit > 1 else ''}, not each divisible by tp={t}")
        elif fused:  # each rank takes its slice of every piece (q, k, v / gate, up)
            modes.append(Mode("colwise", "colwise", "Rc", "S", True, True, shard_dim=0))
        elif out_f % t and not node.vocab_like:
            illegal["colwise"] = f"out_features={out_f} is not divisible by tp={t}"
        elif node.heads and node.heads % t:
            illegal["colwise"] = f"it projects to {node.heads} attention heads, not divisible by tp={t}"
        else:
            modes.append(Mode("colwise", "colwise", "Rc", "S", True, True, shard_dim=0))
        if in_f % t:
            illegal["rowwise"] = f"in_features={in_f} is not divisible by tp={t}"
        else:
            modes.append(Mode("rowwise", "rowwise", "S", "R", True, True, "all_reduce", 1))
            if sp:
                modes.append(Mode("rowwise_rs", "rowwise", "S", "Q", True, True, "reduce_scatter", 1))
    elif k == "embedding":
        rows = op.in_features or 0
        if not node.data_indexed:
            illegal["vocab"] = ("its indices are computed inside the model (positions), not token ids "
                                "from the batch: every rank needs the rows it looks up")
        elif node.inner_modules:
            illegal["vocab"] = ("it runs modules of its own on the looked-up rows (a norm), which a vocabulary "
                                "split would hand partial rows")
        elif rows < t:
            illegal["vocab"] = f"num_embeddings={rows} is smaller than tp={t}"
        else:
            modes.append(Mode("vocab", "vocab", "*", "R", True, True, "all_reduce", 0))
            if sp:
                modes.append(Mode("vocab_rs", "vocab", "*", "Q", True, True, "reduce_scatter", 0))
    elif k == "norm":
        if sp and not node.headwise:
            # the trainer runs norms of the sequence-sharded stream as SequenceParallel, never whole
            modes = [Mode("sequence", "sequence", "Q", "Q", True)]
            illegal["replicate"] = "under sequence parallelism a norm on the residual stream runs on sequence shards"
        elif not sp:
            illegal["sequence"] = "sequence parallelism is off"
        if node.headwise:
            modes.append(Mode("heads", "sequence" if sp else "replicate", "S", "S", True))
    else:
        illegal["colwise"] = illegal["rowwise"] = (f"tensor parallelism shards Linear, Embedding, norm and "
                                                   f"expert modules; {op.module_class if op else k} stays replicated")
    return modes, illegal


# ============================================================================ segment extraction
def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


_DTYPE_BYTES = (("float64", 8), ("int64", 8), ("long", 8), ("float32", 4), ("int32", 4), ("bfloat16", 2),
                ("float16", 2), ("half", 2), ("bool", 1), ("int8", 1), ("uint8", 1), ("float8", 1))


def _dtype_bytes(dt: Any) -> int:
    s = str(dt)
    return next((b for key, b in _DTYPE_BYTES if key in s), 4)


def _first_out_bytes(a: dict) -> float:
    shapes, dts = a.get("out_shapes") or [], a.get("out_dtypes") or []
    if not shapes:
        return 0.0
    return float(_numel(shapes[0]) * _dtype_bytes(dts[0] if dts else "float32"))


def _out_bytes(a: dict) -> float:
    """Bytes of all outputs of an op."""
    return float(sum(_numel(sh) * _dtype_bytes(dt) for sh, dt in zip(a.get("out_shapes") or [],
                                                                     a.get("out_dtypes") or [])))


class _GraphIndex:
    """Per-graph lookups shared by all segments: forward nodes by owning parametric op, regions."""

    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.params = set(graph.parametric_ops)
        self.readers = reader_modules(graph)  # where the reading of a Linear's output ends (linear_output)
        self._owner_cache: dict[str, str | None] = {}
        self.fwd_by_owner: dict[str | None, list[int]] = defaultdict(list)
        for n, a in graph.g.nodes(data=True):
            if a.get("phase") == "fwd":
                self.fwd_by_owner[self.owner(a.get("module", ""))].append(n)
        for v in self.fwd_by_owner.values():
            v.sort()

    def owner(self, module: str) -> str | None:
        """The innermost parametric op containing `module` (None for non-parametric modules)."""
        if module not in self._owner_cache:
            m = module
            while m and m not in self.params:
                m = m.rpartition(".")[0]
            self._owner_cache[module] = m if m in self.params else None
        return self._owner_cache[module]

    def fwd_nodes_of(self, path: str) -> list[int]:
        return self.fwd_by_owner.get(path, [])

    def region_of(self, path: str) -> str:
        """'pre' / 'post' / block path of a parametric op (by its first forward op; blocks by path)."""
        op = self.graph.parametric_ops[path]
        if op.block is not None:
            return op.block
        ns = self.fwd_nodes_of(path)
        return self.graph.g.nodes[ns[0]]["region"] if ns else "post"


def _in_bytes(g, nodes: list[int], own: set[int]) -> float:
    """Largest activation an op reads from outside its own ops (per traced batch)."""
    best = 0.0
    for n in nodes:
        for p in g.predecessors(n):
            if p not in own and g.nodes[p].get("phase") == "fwd":
                best = max(best, _first_out_bytes(g.nodes[p]))
    return best


def build_segment(graph: OpGraph, index: _GraphIndex, name: str) -> _SegmentData:
    """Nodes, edges (with bytes), non-parametric owner groups and per-op arrays of one segment:
    a block class representative (by block path) or ENDS (pre + post regions together, so tied
    embedding / LM-head weights are decided jointly)."""
    g = graph.g
    batch = max(graph.batch, 1)
    if name == ENDS:
        seg_ops = [p for p, op in graph.parametric_ops.items() if op.block is None]
        in_seg = lambda a: a.get("block") is None  # noqa: E731
    else:
        seg_ops = [p for p, op in graph.parametric_ops.items() if op.block == name]
        in_seg = lambda a: a.get("block") == name  # noqa: E731
    seg_ops.sort(key=lambda p: (index.fwd_nodes_of(p) or [1 << 60])[0])
    inner = embeddings_with_inner_modules(graph)
    nodes: list[_Node] = []
    pos: dict[str, int] = {}
    own_nodes: dict[str, list[int]] = {}
    for p in seg_ops:
        op = graph.parametric_ops[p]
        fwd = [n for n in index.fwd_nodes_of(p) if in_seg(g.nodes[n])]
        own_nodes[p] = fwd
        own = set(fwd)
        node = _Node(p, op.kind, op, has_ops=bool(fwd))
        if fwd:
            last = g.nodes[fwd[-1]]
            node.out_bytes = _first_out_bytes(last) / batch
            shape = last["out_shapes"][0] if last.get("out_shapes") else ()
            node.rows = _numel(shape[:-1]) / batch if shape else 0.0
            if op.kind == "linear" and op.out_features:
                node.heads, node.fused = dataclasses.astuple(output_structure(g, fwd, op.out_features, index.readers))
            if op.kind == "embedding":  # token ids come from the batch: the lookup has no producer op
                node.data_indexed = not any(p not in own for n in fwd for p in g.predecessors(n)
                                            if g.nodes[p].get("phase") == "fwd")
                node.inner_modules = p in inner
        pos[p] = len(nodes)
        nodes.append(node)
    # head-wise norms: every producer is an attention projection whose head_dim is the norm's size
    preds: dict[str, set[str]] = defaultdict(set)
    for a, b in graph.param_op_edges:
        preds[b].add(a)
    for node in nodes:
        if node.kind == "norm":
            size = node.op.in_features or 0
            ps = [nodes[pos[p]] for p in preds[node.path] if p in pos]
            node.headwise = bool(ps) and all(
                q.kind == "linear" and q.heads and (q.op.out_features or 0) == q.heads * size for q in ps)

    # virtual nodes
    def virtual(path: str, kind: str) -> int:
        if path not in pos:
            pos[path] = len(nodes)
            nodes.append(_Node(path, kind, has_ops=False))
        return pos[path]

    own_set = {p: set(v) for p, v in own_nodes.items()}
    in_bytes_cache: dict[str, float] = {}

    def in_bytes(path: str) -> float:
        if path not in in_bytes_cache:
            ns = index.fwd_nodes_of(path)
            in_bytes_cache[path] = _in_bytes(g, ns, set(ns)) / batch
        return in_bytes_cache[path]

    # forward producer sets: an op of a parametric module -> {that op}; any other op -> the union over
    # its inputs; a tensor from outside the segment -> {EXT} when it is the stream entering it (the
    # largest such tensors: the residual), {CONST} otherwise (rotary tables, masks: no gradient)
    ext, const = -1, -2
    seg_nodes = sorted(n for n, a in g.nodes(data=True) if in_seg(a))
    seg_set = set(seg_nodes)
    outside = {p for n in seg_nodes if g.nodes[n].get("phase") == "fwd" for p in g.predecessors(n)
               if p not in seg_set and g.nodes[p].get("phase") == "fwd"}
    biggest = max((_first_out_bytes(g.nodes[p]) for p in outside), default=0.0)
    ext_src = {p: frozenset({ext if _first_out_bytes(g.nodes[p]) >= 0.5 * biggest else const}) for p in outside}
    node_owner: dict[int, int] = {}
    src: dict[int, frozenset[int]] = {}
    for n in seg_nodes:
        a = g.nodes[n]
        if a.get("phase") != "fwd":
            continue
        o = index.owner(a.get("module", ""))
        if o is not None and o in pos and n in own_set.get(o, ()):
            node_owner[n] = pos[o]
            src[n] = frozenset({pos[o]})
            continue
        srcs: set[int] = set()
        for p in g.predecessors(n):
            if g.nodes[p].get("phase") == "fwd":
                srcs |= src.get(p) or ext_src.get(p, frozenset({ext}))
        src[n] = frozenset(srcs)

    def tensor_from(u: int, v: str) -> tuple[int, float] | None:
        """(node id, bytes per sample) of the largest tensor op v reads that derives from u (or EXT)."""
        best: tuple[int, float] | None = None
        for n in own_nodes[v]:
            for p in g.predecessors(n):
                if p in own_set[v] or g.nodes[p].get("phase") != "fwd":
                    continue
                if u in (src.get(p) or ext_src.get(p, frozenset({ext}))):
                    nb = _first_out_bytes(g.nodes[p]) / batch
                    if best is None or nb > best[1]:
                        best = (p, nb)
        return best

    # activation edges between parametric ops (and the segment's input / output / loss), each with the
    # tensor it carries: resharding is paid once per (producer, tensor, component)
    edge_bytes: dict[tuple[int, int, Any], float] = {}

    def add_edge(u: int, v: int, key: Any, nbytes: float) -> None:
        edge_bytes[(u, v, key)] = max(edge_bytes.get((u, v, key), 0.0), nbytes)

    has_out: set[str] = set()
    for a, b in graph.param_op_edges:
        ia, ib = a in pos and a in own_nodes, b in pos and b in own_nodes
        if ia and ib:
            t = tensor_from(pos[a], b)
            key, nbytes = t if t else (("pair", a, b), min(nodes[pos[a]].out_bytes, in_bytes(b)))
            add_edge(pos[a], pos[b], key, nbytes)
            has_out.add(a)
        elif ib:  # produced outside the segment: the stream entering it
            t = tensor_from(ext, b)
            key, nbytes = t if t else ("<in>", in_bytes(b))
            add_edge(virtual("<stream in>", "in_stream"), pos[b], key, nbytes)
        elif ia:  # consumed by a later segment: the stream leaving it
            if name == ENDS and index.region_of(a) == "post":
                continue
            add_edge(pos[a], virtual("<stream out>", "out"), "<out>", min(nodes[pos[a]].out_bytes, in_bytes(b)))
            has_out.add(a)
    # ops fed by the model's inputs only (no parametric producer): data in the ends, stream in blocks
    for p in seg_ops:
        fwd = own_nodes[p]
        if preds.get(p) or not fwd or nodes[pos[p]].kind == "experts":
            continue
        if name == ENDS:
            add_edge(virtual("<data>", "in_data"), pos[p], "<data>", in_bytes(p))
        else:
            add_edge(virtual("<stream in>", "in_stream"), pos[p], "<in>", in_bytes(p))
    if name == ENDS:  # ops whose output reaches nothing parametric feed the loss
        for p in seg_ops:
            if p not in has_out and own_nodes[p] and (index.region_of(p) == "post" or not graph.blocks):
                add_edge(pos[p], virtual("<loss>", "loss"), "<loss>", nodes[pos[p]].out_bytes)
    edges = [(u, v, b, key) for (u, v, key), b in sorted(edge_bytes.items(), key=lambda kv: (kv[0][:2], str(kv[0][2])))]
    # vocabulary dims: token embedding tables, and a Linear whose output reaches only the loss with one
    # logit per vocabulary row (the LM head)
    loss = pos.get("<loss>")
    vocab_sizes = {n.op.in_features for n in nodes if n.kind == "embedding" and n.data_indexed}
    for i, node in enumerate(nodes):
        consumers = {e[1] for e in edges if e[0] == i}
        if (node.kind == "embedding" and node.data_indexed) or (
                node.kind == "linear" and loss is not None and consumers == {loss}
                and node.op.out_features in vocab_sizes):
            node.vocab_like = True

    # non-parametric ops grouped by their producer sets (EXT -> the stream input, CONST -> constants)
    if any(ext in fs for fs in src.values()):
        virtual("<stream in>", "in_stream")
    if any(const in fs for fs in src.values()):
        virtual("<constants>", "in_const")
    stream_in, const_in = pos.get("<stream in>"), pos.get("<constants>")
    group_ids: dict[frozenset[int], int] = {}
    for n in seg_nodes:
        if n in node_owner or n not in src:
            continue
        fs = frozenset(stream_in if u == ext else const_in if u == const else u for u in src[n])
        if fs not in group_ids:
            group_ids[fs] = len(group_ids)
        node_owner[n] = len(nodes) + group_ids[fs]
    # backward ops: the owner of their forward op, else of their module's forward ops (majority)
    by_module: dict[str, Counter] = defaultdict(Counter)
    for n, own in node_owner.items():
        by_module[g.nodes[n].get("module", "")][own] += 1
    for n in seg_nodes:
        a = g.nodes[n]
        if a.get("phase") == "fwd":
            continue
        f = a.get("fwd_node")
        if f is not None and f in node_owner:
            node_owner[n] = node_owner[f]
            continue
        o = index.owner(a.get("module", ""))
        if o is not None and o in pos:
            node_owner[n] = pos[o]
        elif by_module.get(a.get("module", "")):
            node_owner[n] = by_module[a.get("module", "")].most_common(1)[0][0]
        else:
            node_owner[n] = -1
    attrs = [g.nodes[n] for n in seg_nodes]
    flops = np.array([a.get("flops", 0.0) for a in attrs], dtype=float) / batch
    pbytes = np.array([a.get("param_bytes", 0) for a in attrs], dtype=float)
    moved = np.array([moved_bytes(a) for a in attrs], dtype=float)
    groups = [tuple(sorted(fs)) for fs, _ in sorted(group_ids.items(), key=lambda kv: kv[1])]
    # token-mixing groups (attention: non-parametric matmuls, [.., s, s] scores) need whole sequences
    mixing = [False] * len(groups)
    for n, own in node_owner.items():
        if own >= len(nodes) and not mixing[own - len(nodes)] and _mixes_tokens(g, n, graph.seq_len):
            mixing[own - len(nodes)] = True
    ties = []
    for node in nodes:
        if node.op is not None:
            for owner_path in node.op.tied.values():
                if owner_path in pos and owner_path != node.path:
                    ties.append((pos[node.path], pos[owner_path]))
    return _SegmentData(
        name=name, nodes=nodes, edges=edges, groups=groups, flops=flops,
        act_bytes=np.maximum(moved - pbytes, 0.0) / batch, param_bytes=pbytes,
        matmul=np.array([is_matmul(a.get("op", "")) for a in attrs], dtype=bool),
        op_class=np.array([classify_node(a) for a in attrs], dtype=np.int8),
        copy_bytes=np.array([copy_bytes_of(a.get("op", ""), _out_bytes(a)) for a in attrs], dtype=float) / batch,
        owner=np.array([node_owner.get(n, -1) for n in seg_nodes], dtype=int), ties=ties, mixing=mixing)


# Ops that only re-describe or copy a tensor: merging heads [b, s, n, d] -> [b, s, n*d] with n*d == s
# adds a sequence-sized dim without combining positions.
_RELAYOUT_OPS = frozenset({"view", "_unsafe_view", "reshape", "transpose", "permute", "t", "clone", "contiguous",
                           "_to_copy", "squeeze", "unsqueeze", "alias", "detach", "slice", "select", "split",
                           "split_with_sizes", "chunk"})


def _seq_dims(shape: Any, seq_len: int) -> int:
    return sum(1 for d in shape if int(d) == seq_len)


def _mixes_tokens(g: Any, n: int, seq_len: int) -> bool:
    """Op n combines positions of a sequence: an activation x activation matmul (attention scores,
    fused attention), or an op whose output has more sequence-sized dims than any of its inputs (it
    creates [.., s, s] structure: a mask, an outer product over positions) other than a relayout.
    Decided by the graph, not by sizes alone: a per-token op on [b, s, h] with h == s (an RMSNorm's
    pow / mean / mul) has two sequence-sized dims in and out, and is not token mixing."""
    a = g.nodes[n]
    if is_matmul(a.get("op", "")):
        return True
    if seq_len <= 1 or op_base(a.get("op", "")) in _RELAYOUT_OPS:
        return False
    out = max((_seq_dims(sh, seq_len) for sh in a.get("out_shapes") or []), default=0)
    if out < 2:
        return False
    ins = [_seq_dims(sh, seq_len) for p in g.predecessors(n) for sh in g.nodes[p].get("out_shapes") or []]
    return out > max(ins, default=0)


# ============================================================================ costs
@dataclass
class _Costs:
    """Seconds per micro-batch of everything the ILP can choose, at one degree."""
    op: dict[tuple[int, str], tuple[float, float, float]]   # (node, mode) -> (compute, comm, update)
    comp: dict[tuple[int, Any, str], float]                  # (producer, tensor, component) -> seconds
    group_full: np.ndarray
    group_split: np.ndarray
    constant: float


def segment_costs(seg: _SegmentData, modes: list[list[Mode]], t: int, link: Link, profile, dtype: str,
                  micro_batch: int, update_rate: float) -> _Costs:
    """Per-op roofline (CostModel's formula: flops*b/d and act*b/d + params/pd per op) in three
    variants (whole, split work, split work and weights), collectives by the alpha-beta model."""
    b = float(micro_batch)
    n_nodes, n_groups = len(seg.nodes), len(seg.groups)
    size = n_nodes + n_groups + 1
    owner = np.where(seg.owner < 0, size - 1, seg.owner)

    # a grouped expert GEMM runs its group's experts as GEMM groups (compute.op_times' per-group curve)
    experts = np.array([float(n.op.num_experts or 1) if n.kind == "experts" and n.op is not None else 1.0
                        for n in seg.nodes] + [1.0] * (n_groups + 1))[owner]

    def times(d: np.ndarray | float, pd: np.ndarray | float) -> np.ndarray:
        t_ops = op_times(seg.flops * b / d, seg.act_bytes * b / d + seg.param_bytes / pd, seg.matmul, profile, dtype,
                         seg.op_class, seg.copy_bytes * b / d, experts)
        return np.bincount(owner, weights=t_ops, minlength=size)

    # an unevenly sharded vocabulary runs its largest shard: ceil(n/t) of n rows
    div = np.array([_shard_divisor(n, t) for n in seg.nodes] + [float(t)] * (n_groups + 1))
    d_ops = div[owner]
    whole, split, split_w = times(1, 1), times(d_ops, 1), times(d_ops, d_ops)
    # update_rate: optimizer step + per-micro-batch updates per parameter and micro-batch (linear in the
    # parameters; ShardingSolver.update_rate)
    op_cost: dict[tuple[int, str], tuple[float, float, float]] = {}
    for i, (node, ms) in enumerate(zip(seg.nodes, modes)):
        params = float(node.op.param_count) if node.op is not None else 0.0
        for md in ms:
            compute = (split_w if md.split_params else split if md.split_work else whole)[i]
            out = node.out_bytes * b
            comm = 0.0
            if md.reduce == "all_reduce":
                comm = all_reduce_time(out, t, link)
            elif md.reduce == "reduce_scatter":
                comm = reduce_scatter_time(out, t, link) + all_gather_time(out, t, link)
            update = params / (div[i] if md.split_params else 1) * update_rate
            op_cost[(i, md.name)] = (float(compute), float(comm), float(update))
    comp: dict[tuple[int, Any, str], float] = {}
    for u, _v, nbytes, key in seg.edges:
        big = nbytes * b
        rows = seg.nodes[u].rows * b
        comp[(u, key, "fwd_allgather")] = all_gather_time(big, t, link)
        comp[(u, key, "bwd_allgather")] = all_gather_time(big, t, link)
        comp[(u, key, "bwd_allreduce")] = all_reduce_time(big, t, link)
        comp[(u, key, "bwd_reducescatter")] = reduce_scatter_time(big, t, link)
        # Megatron's vocab-parallel cross entropy: all-reduce max, target logit and sum(exp), fp32 per token
        comp[(u, key, "loss_parallel")] = 3 * all_reduce_time(rows * 4, t, link)
    return _Costs(op_cost, comp, whole[n_nodes:n_nodes + n_groups], split[n_nodes:n_nodes + n_groups],
                  float(whole[size - 1]))


def _shard_divisor(node: _Node, t: int) -> float:
    """Work divisor of a split op: t, or n / ceil(n/t) for an unevenly sharded vocabulary of n rows."""
    if node.op is None or not node.vocab_like:
        return float(t)
    n = (node.op.in_features if node.kind == "embedding" else node.op.out_features) or t
    return n / -(-n // t)


def _join_state(states: set[str]) -> str:
    """State the non-parametric ops of a join run in, D (data, constants: sliced for free) aside: S when
    every producer gives S; Q when every producer gives Q or R and one gives Q (replicated inputs are
    sliced for free forward, their backward all-gather is charged on their edges); else R (whole)."""
    states = states - {"D"}
    if states == {"S"}:
        return "S"
    if "Q" in states and states <= {"Q", "R"}:
        return "Q"
    return "R"


def _violates(seg: _SegmentData, modes: dict[int, Mode]) -> bool:
    """True when an assignment breaks a constraint of the ILP (token mixing, tied weights)."""
    for gi, members in enumerate(seg.groups):
        if seg.mixing[gi] and any(seg.nodes[u].op is not None and modes[u].gives == "Q" for u in members):
            return True
    if any(_edge_components(seg, u, v, modes[u], modes[v]) is None for u, v, _, _ in seg.edges):
        return True
    return any(modes[a].shard_dim != modes[b].shard_dim for a, b in seg.ties)


def _evaluate(seg: _SegmentData, modes: dict[int, Mode], costs: _Costs) -> dict[str, float]:
    """Exact cost of a full assignment (the ILP objective in seconds): compute, comm, update."""
    compute = costs.constant
    comm = update = 0.0
    for i, m in modes.items():
        c, k, u = costs.op[(i, m.name)]
        compute, comm, update = compute + c, comm + k, update + u
    needed: set[tuple[int, Any, str]] = set()
    for u, v, _, key in seg.edges:
        for c in _edge_components(seg, u, v, modes[u], modes[v]) or ():
            needed.add((u, key, c))
    comm += sum(costs.comp[k] for k in needed)
    for gi, members in enumerate(seg.groups):
        sharded = bool(members) and _join_state({modes[u].gives for u in members}) != "R"
        compute += costs.group_split[gi] if sharded else costs.group_full[gi]
    return {"compute_s": compute, "comm_s": comm, "update_s": update, "total_s": compute + comm + update}


# ============================================================================ the ILP
class PlacementILP:
    """The placement integer program of one segment at one degree (formulation in the module docstring)."""

    def __init__(self, seg: _SegmentData, modes: list[list[Mode]], costs: _Costs,
                 fixed: dict[int, str] | None = None, memory_budget_bytes: float | None = None,
                 t: int = 1, param_bytes: int = 2):
        self.seg, self.modes, self.costs, self.t = seg, modes, costs, t
        self.model = cp_model.CpModel()
        m = self.model
        self.x = {(i, md.name): m.new_bool_var(f"x[{n.path},{md.name}]")
                  for i, (n, ms) in enumerate(zip(seg.nodes, modes)) for md in ms}
        self.y: dict[tuple[int, str, str], Any] = {}
        self.z: dict[tuple[int, str, str], Any] = {}
        self.wS: dict[int, Any] = {}
        self.wQ: dict[int, Any] = {}
        self.add_assignment(fixed or {})
        self.add_edge_consistency()
        self.add_resharding()
        self.add_join_states()
        self.add_token_mixing()
        self.add_tied_parameters()
        if memory_budget_bytes is not None:
            self.add_memory_budget(memory_budget_bytes, param_bytes)
        self.set_objective()

    @staticmethod
    def _int(seconds: float) -> int:
        return int(round(seconds * COST_SCALE))

    def add_assignment(self, fixed: dict[int, str]) -> None:
        """sum_m x[o,m] = 1 for every op o (one mode each); x[o,m*] = 1 for modes fixed by the caller."""
        for i, ms in enumerate(self.modes):
            self.model.add_exactly_one(self.x[(i, md.name)] for md in ms)
        for i, name in fixed.items():
            self.model.add(self.x[(i, name)] == 1)

    def add_edge_consistency(self) -> None:
        """For each edge e = (u, v): sum_q y[e,p,q] = x[u,p] for all p and sum_p y[e,p,q] = x[v,q] for
        all q, so y[e,p,q] = x[u,p] AND x[v,q] (the layout pair the edge carries); y[e,p,q] = 0 for
        pairs whose conversion is not allowed."""
        m = self.model
        for ei, (u, v, _, _) in enumerate(self.seg.edges):
            for p in self.modes[u]:
                for q in self.modes[v]:
                    y = m.new_bool_var(f"y[{ei},{p.name},{q.name}]")
                    self.y[(ei, p.name, q.name)] = y
                    if _edge_components(self.seg, u, v, p, q) is None:
                        m.add(y == 0)
            for p in self.modes[u]:
                m.add(sum(self.y[(ei, p.name, q.name)] for q in self.modes[v]) == self.x[(u, p.name)])
            for q in self.modes[v]:
                m.add(sum(self.y[(ei, p.name, q.name)] for p in self.modes[u]) == self.x[(v, q.name)])

    def add_resharding(self) -> None:
        """z[u,k,p,c] >= y[e,p,q] for every out-edge e of u carrying tensor k and every consumer mode q
        with c in reshard_components(gives(u,p), needs(v,q)): a collective is paid once per (producer,
        tensor), so consumers reading one tensor (q, k, v after a norm) share it."""
        m = self.model
        for ei, (u, v, _, tensor) in enumerate(self.seg.edges):
            for p in self.modes[u]:
                for q in self.modes[v]:
                    for c in _edge_components(self.seg, u, v, p, q) or ():
                        key = (u, tensor, p.name, c)
                        if key not in self.z:
                            self.z[key] = m.new_bool_var(f"z[{self.seg.nodes[u].path},{tensor},{p.name},{c}]")
                        m.add(self.z[key] >= self.y[(ei, p.name, q.name)])

    def _state_sum(self, u: int, state: str):
        return sum(self.x[(u, md.name)] for md in self.modes[u] if md.gives == state)

    def add_join_states(self) -> None:
        """With X(u) = sum_{p: gives(u,p)=X} x[u,p]: wS[g] <= S(u) + D(u) and wQ[g] <= Q(u) + R(u) + D(u)
        for every producer u in g, wS[g] <= sum_u S(u), wQ[g] <= sum_u Q(u), wS[g] + wQ[g] <= 1:
        non-parametric ops run feature-sharded only if all their producers' outputs are (constants
        aside), sequence-sharded only if one is and none is feature-sharded (_join_state; the objective
        pushes w up to it)."""
        m = self.model
        for gi, members in enumerate(self.seg.groups):
            if not members:
                continue
            ws, wq = m.new_bool_var(f"wS[{gi}]"), m.new_bool_var(f"wQ[{gi}]")
            for u in members:
                m.add(ws <= self._state_sum(u, "S") + self._state_sum(u, "D"))
                m.add(wq <= self._state_sum(u, "Q") + self._state_sum(u, "R") + self._state_sum(u, "D"))
            m.add(ws <= sum(self._state_sum(u, "S") for u in members))
            m.add(wq <= sum(self._state_sum(u, "Q") for u in members))
            m.add(ws + wq <= 1)
            self.wS[gi], self.wQ[gi] = ws, wq

    def add_token_mixing(self) -> None:
        """sum_{p: gives(u,p)=Q} x[u,p] = 0 for every parametric producer u of a token-mixing group g
        (attention): its ops need whole sequences, so no producer may hand them a sequence shard."""
        for gi, members in enumerate(self.seg.groups):
            if not self.seg.mixing[gi]:
                continue
            for u in members:
                if self.seg.nodes[u].op is not None:
                    for md in self.modes[u]:
                        if md.gives == "Q":
                            self.model.add(self.x[(u, md.name)] == 0)

    def add_tied_parameters(self) -> None:
        """For a weight shared by ops a and b (LM head tied to the token embedding) and each dim d:
        sum_{p: shard_dim(a,p)=d} x[a,p] = sum_{q: shard_dim(b,q)=d} x[b,q] (one sharding of one tensor)."""
        for a, b in self.seg.ties:
            for d in (0, 1):
                self.model.add(sum(self.x[(a, p.name)] for p in self.modes[a] if p.shard_dim == d)
                               == sum(self.x[(b, q.name)] for q in self.modes[b] if q.shard_dim == d))

    def add_memory_budget(self, budget_bytes: float, param_bytes: int) -> None:
        """sum_{o,m} x[o,m] * P_o / (t if m shards weights else 1) * param_bytes <= budget (per rank)."""
        terms = []
        for i, (n, ms) in enumerate(zip(self.seg.nodes, self.modes)):
            if n.op is None:
                continue
            for md in ms:
                per_rank = n.op.param_count / (self.t if md.split_params else 1) * param_bytes
                terms.append(int(per_rank) * self.x[(i, md.name)])
        if terms:
            self.model.add(sum(terms) <= int(budget_bytes))

    def set_objective(self) -> None:
        """minimize sum x*C_op + sum z*C_comm + sum_g (F_g - (F_g - F_g/t)(wS[g] + wQ[g]))."""
        c = self.costs
        terms = []
        for (i, name), var in self.x.items():
            terms.append(self._int(sum(c.op[(i, name)])) * var)
        for (u, tensor, _p, comp), var in self.z.items():
            terms.append(self._int(c.comp[(u, tensor, comp)]) * var)
        for gi in self.wS:
            gain = self._int(c.group_full[gi] - c.group_split[gi])
            terms.append(-gain * (self.wS[gi] + self.wQ[gi]))
        self.model.minimize(sum(terms))

    def solve(self, time_limit_s: float = 10.0) -> tuple[str, dict[int, Mode]]:
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1          # deterministic, and these models are small
        solver.parameters.max_time_in_seconds = time_limit_s
        status = solver.solve(self.model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver.status_name(status), {}
        chosen = {}
        for i, ms in enumerate(self.modes):
            chosen[i] = next(md for md in ms if solver.value(self.x[(i, md.name)]))
        return solver.status_name(status), chosen


# ============================================================================ the solver
class ShardingSolver:
    """Placements of one graph on one cluster, solved per distinct block class and degree, cached on
    the instance (keep one per planner run; identical blocks reuse their class's solution)."""

    def __init__(self, graph: OpGraph, cluster: Cluster, dtype: str = "bf16",
                 memory_budget_bytes: float | None = None, update_rate: UpdateRate | None = None):
        """update_rate(m): optimizer + per-micro-batch update seconds per parameter and micro-batch with
        m micro-batches (the cost model's optimizer_seconds_per_param / m, so placements are priced for
        the runtime the cost model describes); default Megatron's layout (compute.update_time)."""
        self.graph, self.cluster, self.dtype = graph, cluster, dtype
        self.update_rate = update_rate or (lambda m: update_time(1.0, 1.0, m, PARAM_BYTES, GRAD_BYTES,
                                                                  cluster.profile) / m)
        self.profile = cluster.profile
        self.memory_budget_bytes = memory_budget_bytes
        self._index: _GraphIndex | None = None
        self._segments: dict[str, _SegmentData] = {}
        self._solutions: dict[tuple, SegmentSolution] = {}
        reps: dict[int, str] = {}
        for b in graph.blocks:
            reps.setdefault(graph.block_class.get(b, 0), b)
        self.class_rep = reps

    # ---- structure
    @property
    def index(self) -> _GraphIndex:
        if self._index is None:
            self._index = _GraphIndex(self.graph)
        return self._index

    def segment(self, name: str) -> _SegmentData:
        if name not in self._segments:
            self._segments[name] = build_segment(self.graph, self.index, name)
        return self._segments[name]

    def segment_names(self) -> list[str]:
        return [*self.class_rep.values(), ENDS]

    def segment_of(self, op_path: str) -> tuple[str, str]:
        """(segment name, the op's path in that segment's representative)."""
        op = self.graph.parametric_ops[op_path]
        if op.block is None:
            return ENDS, op_path
        rep = self.class_rep[self.graph.block_class.get(op.block, 0)]
        return rep, rep + op_path[len(op.block):]

    def tp_link(self, t: int) -> Link:
        return link_for(self.profile, "intra" if t <= self.cluster.devices_per_node else "inter")

    def _check(self, t: int) -> None:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise UserError(f"sharding: tp={t!r} must be a positive integer")

    # ---- solving
    def problem(self, name: str, t: int, sp: bool, micro_batch: int, num_micro_batches: int = 1):
        seg = self.segment(name)
        modes, illegal = zip(*(legal_modes(n, t, sp) for n in seg.nodes)) if seg.nodes else ((), ())
        costs = segment_costs(seg, list(modes), t, self.tp_link(t), self.profile, self.dtype, micro_batch,
                              self.update_rate(max(num_micro_batches, 1)))
        return seg, list(modes), list(illegal), costs

    def solve_segment(self, name: str, t: int, sp: bool, micro_batch: int = 1, num_micro_batches: int = 1,
                      fixed: dict[str, str] | None = None) -> SegmentSolution:
        """Optimal modes of one segment ('ends' or a block representative path) at degree t."""
        self._check(t)
        sp = bool(sp and t > 1)
        key = (name, t, sp, micro_batch, num_micro_batches, tuple(sorted((fixed or {}).items())))
        if key in self._solutions:
            return self._solutions[key]
        seg, modes, _illegal, costs = self.problem(name, t, sp, micro_batch, num_micro_batches)
        fix_idx = {seg.index(p): m for p, m in (fixed or {}).items()}
        ilp = PlacementILP(seg, modes, costs, fix_idx, self.memory_budget_bytes, t)
        status, chosen = ilp.solve()
        if not chosen:
            sol = SegmentSolution(name, t, sp, {}, float("inf"), {}, status)
        else:
            br = {k: float(v) for k, v in _evaluate(seg, chosen, costs).items()}
            sol = SegmentSolution(name, t, sp, {seg.nodes[i].path: md for i, md in chosen.items()
                                                if seg.nodes[i].op is not None},
                                  br["total_s"], br, status)
        self._solutions[key] = sol
        return sol

    def placements(self, tp: int, sequence_parallel: bool, micro_batch: int = 1,
                   num_micro_batches: int = 1) -> dict[str, str]:
        """Module path -> placement for every parametric op of the model."""
        self._check(tp)
        out: dict[str, str] = {}
        sols = {name: self.solve_segment(name, tp, sequence_parallel, micro_batch, num_micro_batches)
                for name in self.segment_names()}
        for name, sol in sols.items():
            if sol.status not in ("OPTIMAL", "FEASIBLE"):
                raise UserError(f"sharding: no placement satisfies the constraints of {name} at tp={tp} "
                                f"({sol.status}); raise the memory budget")
        for path, op in self.graph.parametric_ops.items():
            seg, rel = self.segment_of(path)
            mode = sols[seg].modes.get(rel)
            out[path] = mode.placement if mode is not None else ("expert" if op.kind == "experts" else "replicate")
        return out

    def segment_costs(self, tp: int, sequence_parallel: bool, micro_batch: int = 1) -> dict[str, float]:
        """Solved cost per micro-batch [s] of each segment (block representatives and 'ends')."""
        return {n: float(self.solve_segment(n, tp, sequence_parallel, micro_batch).cost_s)
                for n in self.segment_names()}

    def choices(self, op_path: str, tp: int, sequence_parallel: bool, micro_batch: int = 1) -> list[Choice]:
        """Every placement of one op: the segment's optimal cost with the op fixed to each legal mode,
        and the reason for each illegal one."""
        if op_path not in self.graph.parametric_ops:
            raise UserError(f"sharding: {op_path!r} is not a parametric op of the model")
        sp = bool(sequence_parallel and tp > 1)
        name, rel = self.segment_of(op_path)
        seg, modes, illegal, _costs = self.problem(name, tp, sp, micro_batch)
        i = seg.index(rel)
        best = self.solve_segment(name, tp, sp, micro_batch)
        out = []
        for md in modes[i]:
            sol = self.solve_segment(name, tp, sp, micro_batch, fixed={rel: md.name})
            why = "" if sol.modes else _infeasible_reason(seg, i, md)
            out.append(Choice(md.name, md.placement, sol.cost_s if sol.modes else None, sol.breakdown,
                              chosen=best.modes.get(rel) == md, illegal=why))
        for placement, why in illegal[i].items():
            out.append(Choice(placement, placement, None, {}, False, why))
        return out


MODE_TEXT = {
    "replicate": "whole weights, whole activations", "colwise": "output features sharded",
    "rowwise": "input features sharded, output all-reduced",
    "rowwise_rs": "input features sharded, output reduce-scattered to sequence shards",
    "vocab": "table rows sharded, output all-reduced",
    "vocab_rs": "table rows sharded, output reduce-scattered to sequence shards",
    "sequence": "on sequence shards", "heads": "on head-sharded input", "expert": "expert group",
}


def _infeasible_reason(seg: _SegmentData, i: int, md: Mode) -> str:
    """Why fixing op i to mode md leaves no legal layout of its segment."""
    producers = sorted({seg.nodes[u].path for u, v, _, _ in seg.edges if v == i})
    if md.needs == "S":
        return (f"needs a feature-sharded input from a colwise op in {seg.nodes[i].parent or 'the root'}; "
                f"its input comes from {', '.join(producers) or 'the model inputs'}")
    if any(seg.mixing[g] for g, members in enumerate(seg.groups) if i in members) and md.gives == "Q":
        return "its output feeds attention, which needs whole sequences"
    return "no layout of the neighbouring ops accepts it (or the memory budget is exceeded)"


# ============================================================================ public API
def solve_placements(graph: OpGraph, cluster: Cluster, tp: int, sequence_parallel: bool, micro_batch: int = 1,
                     *, solver: ShardingSolver | None = None, num_micro_batches: int = 1) -> dict[str, str]:
    """Placements (module path -> value, see the module docstring) for every parametric op of the
    model at tensor-parallel degree tp. Blocks of one class get the same relative layout. Pass a
    ShardingSolver to reuse its cache across calls (e.g. one per planner run)."""
    solver = solver or ShardingSolver(graph, cluster)
    return solver.placements(tp, sequence_parallel, micro_batch, num_micro_batches)


def block_tp_cost(graph: OpGraph, cluster: Cluster, tp: int, sequence_parallel: bool, micro_batch: int = 1,
                  *, solver: ShardingSolver | None = None) -> dict[str, float]:
    """Optimal cost per micro-batch [s] (forward + backward + TP collectives + parameter update) of each
    block class representative and of the model's ends ('ends') at degree tp."""
    solver = solver or ShardingSolver(graph, cluster)
    return solver.segment_costs(tp, sequence_parallel, micro_batch)


def explain_choices(ctx: Any, plan: Any, op_path: str) -> str:
    """`autoparallel plan --explain OP_PATH`: each placement of one op, what its block (or the model's
    ends) would cost per micro-batch with it, and the plan's choice marked."""
    graph = ctx.graph
    if op_path not in graph.parametric_ops:
        raise UserError(f"--explain {op_path!r}: not a parametric op of the model")
    cm = getattr(ctx, "cost_model", None)
    solver = ShardingSolver(graph, ctx.cluster, getattr(cm, "dtype", "bf16"))
    tp, sp = plan.tp, bool(plan.sequence_parallel and plan.tp > 1)
    choices = solver.choices(op_path, tp, sp, plan.micro_batch)
    name, _rel = solver.segment_of(op_path)
    block = graph.parametric_ops[op_path].block
    if block is not None and name != block:  # speak of the op's own block, not the class representative
        choices = [dataclasses.replace(c, illegal=c.illegal.replace(name + ".", block + ".")) for c in choices]
    in_plan = plan.placements.get(op_path)
    where = "the model's ends (embeddings, final norm, LM head)" if name == ENDS else \
        f"block class of {graph.parametric_ops[op_path].block} (representative {name})"
    lines = [f"{op_path} ({graph.parametric_ops[op_path].module_class}) in {where}",
             f"tp={tp}, sequence parallel {'on' if sp else 'off'}, micro-batch {plan.micro_batch}; "
             f"cost per micro-batch of the segment with the op in each placement:"]
    legal = [c for c in choices if not c.illegal]
    best = min((c.cost_s for c in legal if c.cost_s is not None), default=None)
    for c in legal:
        mark = "  <- plan" if in_plan is not None and c.placement == in_plan and c.chosen else \
            ("  <- solver" if c.chosen else "")
        b = c.breakdown
        delta = "" if best is None or c.cost_s == best else f" (+{(c.cost_s - best) * 1e3:.3f} ms)"
        lines.append(f"  {c.placement:<10} {c.cost_s * 1e3:10.3f} ms{delta}  compute {b['compute_s'] * 1e3:.3f}, "
                     f"tp comm {b['comm_s'] * 1e3:.3f}, update {b['update_s'] * 1e3:.3f}  "
                     f"[{MODE_TEXT.get(c.mode, c.mode)}]{mark}")
    for c in choices:
        if c.illegal:
            lines.append(f"  {c.placement:<10} not possible [{MODE_TEXT.get(c.mode, c.mode)}]: {c.illegal}")
    if tp == 1:
        lines.append("  (tp=1: nothing is sharded, every placement costs the same)")
    if graph.parametric_ops[op_path].kind == "experts":
        lines.append(f"  (expert groups shard over the plan's ep={plan.ep} ranks; inside a tp group they run whole)")
    if in_plan is not None and not any(c.chosen and c.placement == in_plan for c in legal):
        lines.append(f"  the plan records {in_plan!r} (not the solver's choice at these settings)")
    return "\n".join(lines)


__all__ = ["ShardingSolver", "SegmentSolution", "Choice", "Mode", "PlacementILP", "legal_modes",
           "reshard_components", "solve_placements", "block_tp_cost", "explain_choices", "ENDS"]


def cost_model(graph: OpGraph, cluster: Cluster, dtype: str = "bf16", overlap_grad_sync: bool = True,
               runtime: str = "trainer", segment_cache: SegmentCache | None = None,
               variant: RuntimeVariant = TRAINER) -> CostModel:
    """A CostModel whose plans without placements get this solver's (one solver per cost model, so its
    per-block-class caches are shared; updates priced with the cost model's own runtime). segment_cache:
    the graph's segment analyses, shared across cost models of one graph; variant: where the runtime differs
    from the trainer (CostModel)."""
    cm = CostModel(graph, cluster, dtype, overlap_grad_sync, runtime, segment_cache, variant)
    solver = ShardingSolver(graph, cluster, dtype, update_rate=cm.update_rate_per_micro_batch)
    cm.placement_solver = solver.placements
    return cm
