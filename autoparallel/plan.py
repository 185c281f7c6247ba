"""The Plan: every decision the planner makes, in one serializable dataclass.

Mesh convention (as torchtitan / Megatron-LM): world = pp * dp * cp * ep * tp, mesh dims ordered
("pp", "dp", "cp", "ep", "tp") outermost to innermost, so tp ranks are neighbours (inside a node) and pp
the farthest apart. Dense (non-expert) parameters are replicated / FSDP-sharded over dp*cp*ep ranks
(every one of them sees different tokens: torchtitan's dp_shard_cp); expert parameters are sharded
ep-way and replicated over dp*cp. The batch rows are split over dp*ep ranks: global_batch = dp * ep *
micro_batch * num_micro_batches; context parallelism (cp) splits each sequence over cp ranks (ring
attention, causal load balancing: each rank holds chunks i and 2cp-1-i of 2cp, so seq_len divides 2*cp).

Placement values (module path -> value), applied by the trainer with DTensor:
  colwise    Linear weight sharded on out_features (ColwiseParallel); output sharded on last dim. A fused
             projection (q/k/v, gate/up; ParamOp.fused_pieces) is sharded piece by piece: each rank
             holds its slice of every piece. A Conv1D (weight [in, out]) shards its weight's dim 1
  rowwise    Linear weight sharded on in_features (RowwiseParallel); output partial -> reduced
  replicate  parameters replicated over tp
  vocab      Embedding sharded on num_embeddings (RowwiseParallel on an Embedding)
  sequence   norm replicated, activations sharded on the sequence dim (SequenceParallel)
  expert     expert group sharded over ep on the expert dim
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoparallel.errors import UserError, did_you_mean
from autoparallel.limits import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_SEQ_LEN,
    check_reference,
    load_document,
    write_text,
)

RECOMPUTE_MODES = ("none", "selective", "op", "full")  # the order of increasing recompute
PLACEMENTS = ("colwise", "rowwise", "replicate", "vocab", "sequence", "expert")
SCHEDULES = ("none", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble")
# Plan.pipeline_schedule: "" = the default by vpp (Schedule1F1B, or ScheduleInterleaved1F1B at vpp > 1);
# "zero_bubble" = torch's ScheduleInterleavedZeroBubble (ZB-H1 of Qi et al. 2024, any vpp; eager only)
PIPELINE_SCHEDULES = ("", "zero_bubble")
MESH_DIMS = ("pp", "dp", "cp", "ep", "tp")
TP_SHARDED = ("colwise", "rowwise", "vocab")  # placements that split a module over the tp ranks
DTYPES = ("bf16", "fp16", "fp32")
# gradient reduction adds int8: block-wise scaled int8 on the wire, fp32 accumulation (ZeRO++'s qgZ;
# autoparallel.trainer.low_precision, cost_models.comm.GRAD_WIRE_BYTES)
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16", "int8")
# FP8 linears per block (torchao float8 training): none, tensorwise or rowwise scaling
FP8_RECIPES = ("none", "tensorwise", "rowwise")


# keys Plan.to_dict writes beside the fields, derived from them (from_dict reads past them)
DERIVED_KEYS = ("num_micro_batches", "schedule", "mesh_span")


@dataclass(frozen=True)
class Plan:
    model: str
    hardware: str
    gpus: int
    gpus_per_node: int
    global_batch: int
    seq_len: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int = 1
    cp: int = 1                           # context parallel: each sequence split over cp ranks (ring attention)
    micro_batch: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    recompute: tuple[str, ...] = ()       # one entry per block (transformer layer)
    stage_layers: tuple[int, ...] = ()    # blocks per virtual stage, len = pp * vpp
    grad_reduce_dtype: str = "fp32"
    param_dtype: str = "bf16"
    placements: dict[str, str] = field(default_factory=dict)
    model_fingerprint: str = ""           # hash of parameter names and shapes (see fingerprint())
    compile: bool = False                 # torch.compile per block (the trainer's compile=True)
    fp8: tuple[str, ...] = ()             # FP8 recipe per block (FP8_RECIPES); () = none anywhere
    pipeline_schedule: str = ""           # PIPELINE_SCHEDULES; "" = 1F1B / interleaved 1F1B by vpp
    # async TP: compiled blocks overlap each sequence-parallel all-gather / reduce-scatter with its
    # matmul (inductor's micro-pipeline TP over symmetric memory); tp > 1, sequence_parallel, compile
    async_tp: bool = False

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.ep * self.micro_batch)

    @property
    def dense_dp(self) -> int:
        """Ranks over which dense parameters are replicated / sharded and their gradients reduced: every
        rank that sees different tokens (dp * cp * ep)."""
        return self.dp * self.cp * self.ep

    @property
    def experts_apart(self) -> bool:
        """Whether the trainer wraps each expert group as an FSDP unit of its own (on the expert mesh under
        ep > 1, on the dense one with several data-parallel ranks, whose collectives then start as soon as the
        experts are done); on one rank the experts stay in their block's unit, one compiled graph
        (trainer._setup; CostModel.fsdp_units counts the units)."""
        return self.ep > 1 or self.dense_dp > 1

    @property
    def expert_dp(self) -> int:
        """Ranks over which an ep-sharded expert group is replicated (dp * cp)."""
        return self.dp * self.cp

    @property
    def schedule(self) -> str:
        if self.pp == 1:
            return "none"
        if self.pipeline_schedule == "zero_bubble":
            return "InterleavedZeroBubble"
        return "Interleaved1F1B" if self.vpp > 1 else "1F1B"

    @property
    def mesh_shape(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep, "tp": self.tp}

    def __str__(self) -> str:
        """One screen a person reads: mesh, batch split, schedule, options, stages."""
        from collections import Counter
        span = self.mesh_span()
        # cp shows only when used: plans without context parallelism read as before
        mesh = "  ".join(f"{d}={self.mesh_shape[d]} ({span[d]})" for d in MESH_DIMS if d != "cp" or self.cp > 1)
        rec = ", ".join(f"{k} x{v}" for k, v in sorted(Counter(self.recompute).items())) or "none"
        lines = [f"Plan for {self.model} on {self.gpus} x {self.hardware} ({self.gpus_per_node} per node)",
                 f"  mesh        {mesh}",
                 f"  batch       global {self.global_batch} x seq {self.seq_len}; micro-batch {self.micro_batch} x "
                 f"{self.num_micro_batches} per data-parallel rank; schedule {self.schedule}"
                 + (f" (vpp={self.vpp})" if self.vpp > 1 else ""),
                 f"  options     ZeRO-{self.zero}, sequence parallel {'on' if self.sequence_parallel else 'off'}, "
                 f"params {self.param_dtype}, grad reduction {self.grad_reduce_dtype}, "
                 f"{'torch.compile per block' if self.compile else 'eager'}",
                 f"  recompute   {rec}"]
        if any(r != "none" for r in self.fp8):
            lines.append("  fp8         " + ", ".join(f"{k} x{v}" for k, v in sorted(Counter(self.fp8).items())))
        if self.stage_layers:
            lines.append(f"  stages      blocks per virtual stage: {' '.join(map(str, self.stage_layers))}")
        if self.placements:
            counts = Counter(self.placements.values())
            lines.append("  placements  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return "\n".join(lines)

    def mesh_span(self) -> dict[str, str]:
        """Where each mesh dim lies: 'intra' when all its ranks share a node, else 'inter'.

        A dim's groups cover blocks of (its size x all inner dims' sizes) consecutive ranks; they stay
        inside nodes only when such a block fits a node and nodes split into whole blocks (tp=6 on
        8-GPU nodes puts ranks 6..11 in one group, across two nodes).
        """
        span, inner = {}, 1
        for dim in reversed(MESH_DIMS):
            size = self.mesh_shape[dim]
            inner *= size
            # (on a single node, partly filled, every group is inside it: 6 GPUs of an 8-GPU node)
            aligned = inner <= self.gpus_per_node and (self.gpus_per_node % inner == 0 or self.gpus <= self.gpus_per_node)
            span[dim] = "intra" if size == 1 or aligned else "inter"
        return {d: span[d] for d in MESH_DIMS}

    def ranks_per_node(self, dims: tuple[str, ...]) -> int:
        """How many ranks of one process group over the mesh dims `dims` share a node.

        Ranks are laid out with the last of MESH_DIMS fastest (rank = sum of coordinate x stride); the group
        of rank 0 varies the coordinates of `dims` and holds the others at 0, and node 0 holds the ranks
        below gpus_per_node. Only coordinates whose stride lands inside node 0 are enumerated."""
        import itertools
        stride, strides = 1, {}
        for dim in reversed(MESH_DIMS):
            strides[dim] = stride
            stride *= self.mesh_shape[dim]
        ranges = [range(min(self.mesh_shape[d], -(-self.gpus_per_node // strides[d]))) for d in dims]
        return sum(1 for coords in itertools.product(*ranges)
                   if sum(c * strides[d] for c, d in zip(coords, dims)) < self.gpus_per_node) or 1

    def validate(self, num_blocks: int | None = None) -> None:
        """Raise UserError naming the first inconsistent field (a self-consistent plan, which the cost
        model can estimate; `check_runnable` adds what the trainer needs to run it)."""
        self._validate_types()
        if self.dp * self.tp * self.pp * self.ep * self.cp != self.gpus:
            cp = f"*{self.cp}" if self.cp > 1 else ""
            raise UserError(f"plan: dp*tp*pp*ep{'*cp' if cp else ''} = {self.dp}*{self.tp}*{self.pp}*{self.ep}{cp} = "
                            f"{self.dp * self.tp * self.pp * self.ep * self.cp} does not equal gpus={self.gpus}")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise UserError(f"plan: seq_len {self.seq_len} is not divisible by 2*cp = {2 * self.cp}; causal load "
                            f"balancing gives each of the cp ranks two of 2*cp equal chunks (pick cp so that "
                            f"2*cp divides seq_len)")
        if self.global_batch % (self.dp * self.ep * self.micro_batch):
            raise UserError(f"plan: global batch {self.global_batch} is not divisible by "
                            f"dp*ep*micro_batch = {self.dp * self.ep * self.micro_batch}")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise UserError(f"plan: zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.vpp > 1 and self.pp == 1:
            raise UserError("plan: vpp > 1 needs pp > 1 (interleaving splits pipeline stages)")
        if self.pipeline_schedule == "zero_bubble" and self.pp == 1:
            raise UserError("plan: pipeline_schedule=zero_bubble needs pp > 1 (it schedules pipeline stages); "
                            "drop it or raise pp")
        if self.pipeline_schedule == "zero_bubble" and self.compile is True:
            # a plan no runtime has: not estimated either (the cost model would price compiled stages)
            raise UserError("plan: pipeline_schedule=zero_bubble runs eager stages only (torch's zero-bubble "
                            "schedules refuse torch.compile'd modules); set compile to false or drop the schedule")
        if self.vpp > 1 and self.num_micro_batches % self.pp:
            raise UserError(f"plan: interleaved 1F1B needs the micro-batch count ({self.num_micro_batches}) "
                            f"to be a multiple of pp={self.pp}")
        bad = [r for r in self.recompute if r not in RECOMPUTE_MODES]
        if bad:
            raise UserError(f"plan: recompute mode {bad[0]!r} is not one of {', '.join(RECOMPUTE_MODES)}")
        bad = [r for r in self.fp8 if r not in FP8_RECIPES]
        if bad:
            raise UserError(f"plan: fp8 recipe {bad[0]!r} is not one of {', '.join(FP8_RECIPES)}")
        bad = [p for p in self.placements.values() if p not in PLACEMENTS]
        if bad:
            raise UserError(f"plan: placement {bad[0]!r} is not one of {', '.join(PLACEMENTS)}")
        if self.stage_layers and len(self.stage_layers) != self.pp * self.vpp:
            raise UserError(f"plan: stage_layers has {len(self.stage_layers)} entries, expected pp*vpp = "
                            f"{self.pp * self.vpp}")
        if num_blocks is not None:
            if self.stage_layers and sum(self.stage_layers) != num_blocks:
                raise UserError(f"plan: stage_layers sum to {sum(self.stage_layers)} but the model has "
                                f"{num_blocks} blocks")
            if self.recompute and len(self.recompute) != num_blocks:
                raise UserError(f"plan: recompute has {len(self.recompute)} entries but the model has "
                                f"{num_blocks} blocks")
            if self.fp8 and len(self.fp8) != num_blocks:
                raise UserError(f"plan: fp8 has {len(self.fp8)} entries but the model has {num_blocks} blocks")
        self._validate_async_tp()

    def _validate_async_tp(self) -> None:
        """async_tp rewrites the compiled graphs' sequence-parallel collectives around their matmuls:
        without tp, sequence parallelism or compiled blocks it has nothing to rewrite."""
        if not self.async_tp:
            return
        missing = [what for what, ok in (("tp > 1", self.tp > 1), ("sequence_parallel: true", self.sequence_parallel),
                                         ("compile: true", self.compile)) if not ok]
        if missing:
            raise UserError(f"plan: async_tp needs {', '.join(missing)} (it overlaps the compiled blocks' "
                            f"sequence-parallel collectives with their matmuls); set those or async_tp: false")

    def check_runnable(self, num_blocks: int | None = None) -> None:
        """validate() plus what the trainer needs beyond a consistent plan (the planner checks every plan
        it emits with this, so the trainer accepts them): a pipeline gets at least pp micro-batches
        (1F1B), and tp > 1 says how modules are placed (a plan whose placements replicate everything runs,
        every tp rank computing the same; the planner emits none unless tp is pinned and nothing splits)."""
        self.validate(num_blocks)
        if self.pp > 1 and self.num_micro_batches < self.pp:
            raise UserError(f"plan: {self.num_micro_batches} micro-batches cannot fill a {self.pp}-stage pipeline; "
                            f"1F1B needs at least pp micro-batches (lower micro_batch or raise global_batch)")
        if self.pipeline_schedule == "zero_bubble":
            self._check_zero_bubble_runnable()
        if self.tp > 1 and not self.placements:
            raise UserError(f"plan: tp={self.tp} but no module is placed colwise, rowwise or vocab, so nothing "
                            f"would be split over the tp ranks; add placements or use tp=1")
        if self.cp > 1 and self.sequence_parallel and self.tp > 1 and (self.seq_len // self.cp) % self.tp:
            raise UserError(f"plan: each cp rank's {self.seq_len // self.cp} tokens must divide tp={self.tp} for "
                            f"sequence parallelism; drop sequence_parallel or pick cp/tp that divide seq_len")
        if self.grad_reduce_dtype == "int8" and self.zero == 0 and self.dense_dp > 1:
            # the int8 reduction runs through FSDP2's reduce-scatter hook (set_custom_reduce_scatter);
            # replicate (ZeRO-0) all-reduces with a plain dist.all_reduce that has no such hook
            raise UserError("plan: grad_reduce_dtype=int8 needs zero >= 1 (the trainer quantizes inside FSDP2's "
                            "reduce-scatter; ZeRO-0's all-reduce has no hook); use zero=1 or another dtype")

    def _check_zero_bubble_runnable(self) -> None:
        """What torch's ScheduleInterleavedZeroBubble needs beyond 1F1B, refused before torch raises (eager
        stages, which validate() checks: the cost model would not price a compiled one either): no ZeRO-3
        and a micro-batch count that is a multiple of its rounds, max(1, m // pp)."""
        if self.zero == 3:
            # torch 2.13's input-gradient action lists the stage's parameters while FSDP2 holds them
            # resharded, so the weight-gradient action finds none of the unsharded ones the graph used and
            # the gradients never arrive (measured: the tied head got no gradient under pp2 x dp2)
            raise UserError("plan: pipeline_schedule=zero_bubble does not run with zero=3 (torch's weight-gradient "
                            "step misses parameters FSDP2 resharded after forward); use zero 0-2 or drop the schedule")
        rounds = max(1, self.num_micro_batches // self.pp)
        if self.num_micro_batches % rounds:
            raise UserError(f"plan: pipeline_schedule=zero_bubble needs the micro-batch count "
                            f"({self.num_micro_batches}) to be a multiple of its rounds max(1, m // pp) = {rounds}; "
                            f"pick a micro-batch count that is a multiple of pp={self.pp}")

    def _validate_types(self) -> None:
        """Every field has its type and range (a hand-edited file may hold anything YAML can say)."""
        for name in ("model", "hardware", "model_fingerprint"):
            if not isinstance(getattr(self, name), str):
                raise UserError(f"plan: {name}={getattr(self, name)!r} must be a string")
        for name, hi in (("gpus", MAX_GPUS), ("gpus_per_node", MAX_GPUS), ("global_batch", MAX_GLOBAL_BATCH),
                         ("seq_len", MAX_SEQ_LEN), ("dp", MAX_GPUS), ("tp", MAX_GPUS), ("pp", MAX_GPUS),
                         ("ep", MAX_GPUS), ("vpp", MAX_GPUS), ("cp", MAX_GPUS), ("micro_batch", MAX_GLOBAL_BATCH)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise UserError(f"plan: {name}={v!r} must be an integer in 1..{hi:,}")
        for name in ("sequence_parallel", "async_tp", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"plan: {name}={getattr(self, name)!r} must be true or false")
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise UserError(f"plan: pipeline_schedule={self.pipeline_schedule!r} must be \"\" (1F1B, interleaved "
                            f"by vpp) or one of {', '.join(s for s in PIPELINE_SCHEDULES if s)}")
        for name, allowed in (("grad_reduce_dtype", GRAD_REDUCE_DTYPES), ("param_dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise UserError(f"plan: {name}={getattr(self, name)!r} must be one of {', '.join(allowed)}")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.stage_layers):
            raise UserError(f"plan: stage_layers={list(self.stage_layers)!r} must be positive integers (blocks "
                            f"per virtual stage)")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.placements.items()):
            raise UserError("plan: placements must map module paths to placement names (strings)")

    def stage_of_block(self) -> list[int]:
        """Physical pipeline rank of each block (virtual stage v lives on rank v % pp)."""
        out: list[int] = []
        for v, n in enumerate(self.stage_layers):
            out += [v % self.pp] * n
        return out

    # ---- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:  # the fields, and DERIVED_KEYS
        d = dataclasses.asdict(self)
        d["recompute"] = list(self.recompute)
        d["fp8"] = list(self.fp8)
        if not self.fp8:
            del d["fp8"]  # plans without FP8 keep the files they always had
        if not self.pipeline_schedule:
            del d["pipeline_schedule"]  # so do plans on the default schedule
        if not self.async_tp:
            del d["async_tp"]  # likewise plans without async TP
        d["stage_layers"] = list(self.stage_layers)
        d["placements"] = dict(sorted(self.placements.items()))
        d["num_micro_batches"] = self.num_micro_batches
        d["schedule"] = self.schedule
        d["mesh_span"] = self.mesh_span()
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    def save(self, path: str | Path) -> None:
        """YAML for .yaml/.yml paths, JSON otherwise; same inputs give byte-identical files."""
        path = Path(path).expanduser()  # as check_output_path read it (`--output ~/plan.yaml`)
        if path.suffix in (".yaml", ".yml"):
            text = yaml.safe_dump({"plan": self.to_dict()}, sort_keys=False)
        else:
            text = json.dumps({"plan": self.to_dict()}, indent=2) + "\n"
        write_text(path, text, "plan file")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "plan") -> Plan:
        if "plan" in d and isinstance(d["plan"], dict):
            d = d["plan"]
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [n for n in ("model", "hardware", "gpus", "gpus_per_node", "global_batch", "seq_len")
                   if n not in d]
        if missing:
            raise UserError(f"{where}: missing field {missing[0]!r}; write plan files with `autoparallel plan "
                            f"--output FILE`")
        # what to_dict derives from the fields (read back, not set); any other key is a typo whose field would
        # silently keep its default (`micro_bach: 4` planned micro-batches of 1)
        unknown = sorted(str(k) for k in d if k not in names and k not in DERIVED_KEYS)
        if unknown:
            raise UserError(f"{where}: unknown field {unknown[0]!r}{did_you_mean(unknown[0], names)}; write plan "
                            f"files with `autoparallel plan --output FILE`")
        kw = {k: v for k, v in d.items() if k in names}
        for key, kind in (("recompute", list), ("stage_layers", list), ("fp8", list), ("placements", dict)):
            value = kw.get(key, kind())
            if not isinstance(value, kind):
                raise UserError(f"{where}: {key} must be a {'list' if kind is list else 'mapping'}, got "
                                f"{value!r}; write plan files with `autoparallel plan --output FILE`")
            kw[key] = tuple(value) if kind is list else dict(value)
        try:
            plan = cls(**kw)
            plan.validate()
        except UserError as e:
            raise UserError(f"{where}: {str(e).removeprefix('plan: ')}") from None
        return plan

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        check_reference(str(path), "plan file")
        path = Path(path)
        data = load_document(path, "plan file")  # JSON is YAML: .json files parse either way
        if not isinstance(data, dict):
            raise UserError(f"plan file {path}: expected a mapping with a 'plan' key; pass a file written by "
                            f"`autoparallel plan --output`")
        return cls.from_dict(data, where=f"plan file {path}")


def fingerprint(named_shapes: list[tuple[str, tuple[int, ...]]]) -> str:
    """Short stable hash of a model's parameter names and shapes: ties a plan file to its model."""
    h = hashlib.sha256()
    for name, shape in sorted(named_shapes):
        h.update(f"{name}:{tuple(shape)};".encode())
    return h.hexdigest()[:16]
