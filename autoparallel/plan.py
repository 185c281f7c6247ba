"""The Plan: every decision the planner makes, in one serializable dataclass.

Mesh convention (as torchtitan / Megatron-LM): world = pp * dp * ep * tp, mesh dims ordered
("pp", "dp", "ep", "tp") outermost to innermost, so tp ranks are neighbours (inside a node) and pp
the farthest apart. Dense (non-expert) parameters are replicated / FSDP-sharded over dp*ep ranks
(every one of them sees different data); expert parameters are sharded ep-way and replicated over dp.
The batch is split over dp*ep ranks: global_batch = dp * ep * micro_batch * num_micro_batches.

Placement values (module path -> value), applied by the trainer with DTensor:
  colwise    Linear weight sharded on out_features (ColwiseParallel); output sharded on last dim
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

from autoparallel.errors import UserError

RECOMPUTE_MODES = ("none", "selective", "full")
PLACEMENTS = ("colwise", "rowwise", "replicate", "vocab", "sequence", "expert")
SCHEDULES = ("none", "1F1B", "Interleaved1F1B")
MESH_DIMS = ("pp", "dp", "ep", "tp")


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

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.ep * self.micro_batch)

    @property
    def schedule(self) -> str:
        if self.pp == 1:
            return "none"
        return "Interleaved1F1B" if self.vpp > 1 else "1F1B"

    @property
    def mesh_shape(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "ep": self.ep, "tp": self.tp}

    def __str__(self) -> str:
        """One screen a person reads: mesh, batch split, schedule, options, stages."""
        from collections import Counter
        span = self.mesh_span()
        mesh = "  ".join(f"{d}={self.mesh_shape[d]} ({span[d]})" for d in MESH_DIMS)
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
            aligned = inner <= self.gpus_per_node and self.gpus_per_node % inner == 0
            span[dim] = "intra" if size == 1 or aligned else "inter"
        return {d: span[d] for d in MESH_DIMS}

    def validate(self, num_blocks: int | None = None) -> None:
        """Raise UserError naming the first inconsistent field."""
        for name in ("gpus", "gpus_per_node", "global_batch", "seq_len", "dp", "tp", "pp", "ep", "vpp",
                     "micro_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"plan: {name}={v!r} must be a positive integer")
        if self.dp * self.tp * self.pp * self.ep != self.gpus:
            raise UserError(f"plan: dp*tp*pp*ep = {self.dp}*{self.tp}*{self.pp}*{self.ep} = "
                            f"{self.dp * self.tp * self.pp * self.ep} does not equal gpus={self.gpus}")
        if self.global_batch % (self.dp * self.ep * self.micro_batch):
            raise UserError(f"plan: global batch {self.global_batch} is not divisible by "
                            f"dp*ep*micro_batch = {self.dp * self.ep * self.micro_batch}")
        if self.zero not in (0, 1, 2, 3):
            raise UserError(f"plan: zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.vpp > 1 and self.pp == 1:
            raise UserError("plan: vpp > 1 needs pp > 1 (interleaving splits pipeline stages)")
        if self.vpp > 1 and self.num_micro_batches % self.pp:
            raise UserError(f"plan: interleaved 1F1B needs the micro-batch count ({self.num_micro_batches}) "
                            f"to be a multiple of pp={self.pp}")
        bad = [r for r in self.recompute if r not in RECOMPUTE_MODES]
        if bad:
            raise UserError(f"plan: recompute mode {bad[0]!r} is not one of {', '.join(RECOMPUTE_MODES)}")
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

    def stage_of_block(self) -> list[int]:
        """Physical pipeline rank of each block (virtual stage v lives on rank v % pp)."""
        out: list[int] = []
        for v, n in enumerate(self.stage_layers):
            out += [v % self.pp] * n
        return out

    # ---- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["recompute"] = list(self.recompute)
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
        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            text = yaml.safe_dump({"plan": self.to_dict()}, sort_keys=False)
        else:
            text = json.dumps({"plan": self.to_dict()}, indent=2) + "\n"
        path.write_text(text)

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
        kw = {k: v for k, v in d.items() if k in names}
        kw["recompute"] = tuple(kw.get("recompute", ()))
        kw["stage_layers"] = tuple(kw.get("stage_layers", ()))
        kw["placements"] = dict(kw.get("placements", {}))
        try:
            plan = cls(**kw)
        except TypeError as e:
            raise UserError(f"{where}: {e}") from None
        plan.validate()
        return plan

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise UserError(f"plan file {path}: cannot read ({e.strerror}); pass a file written by "
                            f"`autoparallel plan --output`") from None
        try:
            data = yaml.safe_load(text)  # JSON is YAML
        except yaml.YAMLError as e:
            raise UserError(f"plan file {path}: not valid YAML/JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise UserError(f"plan file {path}: expected a mapping with a 'plan' key")
        return cls.from_dict(data, where=f"plan file {path}")


def fingerprint(named_shapes: list[tuple[str, tuple[int, ...]]]) -> str:
    """Short stable hash of a model's parameter names and shapes: ties a plan file to its model."""
    h = hashlib.sha256()
    for name, shape in sorted(named_shapes):
        h.update(f"{name}:{tuple(shape)};".encode())
    return h.hexdigest()[:16]
