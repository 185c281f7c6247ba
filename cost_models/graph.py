"""OpGraph: the operator graph the tracer produces and the cost model consumes (docs/architecture.md).

One node per aten op of one training step (forward, then backward), ids in execution order. Node
attributes (all plain Python values):

    op                      aten op name, e.g. "aten.mm.default" (a module class name when module_level)
    module                  innermost owning module path ("" for the root)
    phase                   "fwd" | "bwd"
    region                  "pre" (before the first block: embeddings), "block", "post" (final norm,
                            lm_head, loss)
    block                   path of the repeated block the op belongs to (e.g. "layers.3") or None
    out_shapes, out_dtypes  one entry per tensor output (tuples of ints; dtype names like "bfloat16")
    flops                   FLOPs of this op (torch.utils.flop_counter registry; 0 for ops it does not
                            count: elementwise, reductions, views), float
    bytes_read/written      bytes of tensor inputs read / outputs written (0 for views: no data moves)
    param_count/param_bytes parameters the op reads directly (weights of mm / embedding ops, also when
                            read through a view such as aten.t); a weight used twice counts twice
    saved_bytes             bytes of this op's outputs that autograd keeps for backward (deduplicated
                            by storage, parameters excluded)
    fwd_node                for bwd ops: the fwd node whose autograd Node this op runs in, else None
    loss                    True on the forward ops of the loss (traced after the model returned); absent
                            on every other op

Edges: tensor producer -> consumer (forward tensors saved for backward give fwd -> bwd edges).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from cost_models.compute import saved_under_op_sac

__all__ = ["PARAM_KINDS", "ExpertGroup", "OpGraph", "ParamOp", "RegionCost"]

PARAM_KINDS = ("linear", "embedding", "norm", "experts", "other")


@dataclass(frozen=True)
class ParamOp:
    """A module that owns parameters directly: the unit tensor/expert parallelism shards.

    `shapes` maps the module's own parameter names ("weight", "w1", ...) to their shapes.
    `tied` maps a parameter name to the path of the module that owns it first when the same
    Parameter is shared (lm_head.weight tied to tok_embeddings.weight); such parameters are not
    counted again in `param_count`.
    """

    path: str
    kind: str                          # linear | embedding | norm | experts | other
    module_class: str
    param_count: int                   # own parameters, tied ones excluded
    param_bytes: int
    shapes: dict[str, tuple[int, ...]]
    in_features: int | None = None     # linear: in_features; embedding: num_embeddings; experts: h
    out_features: int | None = None    # linear: out_features; embedding: embedding_dim; experts: h
    num_experts: int | None = None     # experts only
    block: str | None = None           # the repeated block containing it, None for pre/post parts
    tied: dict[str, str] = field(default_factory=dict)
    # a fused projection whose parent's forward cuts its output into these pieces (q, k, v; gate, up),
    # each of whole `fused_unit`s, and which the trainer shards piece by piece; () for any other module
    fused_pieces: tuple[int, ...] = ()
    fused_unit: int = 1
    # ran without autograd in the traced step (DeepSeek V3.2's and dots3's top-k indexer, a @torch.no_grad
    # forward): its parameters get no gradient, and tensor parallelism keeps its module whole (facts.no_grad_modules)
    no_grad: bool = False
    # what the trainer's tensor-parallel rules read of the module (hf.projection_heads, is_norm_like,
    # normalized_width; the planner applies the same rules, CostModel._runnable / sp_refusal): the heads a column
    # split of this projection of an attention cuts, None outside one; a norm-like leaf (one vector's length of
    # parameters, whatever its class); a norm's declared width
    heads: int | None = None
    norm_like: bool = False
    normalized: int | None = None


@dataclass(frozen=True)
class ExpertGroup:
    """Routed experts of one MoE layer: a module owning stacked [E, ...] expert weights (torchtitan's
    GroupedExperts) or a ModuleList of per-expert modules (Hugging Face style)."""

    path: str
    block: str | None
    num_experts: int
    param_count: int
    router: str | None = None          # Linear h -> E that scores the experts
    shared_experts: tuple[str, ...] = ()
    top_k: int | None = None


@dataclass(frozen=True)
class RegionCost:
    """Totals over the nodes of one region ("pre", a block path, or "post")."""

    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    fwd_bytes: int = 0                 # bytes read + written by forward ops
    bwd_bytes: int = 0
    saved_bytes: int = 0
    fwd_ops: int = 0
    bwd_ops: int = 0


# Inductor splits a reduction over the leading (token) dimensions into two kernels, partial sums over blocks of
# rows and then their sum, when it has too few outputs to fill the GPU: fewer than 64 per multiprocessor (132 on
# an H100 or H200) and more than 4 x 32 elements reduced into each (torch/_inductor/ir.py Reduction.num_splits,
# choices.reduction_split_factor). That is every norm weight's and linear bias's gradient at a real micro-batch:
# a 350M GPT block's compiled backward launched 24 kernels at 32 tokens a micro-batch and 35 at 512 (s78, cuBLAS's
# split-K reduce kernels aside), one more for each of its ten bias and LayerNorm parameter gradients
SPLIT_MAX_OUTPUTS = 64 * 132
SPLIT_MIN_REDUCED = 4 * 32


@dataclass(frozen=True)
class Launches:
    """The kernels one phase of a compiled block launches: `fixed`, those of its library kernels (GEMM,
    attention), barriers and fused groups (one per reduction shape, one for a group without reductions), and
    `outer`, (outputs, elements reduced into each per traced sample) of each reduction over the leading
    dimensions: one more kernel where Inductor splits it (`at`)."""
    fixed: int
    outer: tuple[tuple[int, float], ...] = ()

    def per_sample(self, batch: float) -> Launches:
        """The same with `outer`'s reduced elements per sample of a trace at `batch` samples."""
        return Launches(self.fixed, tuple((n, r / max(batch, 1.0)) for n, r in self.outer))

    def at(self, samples: float) -> int:
        """Kernels launched by one call on `samples` samples (`outer` per sample, as `per_sample` leaves it)."""
        return self.fixed + sum(1 for n, r in self.outer if n < SPLIT_MAX_OUTPUTS and r * samples > SPLIT_MIN_REDUCED)


@dataclass
class OpGraph:
    """The traced operator graph plus graph-level annotations.

    `g` is the networkx.DiGraph (node attributes in the module docstring). `blocks` are the module
    paths of the repeated blocks in execution order (pipeline cut points); `block_class[path]` is an
    int shared by blocks with identical structure, parameter shapes and traced op sequence;
    `param_op_edges` are (producer, consumer) parametric-op paths connected by an activation that
    passes only through non-parametric ops (across a block boundary only the previous region's
    producers are kept, so the residual stream does not link every block to all earlier ones).
    """

    g: nx.DiGraph
    model_name: str
    batch: int
    seq_len: int
    dtype: str
    parameters: int
    param_bytes: int
    blocks: list[str] = field(default_factory=list)
    block_class: dict[str, int] = field(default_factory=dict)
    parametric_ops: dict[str, ParamOp] = field(default_factory=dict)
    param_op_edges: list[tuple[str, str]] = field(default_factory=list)
    expert_groups: dict[str, ExpertGroup] = field(default_factory=dict)
    module_level: bool = False
    warnings: list[str] = field(default_factory=list)
    spec: Any = None                   # the ModelSpec when traced from one (head counts, vocab, ...)
    fingerprint: str = ""              # autoparallel.plan.fingerprint of the parameter names and shapes
    # block class id -> bytes per sample that the torch.compile'd block keeps for its backward (AOTAutograd's
    # default partitioner, autoparallel.compiled_saved); a class without an entry is priced as eager
    compiled_saved: dict[int, float] = field(default_factory=dict)
    # block class id -> (forward, backward) bytes per sample that the compiled block's fused memory-bound
    # kernels move (autoparallel.compiled_saved.fused_bytes); a class without an entry: compiled_memory_fraction
    compiled_fused: dict[int, tuple[float, float]] = field(default_factory=dict)
    # block class id -> (forward, backward) kernels the compiled block launches, split reductions' elements per
    # sample (autoparallel.compiled_saved.launches); a class without an entry: no per-launch host work
    compiled_launches: dict[int, tuple[Launches, Launches]] = field(default_factory=dict)
    # blocks whose attention has no `recompute_core` switch (a Hugging Face or user block): there
    # AutoParallelTrainer runs "selective" as per-op checkpointing (trainer/recompute.py), and so does the
    # cost model (CostModel.runtime_recompute); elsewhere selective recomputes the seq x seq attention core
    selective_as_op: list[str] = field(default_factory=list)
    # (query heads, key/value heads) from a Hugging Face model's config, (0, 0) otherwise: without a spec the
    # graph shows only query heads (the fused attention outputs), and nothing in an eager attention
    config_heads: tuple[int, int] = (0, 0)
    # why the blocks cannot be cut into pipeline stages, "" where they can: a Hugging Face model whose blocks take
    # more from earlier ones than the hidden states (autoparallel.hf.HFParts.no_pipeline); the planner keeps pp=1
    no_pipeline: str = ""

    def op_sac_mutated(self) -> list[tuple[str, str]]:
        """(op, module) of forward ops in blocks whose outputs per-op selective checkpointing caches and the block
        then changes in place (transformers' grouped experts add their bias into the grouped GEMM's output):
        torch's selective checkpointing refuses such a cache entry at the backward (its version changed)."""
        return [(a["op"], a["module"]) for _, a in self.nodes("fwd") if a.get("mutated_in_place")
                and a["block"] is not None and saved_under_op_sac(a["op"])]

    @property
    def has_tied_parameters(self) -> bool:
        """Whether some Parameter is shared between modules (a head tied to the embedding)."""
        return any(op.tied for op in self.parametric_ops.values())

    # ------------------------------------------------------------------ node access

    def nodes(self, phase: str | None = None, region: str | None = None,
              block: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """(node id, attributes) in execution order, filtered by phase / region / block path."""
        for n, a in self.g.nodes(data=True):
            if phase is not None and a["phase"] != phase:
                continue
            if region is not None and a["region"] != region:
                continue
            if block is not None and a["block"] != block:
                continue
            yield n, a

    def region_costs(self) -> dict[str, RegionCost]:
        """Totals per region: "pre", each block path (in order), "post"."""
        acc: dict[str, dict[str, float]] = {"pre": Counter()}
        for b in self.blocks:
            acc[b] = Counter()
        acc["post"] = Counter()
        for _, a in self.g.nodes(data=True):
            key = a["block"] if a["block"] is not None else a["region"]
            c = acc.setdefault(key, Counter())
            ph = a["phase"]
            c[f"{ph}_flops"] += a["flops"]
            c[f"{ph}_bytes"] += a["bytes_read"] + a["bytes_written"]
            c[f"{ph}_ops"] += 1
            c["saved_bytes"] += a["saved_bytes"]
        return {
            k: RegionCost(fwd_flops=float(c["fwd_flops"]), bwd_flops=float(c["bwd_flops"]),
                          fwd_bytes=int(c["fwd_bytes"]), bwd_bytes=int(c["bwd_bytes"]),
                          saved_bytes=int(c["saved_bytes"]), fwd_ops=int(c["fwd_ops"]),
                          bwd_ops=int(c["bwd_ops"]))
            for k, c in acc.items()
        }

    # ------------------------------------------------------------------ totals
    @property
    def forward_flops(self) -> float:
        """FLOPs of the forward pass (loss included) for the traced batch and seq_len."""
        return float(sum(a["flops"] for _, a in self.g.nodes(data=True) if a["phase"] == "fwd"))

    @property
    def backward_flops(self) -> float:
        return float(sum(a["flops"] for _, a in self.g.nodes(data=True) if a["phase"] == "bwd"))

    @property
    def activation_bytes_per_block(self) -> dict[str, int]:
        """Bytes saved for backward by each block's forward ops (block path -> bytes)."""
        out = dict.fromkeys(self.blocks, 0)
        for _, a in self.g.nodes(data=True):
            if a["block"] is not None and a["saved_bytes"]:
                out[a["block"]] = out.get(a["block"], 0) + a["saved_bytes"]
        return out

    @property
    def saved_bytes_total(self) -> int:
        return int(sum(a["saved_bytes"] for _, a in self.g.nodes(data=True)))

    def summary(self) -> dict[str, Any]:
        """The `autoparallel trace --json` payload. `activation_bytes_per_block` is the largest
        block's saved bytes (blocks of one class are equal); the per-block map is
        `activation_bytes_by_block`."""
        per_block = self.activation_bytes_per_block
        costs = self.region_costs()
        return {
            "model": self.model_name,
            "batch": self.batch,
            "seq_len": self.seq_len,
            "dtype": self.dtype,
            "parameters": int(self.parameters),
            "param_bytes": int(self.param_bytes),
            "forward_flops": self.forward_flops,
            "backward_flops": self.backward_flops,
            "num_blocks": len(self.blocks),
            "block_classes": len(set(self.block_class.values())),
            "activation_bytes_per_block": max(per_block.values(), default=0),
            "activation_bytes_by_block": per_block,
            "activation_bytes_pre": costs["pre"].saved_bytes,
            "activation_bytes_post": costs["post"].saved_bytes,
            "num_ops": self.g.number_of_nodes(),
            "module_level": self.module_level,
            "warnings": list(self.warnings),
        }

    def top_ops(self, n: int = 8) -> list[tuple[str, float, int]]:
        """The ops with the most FLOPs over the step: (op, flops, count)."""
        flops: Counter[str] = Counter()
        count: Counter[str] = Counter()
        for _, a in self.g.nodes(data=True):
            flops[a["op"]] += a["flops"]
            count[a["op"]] += 1
        ranked = sorted(flops, key=lambda k: (-flops[k], -count[k], k))
        return [(k, float(flops[k]), count[k]) for k in ranked[:n]]

    def format_table(self) -> str:
        """Readable report: parameters, FLOPs, blocks, activation bytes per block, top ops."""
        s = self.summary()
        total = s["forward_flops"] + s["backward_flops"]
        classes = Counter(self.block_class.values())
        rows = [
            ("model", s["model"]),
            ("batch x seq_len", f"{self.batch} x {self.seq_len} ({self.dtype})"),
            ("parameters", f"{s['parameters']:,} ({_human(s['parameters'])}, {_human_bytes(s['param_bytes'])})"),
            ("forward FLOPs", f"{s['forward_flops']:.4g} ({_human(s['forward_flops'])}FLOP)"),
            ("backward FLOPs", f"{s['backward_flops']:.4g} ({_human(s['backward_flops'])}FLOP)"),
            ("step FLOPs", f"{total:.4g}"),
            ("blocks detected", _blocks_text(self.blocks, classes)),
            ("activation bytes / block", _human_bytes(s["activation_bytes_per_block"])),
            ("activation bytes pre/post", f"{_human_bytes(s['activation_bytes_pre'])} / "
                                          f"{_human_bytes(s['activation_bytes_post'])}"),
            ("ops traced", f"{s['num_ops']:,}" + (" (module level)" if self.module_level else "")),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        top = self.top_ops()
        if top and total > 0:
            lines.append("")
            lines.append(f"{'top ops by FLOPs':<40} {'FLOPs':>12} {'share':>7} {'count':>7}")
            for op, f, c in top:
                if f <= 0:
                    break
                lines.append(f"{op:<40} {f:>12.4g} {100 * f / total:>6.1f}% {c:>7}")
        for w in self.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


def no_pipeline_clause(model: str, reason: str) -> str:
    """What every refusal of pipeline stages for such a model says (the planner's pin, `estimate --pp`, a plan file,
    the trainer), each before its own way out; `reason`: OpGraph.no_pipeline (HFParts.no_pipeline)."""
    return f"{model}'s blocks cannot be cut into pipeline stages ({reason}, which the trainer's stages do not pass on)"


def _blocks_text(blocks: list[str], classes: Counter[int]) -> str:
    if not blocks:
        return "none"
    prefix = blocks[0].rsplit(".", 1)[0] if "." in blocks[0] else blocks[0]
    cls = ", ".join(f"class {k}: {v}" for k, v in sorted(classes.items()))
    return f"{len(blocks)} x {prefix}.* ({cls})"


def _human(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def _human_bytes(x: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{int(x)} B"
