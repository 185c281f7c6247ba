"""Cut the operator graph into pipeline-placeable segments and find what tensor parallelism shards.

Segments: "pre" (everything before the first block: embeddings), one representative per identical
block class, and "post" (final norm, LM head, loss). Each becomes a `Segment` of per-op arrays
(FLOPs, bytes, saved bytes, sharding flags) for one sample of the traced batch, so that the cost of
any (tp, sequence parallel, micro-batch, recompute) is a vectorized sum, not a graph walk.

Tensor-parallel propagation over the forward ops, in execution order, given placements:
  colwise op       -> its output is feature-sharded (S); the op runs at 1/tp
  rowwise / vocab  -> consumes S, output is partial -> all-reduce (reduce-scatter under SP) -> R
  other op         -> S if any input is S (attention on sharded heads, SwiGLU on sharded features)
  replicate / sequence module -> R: a feature-sharded input is all-gathered first (tp_gather_bytes),
                     except a norm beside colwise siblings (qk-norm on sharded heads: S if any input S)
  input from another segment -> R: the residual stream never enters a segment feature-sharded (a
                     colwise output leaving its segment is all-gathered there: tp_gather_bytes)
  R ops            -> replicated; under sequence parallelism they run on 1/tp of the sequence
Backward ops inherit the flag of their forward op (`fwd_node`, else their module's forward ops).
Collectives (Megatron's g and f): forward, one all-reduce per rowwise/vocab output; backward, one
all-reduce of the gradient of each distinct input of the colwise ops. Under SP those become forward
reduce-scatters and all-gathers, and backward mirrors forward. (A vocab embedding thus costs no
backward collective, a colwise LM head a backward one.)
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from cost_models.compute import (
    CLASS_CODE,
    breaks_graph,
    classify_node,
    copy_bytes_of,
    gathered_per_row,
    index_put_bytes,
    is_matmul,
    moved_bytes,
    op_sac_keep,
)
from cost_models.graph import OpGraph

SHARDING_PLACEMENTS = ("colwise", "rowwise", "vocab")


@dataclass
class PhaseOps:
    """Per-op arrays for one phase of one segment, per sample of the traced batch."""
    flops: np.ndarray         # FLOPs
    act_bytes: np.ndarray     # activation bytes read + written (weights excluded)
    param_bytes: np.ndarray   # weight bytes read
    matmul: np.ndarray        # bool: runs on matrix units
    tp_sharded: np.ndarray    # bool: runs at 1/tp under the placements
    groups: np.ndarray        # expert count of the expert group the op runs in (0 outside expert groups)
    saved_bytes: np.ndarray   # bytes kept for backward (fwd only; zeros for bwd)
    keep_selective: np.ndarray  # bool: still saved under selective recompute (fwd only)
    op_class: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))  # compute.CLASSES code
    copy_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # implicit input copy (baddbmm), per sample
    # bool: a backward op on a weight-gradient-shaped tensor (select_backward of a stacked expert
    # weight, accumulation of such gradients): its bytes do not grow with the micro-batch
    weight_sized: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # bool: still saved under per-op selective checkpointing ("op": the outputs of matmuls and fused
    # attention, the trainer's save list; fwd only)
    keep_op: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # bool: the same under torchtitan's policy, every second mm recomputed (compute.op_sac_keep; fwd only)
    keep_op_torchtitan: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    out_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # bytes of each op's outputs, per sample
    # bool: a GEMM of an nn.Linear whose dims are multiples of 16, which FP8 training runs in float8
    # (compute.fp8_gemm_times; the trainer converts the same linears, autoparallel.trainer.low_precision)
    fp8_gemm: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    in_act_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # activation bytes read, per sample
    loss: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # bool: an op of the loss (fwd)
    # bool: a fused attention kernel given a mask rather than is_causal, which computes every score
    masked_attention: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # an accumulating index_put's (bwd) source rows per destination row at the traced batch (compute.gathered_per_row)
    gathered_per_row: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # the same op's bytes in index_put_terms' convention, per sample (compute.index_put_bytes)
    index_put_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # bool: an op whose output shape is data (compute.breaks_graph): torch.compile runs its block eager around it
    graph_break: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def expert(self) -> np.ndarray:
        """bool: inside an expert group."""
        return self.groups > 0

    @classmethod
    def empty(cls) -> PhaseOps:
        z = np.zeros(0)
        b = np.zeros(0, dtype=bool)
        return cls(z, z, z, b, b, z, z, b, np.zeros(0, dtype=np.int8), z, b)


@dataclass
class Segment:
    name: str                      # "pre", "post" or the representative block path
    fwd: PhaseOps
    bwd: PhaseOps
    tp_collective_bytes: list[float] = field(default_factory=list)  # rowwise/vocab outputs: reduced forward
    # distinct inputs of colwise modules: all-gathered forward under SP, their gradients all-reduced
    # backward without SP (Megatron's f operator), per sample
    tp_col_input_bytes: list[float] = field(default_factory=list)
    tp_gather_bytes: list[float] = field(default_factory=list)      # all-gathers of feature-sharded
    #                                  outputs consumed whole (fwd only; backward slices), SP or not
    ep_alltoall_bytes: float = 0.0   # bytes one rank sends per all-to-all (dispatch), per sample
    dense_params: float = 0.0        # parameters not sharded by tp
    tp_params: float = 0.0           # parameters sharded tp-way
    expert_params: float = 0.0       # parameters sharded ep-way (replicated over tp)
    param_tensors: int = 0           # parameter tensors (weights, biases; tied ones once): FSDP2's per-tensor work
    input_bytes: float = 0.0         # bytes of the segment's input activation, per sample
    num_experts: int = 0
    # K and V inputs of the fused attention kernels (whole sequence, all kv heads), per sample: what a
    # context-parallel ring passes around (estimate.ring_attention); attn_sharded: heads split over tp
    attn_kv_bytes: float = 0.0
    attn_sharded: bool = False


def _digraph(graph: OpGraph):
    return graph.g


def _segment_of_module(module: str, blocks: list[str]) -> str | None:
    for b in blocks:
        if module == b or module.startswith(b + "."):
            return b
    return None


@dataclass(eq=False)  # identity: two caches are never equal by contents (the graph is not compared)
class SegmentCache:
    """`split_segments` of one graph per (placements, sequence parallelism), built on first use. The analysis
    reads the graph and the placements only, no profile, so cost models of one graph under other profiles (a
    calibration fit prices hundreds) share one cache instead of each analysing the graph again."""

    graph: OpGraph
    _segments: dict[tuple[int, bool], dict[str, Segment]] = field(default_factory=dict)
    _ids: dict[tuple, int] = field(default_factory=dict)
    _keys: dict[tuple, tuple] = field(default_factory=dict)

    def key(self, placements: dict[str, str], sp: bool) -> tuple[int, bool]:
        """Key of a (placements, sequence-parallel) analysis; builds the analysis on first use. Placement
        dicts are keyed by identity first: sorting a 1000-entry dict per query is slow. The key is (the number
        of the placements' contents in this cache, sp): callers hash it per cost query (the cost model's
        lru_cache), and a tuple of every placement would be hashed whole each time."""
        ident = (id(placements), sp)
        if ident in self._keys and self._keys[ident][0] is placements:
            return self._keys[ident][1]
        key = (self._ids.setdefault(tuple(sorted(placements.items())), len(self._ids)), sp)
        if key not in self._segments:
            self._segments[key] = split_segments(self.graph, placements, sp)
        self._keys[ident] = (placements, key)
        return key

    def __getitem__(self, key: tuple[int, bool]) -> dict[str, Segment]:
        return self._segments[key]


def block_classes(graph: OpGraph) -> list[int]:
    """Identical-block class id of each block, in block order."""
    return [graph.block_class[b] for b in graph.blocks]


def segment_of(graph: OpGraph) -> dict[int, str]:
    """node -> its segment: the block it belongs to, else its region ("pre", "post")."""
    return {n: (a["block"] if a["region"] == "block" else a["region"]) for n, a in _digraph(graph).nodes(data=True)}


def phase_node_ids(graph: OpGraph, seg_of: dict[int, str], name: str, phase: str) -> list[int]:
    """The nodes of segment `name`'s phase, in the order its PhaseOps arrays hold them."""
    return _phase_nodes(graph, seg_of, {name}).get((name, phase), [])


def _phase_nodes(graph: OpGraph, seg_of: dict[int, str], names: set[str]) -> dict[tuple[str, str], list[int]]:
    """phase_node_ids of every (segment in `names`, phase) at once: one pass over the graph, not one per pair."""
    g = _digraph(graph)
    out: dict[tuple[str, str], list[int]] = defaultdict(list)
    for n in sorted(g.nodes):
        name = seg_of.get(n)
        if name in names:
            out[name, g.nodes[n].get("phase")].append(n)
    return out


def split_segments(graph: OpGraph, placements: dict[str, str], sequence_parallel: bool) -> dict[str, Segment]:
    """Build the "pre", "post" and one Segment per block class representative."""
    g = _digraph(graph)
    reps: dict[int, str] = {}
    for b, c in zip(graph.blocks, block_classes(graph)):
        reps.setdefault(c, b)
    seg_of = segment_of(graph)
    names = ["pre", *reps.values(), "post"]
    nodes = _phase_nodes(graph, seg_of, set(names))
    sharded, gathered = _propagate_tp(graph, placements, seg_of, nodes)
    segments: dict[str, Segment] = {}
    regions = _param_regions(graph)
    for name in names:
        segments[name] = _build_segment(graph, name, nodes, sharded, placements, sequence_parallel, regions)
        segments[name].tp_gather_bytes = [_out_bytes(g.nodes[p]) / max(graph.batch, 1)
                                          for p in sorted(gathered) if seg_of.get(p) == name]
    return segments


def _propagate_tp(graph: OpGraph, placements: dict[str, str], seg_of: dict[int, str],
                  nodes: dict[tuple[str, str], list[int]]) -> tuple[dict[int, bool], set[int]]:
    """Forward propagation of feature sharding (see module docstring); bwd ops inherit. Also returns
    the feature-sharded forward ops whose output is all-gathered for a whole consumer. Only over the
    segments in `nodes` (_phase_nodes): an input from another segment arrives gathered, so a segment's
    flags do not depend on the others (the other 79 blocks of a uniform 80-block model are never read),
    and an output that leaves its segment is gathered there."""
    g = _digraph(graph)
    out_sharded: dict[int, bool] = {}
    op_sharded: dict[int, bool] = {}
    gathered: set[int] = set()
    fwd_by_module: dict[str, list[bool]] = defaultdict(list)
    colwise_parents = {p.rpartition(".")[0] for p, v in placements.items() if v == "colwise"}
    norms = {p for p, op in graph.parametric_ops.items() if op.kind == "norm"}
    for n in sorted(n for (_, phase), ids in nodes.items() if phase == "fwd" for n in ids):
        a = g.nodes[n]
        module = a.get("module", "")
        pl = placements.get(module)
        ins = []
        for p in g.predecessors(n):
            s = out_sharded.get(p, False)
            if s and seg_of.get(p) != seg_of.get(n):
                s = False
            ins.append(s)
        whole = pl in ("replicate", "sequence") and not (module in norms
                                                         and module.rpartition(".")[0] in colwise_parents)
        if whole and any(ins):  # a replicated module computes on whole inputs
            gathered.update(p for p in g.predecessors(n) if out_sharded.get(p, False))
            ins = [False] * len(ins)
        if pl == "colwise":
            op_sharded[n], out_sharded[n] = True, True
        elif pl in ("rowwise", "vocab"):
            op_sharded[n], out_sharded[n] = True, False
        elif pl == "expert":
            # Expert groups shard over ep, not tp: every tp rank runs its ep shard's experts in full
            # (the trainer has no expert tensor parallelism).
            op_sharded[n], out_sharded[n] = False, False
        else:
            s = any(ins)
            op_sharded[n], out_sharded[n] = s, s
        fwd_by_module[a.get("module", "")].append(op_sharded[n])
        if out_sharded[n] and any(seg_of.get(s) != seg_of.get(n) and g.nodes[s].get("phase") == "fwd"
                                  for s in g.successors(n)):
            gathered.add(n)  # leaves its segment: gathered there
    for n in sorted(n for (_, phase), ids in nodes.items() if phase != "fwd" for n in ids):
        a = g.nodes[n]
        f = a.get("fwd_node")
        if f is not None and f in op_sharded:
            op_sharded[n] = op_sharded[f]
        else:
            flags = fwd_by_module.get(a.get("module", ""), [])
            op_sharded[n] = bool(flags) and sum(flags) * 2 > len(flags)
    return op_sharded, gathered


def _build_segment(graph: OpGraph, name: str, nodes: dict[tuple[str, str], list[int]], sharded: dict[int, bool],
                   placements: dict[str, str], sequence_parallel: bool, regions: dict[str, str]) -> Segment:
    g = _digraph(graph)
    per_sample = 1.0 / max(graph.batch, 1)
    experts = {p for p, op in graph.parametric_ops.items() if op.kind == "experts"}

    def experts_of(module: str) -> int:
        """The expert count of the group `module` belongs to, 0 outside expert groups."""
        for e in experts:
            if module == e or module.startswith(e + "."):
                return graph.parametric_ops[e].num_experts or 1
        return 0

    seg = Segment(name=name, fwd=PhaseOps.empty(), bwd=PhaseOps.empty())
    weight_shapes = {tuple(int(d) for d in shape) for op in graph.parametric_ops.values()
                     for shape in op.shapes.values()}
    for phase in ("fwd", "bwd"):
        ids = nodes.get((name, phase), [])
        attrs = [g.nodes[n] for n in ids]
        names = [a.get("op", "") for a in attrs]
        flops = np.array([a.get("flops", 0.0) for a in attrs], dtype=float) * per_sample
        pbytes = np.array([a.get("param_bytes", 0) for a in attrs], dtype=float)
        moved = np.array([moved_bytes(a) for a in attrs], dtype=float)
        act = np.maximum(moved - pbytes, 0.0) * per_sample
        op_class = np.array([classify_node(a) for a in attrs], dtype=np.int8)
        # the backward's accumulating index_puts (a row gather's backward): compute.index_put_times prices them
        index_puts = [phase == "bwd" and c == CLASS_CODE["index_put"] and bool(a.get("out_shapes"))
                      for a, c in zip(attrs, op_class)]
        ops = PhaseOps(
            flops=flops, act_bytes=act, param_bytes=pbytes,
            matmul=np.array([is_matmul(a.get("op", "")) for a in attrs], dtype=bool),
            tp_sharded=np.array([sharded.get(n, False) for n in ids], dtype=bool),
            groups=np.array([experts_of(a.get("module", "")) for a in attrs], dtype=float),
            saved_bytes=np.array([a.get("saved_bytes", 0) for a in attrs], dtype=float) * per_sample,
            keep_selective=np.array([_keep_under_selective(a, graph.seq_len, graph.batch) for a in attrs],
                                    dtype=bool),
            op_class=op_class,
            copy_bytes=np.array([copy_bytes_of(a.get("op", ""), _out_bytes(a)) for a in attrs], dtype=float)
            * per_sample,
            weight_sized=np.array([phase == "bwd" and not is_matmul(a.get("op", "")) and bool(a.get("out_shapes"))
                                   and tuple(int(d) for d in a["out_shapes"][0]) in weight_shapes
                                   for a in attrs], dtype=bool),
            keep_op=op_sac_keep(names, "trainer"),
            keep_op_torchtitan=op_sac_keep(names, "torchtitan"),
            out_bytes=np.array([_out_bytes(a) for a in attrs], dtype=float) * per_sample,
            fp8_gemm=np.array([_fp8_linear_gemm(graph, a) for a in attrs], dtype=bool),
            in_act_bytes=np.maximum(np.array([a.get("bytes_read", 0) for a in attrs], dtype=float) - pbytes, 0.0)
            * per_sample,
            loss=np.array([bool(a.get("loss")) for a in attrs], dtype=bool),
            masked_attention=np.array([a.get("causal") is False for a in attrs], dtype=bool),
            gathered_per_row=np.array([gathered_per_row(a["out_shapes"][0], _out_bytes(a), a.get("bytes_read", 0))
                                       if accumulating else 0.0 for a, accumulating in zip(attrs, index_puts)],
                                      dtype=float),
            index_put_bytes=np.array([index_put_bytes(a["out_shapes"][0], _out_bytes(a), a.get("bytes_read", 0))
                                      if accumulating else 0.0 for a, accumulating in zip(attrs, index_puts)],
                                     dtype=float) * per_sample,
            graph_break=np.array([breaks_graph(n) for n in names], dtype=bool),
        )
        setattr(seg, phase, ops)
        if phase == "fwd":
            attn = [(n, a) for n, a in zip(ids, attrs) if classify_node(a) == CLASS_CODE["attention_fwd"]]
            seg.attn_kv_bytes = sum(_kv_bytes(a) for _, a in attn) * per_sample
            seg.attn_sharded = any(sharded.get(n, False) for n, _ in attn)
            _collect_collectives(graph, seg, ids, placements, per_sample)
            if ids:
                seg.input_bytes = _segment_input_bytes(graph, ids) * per_sample
    _count_params(graph, seg, name, placements, regions)
    return seg


def _kv_bytes(attrs: dict) -> float:
    """K + V bytes of a fused attention op: its tensor inputs minus the query, whose shape and dtype
    are those of the first output [B, H, S, D] (with GQA, K and V have fewer heads than Q)."""
    shapes = attrs.get("out_shapes") or []
    if not shapes:
        return 0.0
    q = math.prod(int(d) for d in shapes[0]) * _dtype_size((attrs.get("out_dtypes") or ["bfloat16"])[0])
    return max(float(attrs.get("bytes_read", 0)) - q, 0.0)
FP8_DIM_MULTIPLE = 16  # float8 GEMMs (torch._scaled_mm) need both weight dims divisible by 16 (torchtitan)


def _fp8_linear_gemm(graph: OpGraph, attrs: dict) -> bool:
    """A forward or backward GEMM (mm/addmm/matmul class) of an nn.Linear with in and out features
    multiples of FP8_DIM_MULTIPLE: the ops torchao's float8 training runs in FP8."""
    op = graph.parametric_ops.get(attrs.get("module", ""))
    if op is None or op.kind != "linear" or not is_matmul(attrs.get("op", "")):
        return False
    if "attention" in attrs.get("op", "") or "scaled_dot_product" in attrs.get("op", ""):
        return False
    return all(d is not None and d % FP8_DIM_MULTIPLE == 0 for d in (op.in_features, op.out_features))


def _keep_under_selective(attrs: dict, seq_len: int, batch: int = 1) -> bool:
    """Selective recompute (Korthikanti et al. 2022) recomputes the attention core: the ops whose
    outputs grow with seq_len^2 (scores, softmax, dropout), cheap to redo and the largest activations.
    Everything else stays saved. With fused (flash) attention nothing is quadratic: selective = none.

    Quadratic: two dims equal seq_len and at least 2 * seq_len^2 elements per traced sample (heads x
    seq x seq). The size test keeps a [batch, seq, hidden] tensor whose hidden size happens to equal
    seq_len (seq^2 elements per sample) out of the attention core; single-head attention scores are
    then kept too, which over-states its memory rather than under-stating it."""
    for shape in attrs.get("out_shapes", []):
        dims = [int(d) for d in shape]
        if seq_len > 1 and sum(1 for d in dims if d == seq_len) >= 2 and math.prod(dims) >= 2 * seq_len**2 * max(batch, 1):
            return False
    return True


def _out_bytes(attrs: dict) -> float:
    total = 0.0
    for shape, dt in zip(attrs.get("out_shapes", []), attrs.get("out_dtypes", [])):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * _dtype_size(dt)
    return total


def _dtype_size(dt: str) -> int:
    dt = str(dt)
    for key, size in (("float64", 8), ("int64", 8), ("long", 8), ("float32", 4), ("int32", 4),
                      ("bfloat16", 2), ("float16", 2), ("half", 2), ("bool", 1), ("int8", 1), ("uint8", 1),
                      ("float8", 1)):
        if key in dt:
            return size
    return 4


def _collect_collectives(graph: OpGraph, seg: Segment, ids: list[int], placements: dict[str, str],
                         per_sample: float) -> None:
    """TP: one forward collective per rowwise/vocab module output and one per distinct input tensor of
    colwise modules (backward all-reduce; forward all-gather under SP); EP: one dispatch all-to-all per
    expert group."""
    g = _digraph(graph)
    last_op_of_module: dict[str, int] = {}
    for n in ids:
        last_op_of_module[g.nodes[n].get("module", "")] = n
    col_inputs: set[int] = set()
    for module, n in sorted(last_op_of_module.items(), key=lambda kv: kv[1]):
        pl = placements.get(module)
        if pl in ("rowwise", "vocab"):
            seg.tp_collective_bytes.append(_out_bytes(g.nodes[n]) * per_sample)
    for n in ids:
        a = g.nodes[n]
        if placements.get(a.get("module", "")) == "colwise":
            for p in g.predecessors(n):
                if placements.get(g.nodes[p].get("module", "")) != "colwise":
                    col_inputs.add(p)
    seg.tp_col_input_bytes = [_first_out_bytes(g.nodes[p]) * per_sample for p in sorted(col_inputs)]
    experts = [p for p, op in graph.parametric_ops.items() if op.kind == "experts"
               and _segment_of_module(p, [seg.name]) is not None]
    for e in experts:
        ops = [n for n in ids if g.nodes[n].get("module", "").startswith(e)]
        first = ops[0] if ops else None
        if first is not None:
            # routed tokens entering the expert group: the inputs of its first op
            seg.ep_alltoall_bytes += max((_out_bytes(g.nodes[p]) for p in g.predecessors(first)), default=0.0) \
                * per_sample
            seg.num_experts = max(seg.num_experts, graph.parametric_ops[e].num_experts or 0)


def _segment_input_bytes(graph: OpGraph, ids: list[int]) -> float:
    """Bytes of the segment's input activation: the largest tensor flowing in from outside (the
    residual stream; smaller shared inputs such as rotary tables are kept once for all blocks)."""
    g = _digraph(graph)
    idset = set(ids)
    srcs = {p for n in ids for p in g.predecessors(n) if p not in idset and g.nodes[p].get("phase") == "fwd"}
    return max((_first_out_bytes(g.nodes[p]) for p in srcs), default=0.0)


def _first_out_bytes(attrs: dict) -> float:
    """Bytes of an op's first (main) output: e.g. dropout's result without its mask."""
    return _out_bytes({"out_shapes": attrs.get("out_shapes", [])[:1], "out_dtypes": attrs.get("out_dtypes", [])[:1]})


def _param_regions(graph: OpGraph) -> dict[str, str]:
    """Each parametric op's segment: its block, else 'pre' or 'post' (the region of its first forward op;
    'post' when it runs none), in one pass over the forward."""
    out = {path: op.block for path, op in graph.parametric_ops.items() if op.block}
    outside = [path for path in graph.parametric_ops if path not in out]
    for _, a in graph.nodes(phase="fwd"):
        if not outside:
            break
        module = a["module"]
        for path in [p for p in outside if module == p or module.startswith(p + ".")]:
            out[path] = a["region"]
            outside.remove(path)
    return out | {path: "post" for path in outside}


def _count_params(graph: OpGraph, seg: Segment, name: str, placements: dict[str, str],
                  regions: dict[str, str]) -> None:
    for path, op in graph.parametric_ops.items():
        if regions[path] != name:
            continue
        pl = placements.get(path)
        seg.param_tensors += len(op.shapes) - len(op.tied)
        if op.kind == "experts":
            seg.expert_params += op.param_count
        elif pl in SHARDING_PLACEMENTS:
            seg.tp_params += op.param_count
        else:
            seg.dense_params += op.param_count
