"""The ILP planner: the fastest plan under the cost model with every pipeline stage within memory.

Search = an outer loop over mesh configurations (tp, pp, dp, ep, vpp, micro-batch, ZeRO stage,
sequence parallelism, gradient-reduction dtype), visited in order of a lower bound on step time and
pruned once the bound reaches the best plan found, and for each surviving configuration one CP-SAT
model whose decision variables are the pipeline partition (stage boundaries over the block list,
uneven allowed) and the recompute mode of every block, with a bottleneck-stage time variable and a
memory constraint per pipeline rank (see `StageModel`). Identical blocks share their costs: the model
counts blocks of each class per stage and their recompute modes per rank, so depth does not blow it up.
Uniform blocks (one class) take a per-rank MIP instead (CBC, `solve_uniform`).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from autoparallel.errors import UserError
from autoparallel.graph import OpGraph
from autoparallel.limits import MAX_GLOBAL_BATCH, MAX_GPUS, check_int
from autoparallel.placements import megatron_placements
from autoparallel.plan import RECOMPUTE_MODES, TP_SHARDED, Plan
from autoparallel.sharding import cost_model as sharding_cost_model
from autoparallel.units import format_bytes
from cost_models.comm import Link, dp_overlap_cost, dp_overlap_pieces
from cost_models.estimate import (
    ALLOCATOR_RESERVE,
    DTYPE_BYTES,
    CostModel,
    Estimate,
    dp_sync_time,
    in_flight_micro_batches,
)
from cost_models.graph import no_pipeline_clause
from hardware_profiles import Cluster

RESOLUTION = 1e7  # CP-SAT works in integers: times and bytes in units of 1e-7 of their scale
PIN_KEYS = ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch", "zero", "sequence_parallel", "recompute",
            "grad_reduce_dtype", "compile", "schedule")
PIN_ALIASES = {"mb": "micro_batch", "sp": "sequence_parallel", "micro-batch": "micro_batch",
               "sequence-parallel": "sequence_parallel", "grad-reduce-dtype": "grad_reduce_dtype"}
MAX_MICRO_BATCH = 64
PARTIAL_MODES = ("selective", "op")   # recompute modes between none and full (StageModel.all_device_options)
CLOSEST_MISSES = 256  # infeasible configurations fully estimated for the INFEASIBLE explanation
SOLVE_TIME_S = 20.0   # CP-SAT's limit for one configuration's model (mixed block classes), within the search's
REALIZE_TRIES = 8     # rank-count optima solve_general tries to realize before it solves the partitioned model
REALIZE_TIME_S = 5.0  # StageModel.realize's search for a partition (0.2-1.5 s for Gemma 3 27B's 62 blocks)
COMPILE_MARGIN = 0.05  # the predicted gain torch.compile must bring before the planner turns it on (_solve_both)
# The zero-bubble schedule runs only where pinned (schedule=zero_bubble). Measured on two H200s (1.3B llama,
# 16 x 2048, eager; benchmarks/zero_bubble_h200.py, docs/benchmarks_2gpu.md) it was slower than the 1F1B it
# replaces, although the cost model prices it faster: 463 against 400 ms at 4 micro-batches of 4 (predicted
# 362 against 392), 940 against 431 ms at 8 of 2, 406 against 386 ms interleaved (vpp 2). Torch's runtime
# walks each backward twice (input, then weight gradients) and schedules explicit send / receive actions,
# host work the model does not hold yet; until it does, the planner does not buy it by itself.
ZERO_BUBBLE_AUTO = False
ZERO_BUBBLE_MARGIN = 0.03  # the predicted gain it must bring over the better winner when ZERO_BUBBLE_AUTO
# pin schedule=...: the plan's pipeline_schedule ("" = 1F1B, interleaved by vpp)
SCHEDULE_PINS = {"1f1b": "", "zero_bubble": "zero_bubble"}
# Fewest tokens per context-parallel rank the search considers (a bound on the space, not a cost: the
# cost model prices every cp it sees). Below it a rank's load-balanced halves are < 2k-token chunks, whose
# attention steps are short against a K/V exchange and whose per-op host floor grows with cp; Llama 3 ran
# 8k per rank at 131k. It also keeps sequences up to 8k searching exactly the space they did before cp.
# A pin (--fix cp=N) is not bounded by it.
MIN_CP_TOKENS = 4096


@dataclass(frozen=True)
class MeshConfig:
    tp: int
    pp: int
    dp: int
    ep: int
    vpp: int
    micro_batch: int
    zero: int
    sequence_parallel: bool
    grad_reduce_dtype: str
    cp: int = 1

    @property
    def dense_dp(self) -> int:
        """Plan.dense_dp: ranks that see different tokens (dense gradient reduction)."""
        return self.dp * self.cp * self.ep

    @property
    def expert_dp(self) -> int:
        return self.dp * self.cp

    def short(self) -> str:
        s = f"dp{self.dp} tp{self.tp} pp{self.pp}"
        s += f" cp{self.cp}" if self.cp > 1 else ""
        s += f" ep{self.ep}" if self.ep > 1 else ""
        s += f" vpp{self.vpp}" if self.vpp > 1 else ""
        s += f" mb{self.micro_batch} zero{self.zero}" + (" sp" if self.sequence_parallel else "")
        return s


@dataclass
class SolverInfo:
    status: str            # OPTIMAL | FEASIBLE | INFEASIBLE (| CUTOFF: no plan below a search's cutoff)
    wall_s: float
    objective: float | None   # predicted step time of the winning search's optimum [s] (before the zero-bubble post-pass)
    bound: float | None       # proven lower bound on the best step time in the space [s]
    configs_total: int = 0
    configs_solved: int = 0
    cpu_s: float | None = None   # CPU time of this process during the search (wall_s on a busy host is more)

    def to_dict(self) -> dict:
        return {"status": self.status, "wall_s": round(self.wall_s, 4), "objective": self.objective,
                "bound": self.bound, "configs_total": self.configs_total, "configs_solved": self.configs_solved,
                "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 4)}


@dataclass
class Candidate:
    plan: Plan
    estimate: Estimate
    why: str = ""


@dataclass
class PlanResult:
    plan: Plan | None
    estimate: Estimate | None
    solver: SolverInfo
    runners_up: list[Candidate] = field(default_factory=list)
    explanation: str = ""          # for INFEASIBLE: what would make a plan exist


# ---------------------------------------------------------------------------------------------------------
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_fix(fix: str | dict | None) -> dict:
    """'tp=8,pp=4' or {"tp": 8} -> validated pins. Unknown keys, repeated keys and bad values are
    UserErrors (a silent 'means off' or 'last one wins' plans something the user did not ask for)."""
    if not fix:
        return {}
    if isinstance(fix, str):
        fix = _split_fix(fix)
    if not isinstance(fix, dict):
        raise UserError(f"fix: expected 'tp=8,pp=4' or a dict, got {type(fix).__name__}")
    out: dict = {}
    for k, v in fix.items():
        key = PIN_ALIASES.get(k, k)
        if key not in PIN_KEYS:
            raise UserError(f"pin {k!r}: unknown; pins are {', '.join(PIN_KEYS)}")
        if key in out:
            raise UserError(f"pin {key} given twice (as {k!r}); give each pin once")
        out[key] = _pin_value(k, key, v)
    if out.get("schedule") == "zero_bubble":
        if out.get("compile"):
            raise UserError("pins schedule=zero_bubble and compile=1 conflict: torch's zero-bubble schedules run "
                            "eager stages only; drop one")
        if out.get("zero") == 3:
            raise UserError("pins schedule=zero_bubble and zero=3 conflict: torch's weight-gradient step misses "
                            "parameters FSDP2 resharded after forward; pin zero 0-2")
        if out.get("pp") == 1:
            raise UserError("pins schedule=zero_bubble and pp=1 conflict: the schedule runs pipeline stages; pin "
                            "pp >= 2")
    return out


def _split_fix(text: str) -> dict[str, str]:
    items: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part or ";" in part:
            raise UserError(f"--fix: {part.strip()!r} is not KEY=VALUE; separate pins with commas "
                            f"(e.g. --fix tp=8,pp=4)")
        k, v = (x.strip() for x in part.split("=", 1))
        if not k:
            raise UserError(f"--fix: {part.strip()!r} is not KEY=VALUE (e.g. --fix tp=8,pp=4)")
        if k in items or PIN_ALIASES.get(k, k) in {PIN_ALIASES.get(x, x) for x in items}:
            raise UserError(f"--fix: pin {k} given twice; give each pin once")
        items[k] = v
    return items


def _pin_value(k: str, key: str, v: object) -> object:
    if key in ("sequence_parallel", "compile"):
        word = str(v).strip().lower()
        if isinstance(v, bool):
            return v
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise UserError(f"pin {k}={v!r}: use true or false (also on/off, yes/no, 1/0)")
        return word in TRUE_WORDS
    if key == "recompute":
        if v not in RECOMPUTE_MODES:
            raise UserError(f"pin recompute={v!r}: use one of {', '.join(RECOMPUTE_MODES)}")
        return v
    if key == "schedule":
        if v not in SCHEDULE_PINS:
            raise UserError(f"pin schedule={v!r}: use {' or '.join(SCHEDULE_PINS)} (zero_bubble: torch's "
                            f"ScheduleInterleavedZeroBubble, eager)")
        return v  # kept as given: parse_fix runs again on parsed pins (api, then Planner)
    if key == "grad_reduce_dtype":
        if v not in ("fp32", "bf16", "int8"):
            raise UserError(f"pin grad_reduce_dtype={v!r}: use fp32, bf16 or int8 (block-scaled, fp32 accumulation)")
        return v
    if isinstance(v, bool):
        raise UserError(f"pin {k}={v!r}: must be a whole number")
    try:
        iv = int(v)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"pin {k}={v!r}: must be a whole number") from None
    if key == "zero":
        return check_int(iv, f"pin {k}", 0, 3)
    return check_int(iv, f"pin {k}", 1, MAX_GLOBAL_BATCH if key == "micro_batch" else MAX_GPUS)


PRECISIONS = {"bf16": "none", "fp8": "tensorwise", "fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise"}


def fp8_recipe(precision: str, profile) -> str:
    """The FP8 recipe of every block for a --precision option ("none" for bf16); UserError for an
    unknown option or a device without an FP8 peak."""
    if precision not in PRECISIONS:
        raise UserError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)} (fp8 = tensorwise scaling)")
    recipe = PRECISIONS[precision]
    if recipe != "none" and "fp8" not in profile.peak_flops:
        raise UserError(f"precision {precision}: hardware profile {profile.name} has no fp8 peak (it lists "
                        f"{', '.join(sorted(profile.peak_flops))}); use --precision bf16 or an FP8 device (H100, H200, ...)")
    return recipe


def _divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, in O(sqrt n) (n is at most MAX_GPUS or MAX_GLOBAL_BATCH)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


class Planner:
    def __init__(self, graph: OpGraph, cluster: Cluster, global_batch: int, seq_len: int,
                 max_memory_bytes: float | None = None, fix: dict | str | None = None,
                 model_name: str = "", dtype: str = "bf16", progress: Callable[[str], None] | None = None,
                 placements: dict[str, str] | None = None, cost_model: CostModel | None = None,
                 precision: str = "bf16"):
        check_int(global_batch, "global batch", 1, MAX_GLOBAL_BATCH)
        self.graph = graph
        self.cluster = cluster
        self.cm = cost_model or sharding_cost_model(graph, cluster, dtype)
        self.global_batch = global_batch
        self.seq_len = seq_len
        self.budget = self.cm._budget(max_memory_bytes)
        self.fix = parse_fix(fix)
        # The search runs as pinned; unless compile is pinned (or the runtime is not the trainer's), a compiled
        # and an eager search each find their optimum and compile wins by COMPILE_MARGIN (`_solve_both`)
        self.compile = bool(self.fix.get("compile", False))
        # FP8 linears in every block only when asked (--precision fp8): FP8 changes numerics, so it is the
        # user's option, never the planner's silent choice
        self.precision = precision
        self.fp8 = fp8_recipe(precision, cluster.profile)
        self.model_name = model_name or graph.model_name
        self.progress = progress
        self.placements = placements
        self._placement_cache: dict[tuple[int, bool], dict[str, str]] = {}
        self._sp_feasible: dict[int, bool] = {}  # tp -> whether SP has placements there (_sp_runs)
        self._unsplit_tp: set[int] = set()  # unpinned tp degrees skipped: their solved layout splits nothing
        self._fallback_tp: set[int] = set()   # tp degrees placed by Megatron's layout (see _placements)
        self._stage_models: dict[MeshConfig, StageModel] = {}
        self._compiled_planner: Planner | None = None  # _compile_pinned's
        # Shared by every StageModel: segment analyses per (tp, SP) and segment costs under a small key
        # (the cost model's own cache keys on the whole placement tuple, slow to hash per lookup).
        self._segments: dict[tuple[int, bool], tuple[dict, tuple]] = {}
        self._costs: dict[tuple, object] = {}
        self._fp8_choice: dict[tuple, str] = {}
        self._p2p: dict[tuple, float] = {}
        self._pipeline: dict[tuple, float] = {}   # _pipeline_bound per (group, vpp): shared by members
        self._sync: dict[MeshConfig, float] = {}  # StageModel.sync_bound per configuration at vpp 1: shared
        self.recompute_modes = self._runnable_recompute_modes()
        self._check_pins()

    # ---- the space ----------------------------------------------------------------------------------------
    def _runnable_recompute_modes(self) -> tuple[str, ...]:
        """The recompute modes the trainer can run on this model: not per-op checkpointing (nor "selective" where
        the trainer runs it as per-op checkpointing, OpGraph.selective_as_op) when a block changes in place the
        output of an op that checkpointing caches (OpGraph.op_sac_mutated): torch's selective checkpointing
        refuses the changed cache entry in the backward. A pinned such mode is one error here."""
        mutated = self.graph.op_sac_mutated()
        if not mutated:
            return RECOMPUTE_MODES
        dropped = {"op"} | ({"selective"} if self.graph.selective_as_op else set())
        pinned = self.fix.get("recompute")
        if pinned in dropped:
            op, module = mutated[0]
            raise UserError(f"pin recompute={pinned}: per-op checkpointing would cache the output of {op} in "
                            f"{module}, which the block then changes in place; torch's selective checkpointing "
                            f"refuses that in the backward; pin recompute "
                            f"{' or '.join(r for r in RECOMPUTE_MODES if r not in dropped)}")
        return tuple(r for r in RECOMPUTE_MODES if r not in dropped)

    def _check_pins(self) -> None:
        n, f = self.cluster.num_devices, self.fix
        prod = 1
        for k in ("tp", "pp", "dp", "ep", "cp"):
            if k in f:
                if n % f[k]:
                    raise UserError(f"pin {k}={f[k]} does not divide the {n} devices")
                prod *= f[k]
        if n % prod:
            raise UserError(f"pins {', '.join(f'{k}={f[k]}' for k in ('tp', 'pp', 'dp', 'ep', 'cp') if k in f)} "
                            f"multiply to {prod}, which does not divide the {n} devices")
        if all(k in f for k in ("tp", "pp", "dp", "ep", "cp")) and prod != n:
            raise UserError(f"pins tp*pp*dp*ep*cp = {prod} but the cluster has {n} devices")
        if f.get("cp", 1) > 1:
            if self.seq_len % (2 * f["cp"]):
                raise UserError(f"pin cp={f['cp']}: seq_len {self.seq_len} is not divisible by 2*cp = {2 * f['cp']} "
                                f"(causal load balancing); pick cp so that 2*cp divides the sequence length")
            if not self.cm.has_fused_attention:
                raise UserError(f"pin cp={f['cp']}: context parallelism needs fused attention "
                                f"(scaled_dot_product_attention); this model's attention is eager")
        heads, kv = self.cm.heads, self.cm.kv_heads
        if "tp" in f and heads and (heads % f["tp"] or (kv and kv % f["tp"])):
            raise UserError(f"pin tp={f['tp']} does not divide the model's {heads} heads / {kv} kv heads")
        experts = self.cm.num_experts
        if "ep" in f and f["ep"] > 1 and (not experts or experts % f["ep"]):
            raise UserError(f"pin ep={f['ep']}: the model has {experts or 'no'} experts")
        if "pp" in f and f["pp"] > max(self.cm.num_blocks, 1):
            raise UserError(f"pin pp={f['pp']} exceeds the model's {self.cm.num_blocks} blocks")
        if f.get("pp", 1) > 1 and self.graph.no_pipeline:
            raise UserError(f"pin pp={f['pp']}: {no_pipeline_clause(self.model_name, self.graph.no_pipeline)}; "
                            f"use pp=1")
        if f.get("vpp", 1) > 1 and f.get("pp", 2) == 1:
            raise UserError("pin vpp>1 contradicts pp=1: interleaving needs pipeline stages")
        if f.get("sequence_parallel") and not self.cm.sequence_splits:
            raise UserError("pin sequence_parallel=true: the model's blocks flatten batch and sequence into one dim "
                            "(OPT's MLP), which sequence parallelism cannot shard; drop the pin")

    def mesh_configs(self) -> Iterator[MeshConfig]:
        n, f = self.cluster.num_devices, self.fix
        heads, kv = self.cm.heads, self.cm.kv_heads
        experts = self.cm.num_experts
        L = self.cm.num_blocks
        node = self.cluster.devices_in_node
        for tp in _divisors(n):
            if f.get("tp", tp) != tp or tp > node and "tp" not in f:
                continue  # TP across nodes never pays: its collectives sit on the critical path
            if heads and (heads % tp or (kv and kv % tp)):
                continue
            if not self._tp_runs(tp):
                continue
            for pp in _divisors(n // tp):
                if f.get("pp", pp) != pp or pp > L or (pp > 1 and self.graph.no_pipeline):
                    continue  # (no_pipeline: later blocks read more than the hidden states a stage sends)
                for ep, cp in ((e, c) for e in _divisors(n // (tp * pp)) for c in self._cp_degrees(n // (tp * pp * e))):
                    if f.get("ep", ep) != ep or (ep > 1 and (not experts or experts % ep)):
                        continue
                    dp = n // (tp * pp * ep * cp)
                    if f.get("dp", dp) != dp or self.global_batch % (dp * ep):
                        continue
                    per_rank = self.global_batch // (dp * ep)
                    for mb in _divisors(per_rank):
                        if f.get("micro_batch", mb) != mb or (mb > MAX_MICRO_BATCH and "micro_batch" not in f):
                            continue
                        m = per_rank // mb
                        if pp > 1 and m < pp:
                            continue  # the trainer's 1F1B schedules need at least pp micro-batches
                        for vpp in range(1, L // pp + 1 if pp > 1 else 2):
                            if f.get("vpp", vpp) != vpp or (vpp > 1 and m % pp) or vpp > 8:
                                continue
                            for zero in range(4):
                                if not self._zero_allowed(zero, dp * cp * ep, m, pp, f.get("grad_reduce_dtype", "fp32")):
                                    continue
                                for sp in ((False, True) if tp > 1 else (False,)):
                                    if f.get("sequence_parallel", sp) != sp:
                                        continue
                                    if sp and not self._sp_planned(tp, cp):
                                        continue
                                    # without SP only where SP is not planned, or does not dominate (under the
                                    # fallback layout, or where the solver has no SP placement, tp runs without
                                    # it: tiny-llama at tp 2, 1024 tokens had no plan at all)
                                    if "sequence_parallel" not in f and tp > 1 and not sp \
                                            and self._sp_planned(tp, cp) and self._sp_dominates():
                                        continue
                                    # fp32 gradient reduction unless pinned: bf16 is always cheaper under
                                    # the cost model but costs accuracy, a trade only the user can make
                                    gd = f.get("grad_reduce_dtype", "fp32")
                                    yield MeshConfig(tp, pp, dp, ep, vpp, mb, zero, sp, gd, cp)

    def _cp_degrees(self, n: int) -> list[int]:
        """Context-parallel degrees dividing n: the pin, else 1 and every cp whose ranks keep at least
        MIN_CP_TOKENS tokens each, with 2*cp dividing seq_len (causal load balancing), for models whose
        attention is fused (the ring splits SDPA kernels)."""
        if "cp" in self.fix:
            return [self.fix["cp"]] if n % self.fix["cp"] == 0 else []
        if self.seq_len < 2 * MIN_CP_TOKENS or not self.cm.has_fused_attention:
            return [1]
        return [c for c in _divisors(n) if c == 1 or (self.seq_len % (2 * c) == 0
                                                      and self.seq_len // c >= MIN_CP_TOKENS)]

    def _zero_dominated(self, zero: int, d: int, m: int, pp: int) -> bool:
        """Stages no plan needs (exact under the cost model): ZeRO-1 when m == 1 (ZeRO-2 then communicates the
        same once per step and holds less); under the trainer's pipeline with several micro-batches ZeRO 2 and 3
        (the peak holds ZeRO-1's states there, CostModel.held_zero, and they gather as often or more,
        comm.trainer_dp_schedule). ZeRO-0 is not: its one all-reduce a unit meets the ranks fewer times than
        ZeRO-1's gathers and reduction, for more optimizer work and memory."""
        if d == 1:
            return False
        return (zero == 1 and m == 1) or (self.cm.runtime == "trainer" and pp > 1 and m > 1 and zero >= 2)

    def _zero_allowed(self, zero: int, d: int, m: int, pp: int, grad_dtype: str) -> bool:
        """Whether the search (and the compile post-pass, alike) plans ZeRO stage `zero` over `d` data ranks with
        m micro-batches and pp stages: the pin, no sharding without data ranks, no dominated stage
        (`_zero_dominated`, unless pinned), and an int8 reduction only through FSDP2's reduce-scatter (the trainer
        quantizes there: Plan.check_runnable), which the compile post-pass once handed ZeRO-0."""
        if self.fix.get("zero", zero) != zero or (zero > 0 and d == 1):
            return False
        if grad_dtype == "int8" and zero == 0 and d > 1:
            return False
        return "zero" in self.fix or not self._zero_dominated(zero, d, m, pp)

    def _sp_planned(self, tp: int, cp: int) -> bool:
        """Whether the search plans sequence parallelism at this tp and cp: each cp rank's tokens split over tp
        (check_runnable), blocks that keep a sequence dim (not OPT's flattened MLP), a vocabulary that splits
        evenly and the solver's own layout (the trainer runs replicated vocabulary ends only without SP, which the
        fallback layout may leave), and SP placements the solver finds (`_sp_runs`)."""
        if cp > 1 and (self.seq_len // cp) % tp:
            return False
        if not self.cm.sequence_splits or not self._sp_runs(tp):  # (a pinned SP the solver cannot place: its error)
            return False
        return self.cm.vocab_splits_evenly(tp) and tp not in self._fallback_tp

    def _sp_runs(self, tp: int) -> bool:
        """Whether the sharding solver finds placements for sequence parallelism at this tp that the trainer runs
        (CostModel.sp_refusal: no norm-like module kept whole on the stream): a block whose
        ops cannot all take the sequence-sharded residual stream (Qwen3.5's gated full attention, s = 1024) has
        none, and tp then runs without SP. A pinned SP that cannot run is one error naming the block."""
        if tp not in self._sp_feasible:
            try:
                refusal = self.cm.sp_refusal(self._placements(MeshConfig(tp, 1, 1, 1, 1, 1, 0, True, "fp32")))
                if refusal:
                    raise UserError(f"sequence parallelism at tp={tp}: {refusal}, which the trainer cannot run on "
                                    f"sequence shards; drop the sequence_parallel pin")
                self._sp_feasible[tp] = True
            except UserError:
                if self.fix.get("sequence_parallel"):
                    raise
                self._sp_feasible[tp] = False
        return self._sp_feasible[tp]

    def _sp_dominates(self) -> bool:
        """Sequence parallelism moves the same bytes as plain TP when each segment has as many
        colwise inputs as rowwise outputs (reduce-scatter + all-gather = all-reduce) and runs norms on
        1/tp of the sequence: then TP without SP never wins."""
        if not hasattr(self, "_sp_dom"):
            if not self._sp_runs(2):
                self._sp_dom = False
                return False
            pl = self._placements(MeshConfig(2, 1, 1, 1, 1, 1, 0, True, "fp32"))
            segs = self.cm.segments(pl, True)
            self._sp_dom = all(sorted(s.tp_col_input_bytes) == sorted(s.tp_collective_bytes) for s in segs.values())
        return self._sp_dom

    def base_plan(self, cfg: MeshConfig) -> Plan:
        return Plan(model=self.model_name, hardware=self.cluster.profile.name, gpus=self.cluster.num_devices,
                    gpus_per_node=self.cluster.devices_per_node, global_batch=self.global_batch,
                    seq_len=self.seq_len, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep, vpp=cfg.vpp, cp=cfg.cp,
                    micro_batch=cfg.micro_batch, zero=cfg.zero, sequence_parallel=cfg.sequence_parallel,
                    grad_reduce_dtype=cfg.grad_reduce_dtype, placements=self._placements(cfg),
                    model_fingerprint=getattr(self.graph, "fingerprint", "") or "",
                    compile=self.compile)

    def _placements(self, cfg: MeshConfig) -> dict[str, str]:
        """Per-op placements for this tp and SP from the sharding solver (issue 5), solved once per
        (tp, SP) at one micro-batch and shared by every configuration with that pair (the same dict
        object, so the cost model's segment analysis is reused). Under a pinned tp where the solver
        shards nothing (tiny widths), Megatron's layout: the trainer refuses a tp > 1 plan that splits
        no module (Plan.validate), so the planner never emits one."""
        if self.placements is not None:
            return self.placements
        sp = cfg.sequence_parallel and cfg.tp > 1
        key = (cfg.tp, sp)
        if key not in self._placement_cache:
            solved = self.cm.placements_for(
                Plan(model="", hardware="", gpus=cfg.tp, gpus_per_node=cfg.tp, global_batch=1, seq_len=1, dp=1,
                     tp=cfg.tp, sequence_parallel=sp))
            if cfg.tp > 1 and not splits_some_module(solved) and "tp" in self.fix:
                solved = pinned_tp_placements(self.cm, cfg.tp, sp)
                self._fallback_tp.add(cfg.tp)
            self._placement_cache[key] = solved
        return self._placement_cache[key]

    def _tp_runs(self, tp: int) -> bool:
        """Whether a tp-way plan splits some module. Unpinned, a tp whose solved layout replicates
        everything only repeats work on every tp rank and is skipped; pinned, it gets Megatron's layout
        (see _placements) and a model that has nothing to split even then is refused with the reason."""
        if tp == 1:
            return True
        if splits_some_module(self._placements(MeshConfig(tp, 1, 1, 1, 1, 1, 0, False, "fp32"))):
            return True
        if "tp" in self.fix:
            raise UserError(f"pin tp={tp}: the model has no Linear or Embedding whose width divides by {tp} "
                            f"in a column/row pair, so nothing can be split over {tp} tensor-parallel ranks; "
                            f"use tp=1 (data or pipeline parallelism instead)")
        self._unsplit_tp.add(tp)
        return False

    def segments_of(self, tp: int, sp: bool, placements: dict[str, str]) -> tuple[dict, tuple]:
        """(segments, cost-model key) of the placements solved for (tp, SP), computed once."""
        hit = self._segments.get((tp, sp))
        if hit is None or hit[2] is not placements:
            hit = self._segments[tp, sp] = (self.cm.segments(placements, sp), self.cm.segments_key(placements, sp),
                                            placements)
        return hit[0], hit[1]

    def p2p_time(self, plan: Plan, pp_span: str) -> float:
        """Send + receive of one stage boundary's activation, forward and backward [s]; it depends on
        tp, SP, the micro-batch and the pipeline link only, so configurations share it."""
        key = (plan.tp, plan.sequence_parallel, plan.micro_batch, plan.cp, pp_span)
        hit = self._p2p.get(key)
        if hit is None:
            hit = self._p2p[key] = self.cm.boundary_time(plan, pp_span)
        return hit

    def segment_cost(self, prefix: tuple, key: tuple, name: str, rc: str):
        """CostModel.segment_cost for (tp, SP, ep, micro-batch, tp span, ep span, cp, cp span) = prefix."""
        hit = self._costs.get((prefix, name, rc))
        if hit is None:
            tp, sp, ep, mb, tp_span, ep_span, cp, cp_span = prefix
            hit = self._costs[prefix, name, rc] = self.cm.segment_cost(
                key, name, tp, ep, sp, mb, rc, tp_span, ep_span, self.compile, cp, cp_span,
                self.fp8_choice(prefix, key, name))
        return hit

    def fp8_choice(self, prefix: tuple, key: tuple, name: str) -> str:
        """The FP8 recipe of segment `name` under (tp, SP, ep, micro-batch, spans, cp, cp span) = prefix:
        the asked-for recipe where the cost model finds the block faster with it (large GEMMs), else
        "none" (small GEMMs, where the casts cost more than the GEMMs save); the embedding and head stay
        high precision."""
        if self.fp8 == "none" or name in ("pre", "post"):
            return "none"
        hit = self._fp8_choice.get((prefix, name))
        if hit is None:
            tp, sp, ep, mb, tp_span, ep_span, cp, cp_span = prefix
            t = {r: self.cm.segment_cost(key, name, tp, ep, sp, mb, "none", tp_span, ep_span, self.compile, cp, cp_span,
                                         r).total_s for r in ("none", self.fp8)}
            # a tie (a host-paced block: the same floor either way, its times equal up to rounding) keeps bf16,
            # the precision a user gives up only for speed
            hit = self._fp8_choice[prefix, name] = self.fp8 if t[self.fp8] < t["none"] * (1 - 1e-9) else "none"
        return hit

    # ---- bounds -------------------------------------------------------------------------------------------
    def lower_bound(self, cfg: MeshConfig) -> float:
        """t >= (m - 1/v) * sum_T / p + sum_T / v with sum_T at no recompute (T_max >= sum_T / p and
        the T_max coefficient m - 1/v >= 0), plus the data-parallel and optimizer bound."""
        sm = self._stage_model(cfg)
        return self._pipeline_bound(sm, cfg.vpp) + sm.sync_bound()

    def _stage_model(self, cfg: MeshConfig) -> StageModel:
        """One StageModel per configuration: the bound and the solve share its cached costs."""
        if cfg not in self._stage_models:
            self._stage_models[cfg] = StageModel(self, cfg)
        return self._stage_models[cfg]

    def group_bound(self, group: list[MeshConfig]) -> float:
        """A lower bound on `lower_bound` of configurations that differ only in vpp and ZeRO stage: they
        share block times, p2p time and m, so for each of their vpp values this is `lower_bound` without
        its sync term (>= 0, the only part that depends on ZeRO), computed with the same operations.
        Scaled down by 1e-12 as a margin against rounding."""
        sm = self._stage_model(group[0])
        return min(self._pipeline_bound(sm, v) for v in sorted({c.vpp for c in group})) * (1 - 1e-12)

    def _pipeline_bound(self, sm: StageModel, v: int) -> float:
        """(m - 1/v) * max(sum_T / p, tau) + sum_T / v for sm's configuration run with vpp = v (every
        input is shared by the configurations of sm's group, so the value is computed once per v)."""
        key = (_group_key(sm.cfg), v)
        hit = self._pipeline.get(key)
        if hit is None:
            hit = self._pipeline[key] = self._compute_pipeline_bound(sm, v)
        return hit

    def _compute_pipeline_bound(self, sm: StageModel, v: int) -> float:
        total = sm.pre_post_time() + sum(sm.block_time(c, "none") * k for c, k in sm.class_counts.items())
        total += sm.p2p_per_virtual_stage * sm.cfg.pp * v
        m, p = sm.m, sm.cfg.pp
        t_block = min(sm.block_time(c, "none") for c in sm.classes)
        ends = np.array([sm.ends_time(d, v) for d in range(p)])
        tau = _min_max_blocks(ends, t_block, self.cm.num_blocks, v)
        return (m - 1 / v) * max(total / p, tau) + total / v

    def _bound_order(self, configs: list[MeshConfig]) -> Iterator[tuple[float, int, MeshConfig]]:
        """(lower_bound, index, configuration) in increasing (bound, index): the order of sorting every
        configuration's bound, but a group of configurations that differ only in vpp and ZeRO stage has
        its members' bounds computed only once the group's `group_bound` reaches the head of the heap
        (most groups never do: they cannot beat the plan found by then). A member then enters keyed by its
        pipeline term alone (the group's, per vpp, already computed; `lower_bound` adds the sync term >= 0),
        and its StageModel and full bound are built only when that key reaches the head: every key is at most
        its configuration's bound, so the order is the same, and the members after the search stops are never
        built."""
        groups: dict[tuple, list[tuple[int, MeshConfig]]] = {}
        for i, c in enumerate(configs):
            groups.setdefault(_group_key(c), []).append((i, c))
        members = list(groups.values())
        # entries (key, index, group id, or -2: a member keyed by its pipeline term, or -1: a member at its bound,
        # config); (key, index) is unique, so the tail never compares
        heap: list[tuple[float, int, int, MeshConfig]] = [
            (self.group_bound([c for _, c in m]), m[0][0], g, m[0][1]) for g, m in enumerate(members)]
        heapq.heapify(heap)
        while heap:
            b, i, g, cfg = heapq.heappop(heap)
            if g == -1:
                yield b, i, cfg
            elif g == -2:  # a member keyed by its pipeline term: now its full bound
                heapq.heappush(heap, (self.lower_bound(cfg), i, -1, cfg))
            else:
                for j, c in members[g]:
                    heapq.heappush(heap, (self._pipeline[_group_key(c), c.vpp] * (1 - 1e-12), j, -2, c))

    # ---- search -------------------------------------------------------------------------------------------
    def solve(self, top_k: int = 3, time_limit_s: float = 60.0) -> PlanResult:
        # The search allocates many short-lived objects and few reference cycles; cyclic GC passes
        # over the graph's ~10^5 live objects cost ~10% of the search, so they wait until it ends.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._solve(top_k, time_limit_s)
        finally:
            if was_enabled:
                gc.enable()

    def _solve(self, top_k: int, time_limit_s: float) -> PlanResult:
        """The trainer's runtime with compile free: both spaces searched (`_solve_both`); else one search."""
        if "compile" in self.fix or self.cm.runtime != "trainer" or self.fix.get("schedule") == "zero_bubble":
            return self._search(top_k, time_limit_s)  # (torch's zero-bubble schedules run eager stages only)
        return self._solve_both(top_k, time_limit_s)

    def _solve_both(self, top_k: int, time_limit_s: float) -> PlanResult:
        """The fastest plan with compiled blocks and the fastest eager one, each its own search (compiled blocks
        keep less memory and run their non-matrix work fused, so the two optima can differ in mesh, ZeRO stage,
        partition and recompute: llama3-70b on 64 H100s, pp4 tp4 dp4 compiled at 27.69 s against 27.89 s for
        the eager optimum's mesh compiled). Compile is turned on where its optimum is at least COMPILE_MARGIN
        faster than the eager one, so the eager search only looks below compiled / (1 - COMPILE_MARGIN) (its
        bounds prune on that cutoff from the start; where compile gains ~15% no eager plan is solved: llama3-70b's
        521 visited configurations all fall to their relaxed bounds). The solver line reports the search whose plan
        won; `configs_solved` and the times count both."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        compiled = self._compile_pinned()._search(top_k, time_limit_s, label=" (compiled blocks)")
        left = max(1.0, time_limit_s - (time.perf_counter() - t0))
        if compiled.plan is None:  # nothing fits compiled: the eager search as it always was
            return self._search(top_k, left)
        cutoff = compiled.estimate.step_time_s / (1 - COMPILE_MARGIN)
        eager = self._search(top_k, left, cutoff=cutoff, label=f" (eager, below {cutoff:.4g} s)")
        won = eager if eager.plan is not None else compiled
        s, c, e = won.solver, compiled.solver, eager.solver
        # OPTIMAL: the winner's search proved its optimum and the eager one proved nothing below the cutoff is
        # missed (or found the eager optimum below it)
        status = "OPTIMAL" if c.status == "OPTIMAL" and e.status in ("OPTIMAL", "CUTOFF") else "FEASIBLE"
        info = SolverInfo(status, time.perf_counter() - t0, s.objective, s.bound, c.configs_total,
                          c.configs_solved + e.configs_solved, time.process_time() - cpu0)
        return PlanResult(won.plan, won.estimate, info, runners_up=won.runners_up)

    def _search(self, top_k: int, time_limit_s: float, cutoff: float = math.inf, label: str = "") -> PlanResult:
        """The search over mesh configurations (module docstring). `cutoff`: only plans faster than it are
        sought (the bounds prune on it as on an incumbent); none: plan None, status CUTOFF."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        configs = list(self.mesh_configs())
        if not configs:
            raise UserError(self._no_config_reason())
        self._say(f"planning {self.model_name}{label}: {len(configs)} mesh configurations on {self.cluster}")
        order = self._bound_order(configs)
        best: list[Candidate] = []    # feasible, sorted by step time
        deferred: list[tuple[float, int, MeshConfig]] = []  # (relaxed bound, index, config): greedy plans to prove
        beaten: list[tuple[float, int, MeshConfig]] = []  # (bound, index, config): solved only below the incumbent
        misses: list[MeshConfig] = []   # configurations that did not fit, for the explanation
        solved = 0
        last_say = time.perf_counter()
        proven = True
        pending: tuple[float, int, MeshConfig] | None = None   # the first configuration not visited
        for lb, i, cfg in order:
            limit = min(best[0].estimate.step_time_s, cutoff) if best else cutoff  # what a plan must beat
            if lb >= limit:
                pending = (lb, i, cfg)
                break  # increasing bounds: no remaining configuration can beat the winner (or the cutoff)
            if time.perf_counter() - t0 > time_limit_s:
                pending = (lb, i, cfg)
                proven = False
                break
            solved += 1
            sm = self._stage_model(cfg)
            if not sm.memory_may_fit():
                misses.append(cfg)
                continue
            if len(sm.classes) == 1 and limit < math.inf:
                # the cheap bound is <= relaxed_bound, so pruning on it first decides exactly as before
                if sm.quick_relaxed_bound() >= limit:
                    continue
                lb2 = sm.relaxed_bound()
                if lb2 >= limit:
                    continue
            elif limit < math.inf and sm.mixed_relaxed_bound() >= limit:
                continue  # mixed classes: the memory-aware LP bound
            lazy = len(sm.classes) == 1 and cfg.pp > 2  # CBC's configurations
            # a configuration that cannot beat the incumbent (or the cutoff) needs no optimum of its own
            below = limit
            # a configuration's model runs at most to the search's own limit (a solve started just before it
            # had run its full SOLVE_TIME_S past it: Gemma 3 27B's search 83 s against its 60)
            limit_s = min(SOLVE_TIME_S, max(1.0, time_limit_s - (time.perf_counter() - t0)))
            plan = sm.greedy_plan() if lazy else sm.solve(below, limit_s)
            if plan is None and lazy:
                plan, lazy = sm.solve(below, limit_s), False
            if plan is None:
                if best:
                    beaten.append((lb, i, cfg))  # nothing faster than the incumbent: a runner-up candidate
                elif cutoff == math.inf:
                    misses.append(cfg)  # for the explanation of an infeasible search
                proven &= sm.proven is not False  # a time-limited solve that found nothing proves nothing
                continue
            if lazy:
                # the greedy plan is real but not proven this configuration's best: CBC runs after the loop,
                # where the bounds say it still may beat the incumbent (often never: fewer CBC solves)
                deferred.append((sm.relaxed_bound(), i, cfg))
            else:
                proven &= bool(sm.proven)  # FEASIBLE at the time limit: this configuration's optimum is unproven
            self._keep(best, plan)
            if time.perf_counter() - last_say > 1.0:
                self._say(f"  {solved} configurations solved, best {best[0].estimate.step_time_s:.4f} s/step")
                last_say = time.perf_counter()
        done, greedy = self._solve_deferred(best, deferred, t0 + time_limit_s, cutoff)
        proven &= done
        if cutoff < math.inf and (not best or best[0].estimate.step_time_s >= cutoff):
            # nothing below the cutoff (a greedy plan kept above it is no answer either): no runners-up to find
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            self._say(f"  done: {solved}/{len(configs)} configurations solved in {wall:.2f} s, none below the cutoff")
            return PlanResult(None, None, SolverInfo("CUTOFF" if proven else "FEASIBLE", wall, None, cutoff,
                                                     len(configs), solved, cpu))
        rest = itertools.chain([pending] if pending else [], order)
        # runners-up get a quarter of the search's time (at least 2 s): a large mixed-class model's solves take ~1 s
        runners = self._find_runners_up(best, rest, top_k, greedy, beaten,
                                        max(2.0, 0.25 * (time.perf_counter() - t0))) if best else []
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if not best:
            return PlanResult(None, None, SolverInfo("INFEASIBLE", wall, None, None, len(configs), solved, cpu),
                              explanation=self._explain_infeasible(self._closest_miss(misses)))
        searched = best[0]
        # the smallest bound not visited is the pending one (bounds come in increasing order)
        bound = min(searched.estimate.step_time_s, pending[0]) if pending else searched.estimate.step_time_s
        status = "OPTIMAL" if proven and bound >= searched.estimate.step_time_s - 1e-12 else "FEASIBLE"
        winner = self._with_schedule(searched, searched)
        winner.plan.check_runnable(self.cm.num_blocks)  # the contract: every plan emitted, the trainer runs
        self._say(f"  done: {solved}/{len(configs)} configurations solved in {wall:.2f} s")
        return PlanResult(winner.plan, winner.estimate,
                          SolverInfo(status, wall, searched.estimate.step_time_s, bound, len(configs), solved, cpu),
                          runners_up=runners)

    def _keep(self, best: list[Candidate], plan: Plan) -> None:
        """Add `plan`, estimated, to the candidates `best`, kept sorted by step time (ties by mesh, then
        partition: the same winner whatever order the plans come in)."""
        best.append(Candidate(plan, self.cm.estimate(plan, self.budget)))
        best.sort(key=lambda c: (c.estimate.step_time_s, MeshConfig_of(c.plan), c.plan.stage_layers,
                                 c.plan.recompute))

    def _solve_deferred(self, best: list[Candidate], deferred: list[tuple[float, int, MeshConfig]],
                        deadline: float, cutoff: float = math.inf) -> tuple[bool, dict[tuple, MeshConfig]]:
        """Improve the configurations the search took greedy plans of (StageModel.improve), in increasing relaxed
        bound, skipping each whose relaxed bound is not below the incumbent (it cannot beat it: the search's own
        pruning rule, applied with a better incumbent). Returns whether every optimum is proven (False when the
        time limit cut the solves short or CBC stopped at its own), and the configurations whose greedy plan was
        kept unimproved (by MeshConfig_of), which runners-up solve exactly before they are shown."""
        proven, greedy = True, {}
        ordered = sorted(deferred)
        for n, (bound, _, cfg) in enumerate(ordered):
            incumbent = min(best[0].estimate.step_time_s, cutoff)
            if bound >= incumbent or time.perf_counter() > deadline:
                # sorted: no later one can beat it either; past the deadline nothing more is proven
                proven &= bound >= incumbent
                greedy.update((MeshConfig_of(self._stage_model(c).plan0), c) for _, _, c in ordered[n:])
                break
            sm = self._stage_model(cfg)
            plan = sm.improve(incumbent)
            proven &= bool(sm.proven)
            if plan is None:
                greedy[MeshConfig_of(sm.plan0)] = cfg  # not faster than the incumbent: its greedy plan stands
            else:
                self._keep(best, plan)
        return proven, greedy

    def _compile_pinned(self) -> Planner:
        """This planner with compile pinned on (built once), sharing this one's cost model, placements and segment
        analyses: _solve_both's compiled search."""
        if self._compiled_planner is None:
            # the search prices 1F1B either way; a pinned zero-bubble schedule (eager only) is _with_schedule's
            fix = {k: v for k, v in self.fix.items() if k != "schedule"} | {"compile": 1}
            compiled = Planner(self.graph, self.cluster, self.global_batch, self.seq_len, self.budget, fix,
                               self.model_name, progress=self.progress, placements=self.placements,
                               cost_model=self.cm, precision=self.precision)
            compiled._placement_cache, compiled._segments = self._placement_cache, self._segments
            compiled._fallback_tp, compiled._sp_feasible = self._fallback_tp, self._sp_feasible
            self._compiled_planner = compiled
        return self._compiled_planner

    def _with_schedule(self, searched: Candidate, current: Candidate) -> Candidate:
        """The pipelined winner on torch's zero-bubble schedule (eager, plan.check_runnable's rules) where
        schedule=zero_bubble is pinned (or, with ZERO_BUBBLE_AUTO, where the cost model predicts it
        ZERO_BUBBLE_MARGIN faster than `current`, the searched winner compiled or not, and it fits). The
        search prices 1F1B; zero bubble only shortens the warm-up and cool-down
        (cost_models.pipeline_schedule), so the post-pass weighs it on the searched partition, and the
        solver's objective stays the search's. ZeRO-3 winners move to
        ZeRO-2 for it (what torch's schedule runs), at their memory."""
        pin = self.fix.get("schedule") == "zero_bubble"
        if self.fix.get("schedule") == "1f1b" or (self.fix.get("compile") and not pin):
            return current  # 1F1B pinned, or compile pinned on (which zero bubble would undo)
        if searched.plan.pp == 1:
            if pin:
                raise UserError("pin schedule=zero_bubble: the best plan has no pipeline (pp=1); pin pp >= 2 too")
            return current
        plan = replace(searched.plan, pipeline_schedule="zero_bubble", compile=False,
                       zero=min(searched.plan.zero, 2))
        try:
            plan.check_runnable(self.cm.num_blocks)
        except UserError as e:
            if pin:
                raise UserError(f"pin schedule=zero_bubble: the winner cannot run it ({str(e).removeprefix('plan: ')})"
                                ) from None
            return current
        est = self.cm.estimate(plan, self.budget)
        if pin and not est.fits:
            raise UserError(f"pin schedule=zero_bubble: the winner on it needs {est.peak_memory_gib:.1f} GiB of "
                            f"{est.budget_gib:.1f} (eager, ZeRO-{plan.zero}); pin zero, recompute or pp as well")
        if pin or (ZERO_BUBBLE_AUTO and est.fits
                   and est.step_time_s <= current.estimate.step_time_s * (1 - ZERO_BUBBLE_MARGIN)):
            return Candidate(plan, est)
        return current

    def _find_runners_up(self, best: list[Candidate], rest: Iterable[tuple[float, int, MeshConfig]], k: int,
                         greedy: dict[tuple, MeshConfig] | None = None,
                         beaten: Sequence[tuple[float, int, MeshConfig]] = (), budget_s: float = 2.0) -> list[Candidate]:
        """Runners-up: the best other meshes among those solved, topped up by solving the next
        configurations in bound order (not proven the 2nd..k-th best: each is a real, costed plan). A runner-up
        the search kept as a greedy plan (`greedy`, _solve_deferred) is solved exactly first: its mesh's best
        partition, not a near one, is what it is compared at. The configurations the search solved only below
        its incumbent (`beaten`: none faster) are solved again, in increasing bound, below the k-th runner-up."""
        t0 = time.perf_counter()
        runners = self._runners_up(best, k)
        greedy = dict(greedy or {})
        while any(MeshConfig_of(c.plan) in greedy for c in runners):
            for c in runners:
                cfg = greedy.pop(MeshConfig_of(c.plan), None)
                # its best plan where better than the greedy one (None: the greedy plan is its optimum)
                plan = self._stage_model(cfg).improve(c.estimate.step_time_s) if cfg is not None else None
                if plan is not None:
                    self._keep(best, plan)
            runners = self._runners_up(best, k)
        def left() -> float:  # a runner-up need not be its mesh's optimum: its solve stops with the budget
            return max(0.1, budget_s - (time.perf_counter() - t0))

        for lb, _, cfg in sorted(beaten) if k > 0 else ():
            bar = runners[-1].estimate.step_time_s if len(runners) >= k else math.inf
            if lb >= bar or time.perf_counter() - t0 > budget_s:
                break
            plan = self._stage_model(cfg).solve(bar, left())
            if plan is not None:
                self._keep(best, plan)
                runners = self._runners_up(best, k)
        seen = {MeshConfig_of(c.plan) for c in best}
        for _, _, cfg in rest:
            if len(runners) >= k or time.perf_counter() - t0 > budget_s:
                break
            sm = self._stage_model(cfg)
            key = MeshConfig_of(sm.plan0)
            if key in seen or not sm.memory_may_fit():
                continue
            plan = sm.solve(time_limit_s=left())
            if plan is not None:
                seen.add(key)
                self._keep(best, plan)  # kept sorted, fastest first
                runners = self._runners_up(best, k)
        return runners

    def _runners_up(self, best: list[Candidate], k: int) -> list[Candidate]:
        """The next best plans with a different mesh, each with the largest reason it lost (none for k = 0: `--top 0`
        printed one)."""
        if k <= 0:
            return []
        winner = best[0]
        out, seen = [], {MeshConfig_of(winner.plan)}
        for c in sorted(best[1:], key=lambda c: (c.estimate.step_time_s, MeshConfig_of(c.plan))):
            key = MeshConfig_of(c.plan)
            if key in seen:
                continue
            seen.add(key)
            c.why = why_slower(winner.estimate, c.estimate)
            out.append(c)
            if len(out) >= k:
                break
        return out

    def _no_config_reason(self) -> str:
        n = self.cluster.num_devices
        if self.cm.num_blocks == 0:
            return (f"{self.model_name}: no repeated blocks found (a ModuleList/ModuleDict of identical "
                    f"layers), and the planner partitions a model by its blocks; give the model at least two "
                    f"identical layers in one container")
        tp = self.fix.get("tp")
        if self.fix.get("sequence_parallel") and tp in self._fallback_tp:
            return (f"pins sequence_parallel and tp={tp}: the sharding solver splits nothing over {tp} ranks at "
                    f"this size (splitting does not pay), and the Megatron layout a pinned tp then gets runs "
                    f"without sequence parallelism; drop the sequence_parallel pin")
        unsplit = sorted(self._unsplit_tp)
        hint = (f" (tp={', '.join(map(str, unsplit))} split nothing at this size and are planned only when "
                f"pinned: --fix tp=...)" if unsplit and "tp" not in self.fix else "")
        return (f"no parallel layout of {n} devices divides the global batch {self.global_batch} "
                f"with the pins {self.fix or '{}'}{hint}; use a global batch that is a multiple of the "
                f"data-parallel degree, or other pins")

    def _closest_miss(self, misses: list[MeshConfig]) -> tuple[float, MeshConfig, Estimate | None] | None:
        """The configuration with the smallest footprint under its leanest recompute mode, among the CLOSEST_MISSES
        with the smallest quick memory guess (a full estimate of each of thousands of misses would cost
        more than the search did)."""
        best = None
        bound = {cfg: getattr(self._stage_model(cfg), "need_guess", 0.0) for cfg in misses}
        for cfg in sorted(misses, key=lambda c: bound[c])[:CLOSEST_MISSES]:
            need, est = self._stage_model(cfg).min_memory_estimate()
            if best is None or need < best[0]:
                best = (need, cfg, est)
        return best

    def _explain_infeasible(self, miss: tuple[float, MeshConfig, Estimate | None] | None) -> str:
        if miss is None:
            return "no configuration could be evaluated"
        need, cfg, est = miss
        mode = self._stage_model(cfg).leanest_mode
        parts = [f"no plan fits {format_bytes(self.budget)} per device; the closest ({cfg.short()}, "
                 f"{'full recompute' if mode == 'full' else f'recompute pinned to {mode}'}) needs {format_bytes(need)}"]
        if est is not None:
            worst = max(est.memory_breakdown_gib, key=lambda d: sum(d.values()))
            fill = ", ".join(f"{k} {v:.1f}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1]) if v > 0.05)
            if fill:
                parts.append(f"filled by {fill} GiB")
        need_devices = self._devices_needed(need)
        if need_devices and need_devices <= MAX_GPUS:
            parts.append(f"or about {need_devices} devices")
        usable = self.cluster.profile.usable_memory_bytes
        if need > usable:  # a larger budget is capped at the device's memory: the advice would loop
            return "; ".join(parts) + (f" -> more than a {self.cluster.profile.name} holds ({usable / 2**30:.1f} GiB "
                                       f"usable): use more devices")
        return "; ".join(parts) + f" -> pass --max-memory-per-gpu {math.ceil(need / 1e9)}GB or more devices"

    def _devices_needed(self, need: float) -> int | None:
        scale = need / self.budget
        if scale <= 1:
            return None
        n = self.cluster.num_devices
        return int(2 ** math.ceil(math.log2(n * scale)))

    def _say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)


def pinned_tp_placements(cm: CostModel, tp: int, sp: bool) -> dict[str, str]:
    """Megatron's layout, made runnable at `tp` (ties matched), for a tp the user pins where the sharding solver
    splits nothing (too small to pay): what the planner emits under such a pin and `estimate --tp` prices."""
    return _ties_matched(cm.graph, cm._runnable(megatron_placements(cm.graph, sp), tp))


def splits_some_module(placements: dict[str, str]) -> bool:
    """Whether a layout splits anything over the tp ranks (else a tp > 1 only repeats the work on each)."""
    return any(v in TP_SHARDED for v in placements.values())


# Placements the trainer can give one shared weight from its two modules (both split on the vocabulary).
_TIE_PAIRS = {("vocab", "colwise"), ("colwise", "vocab")}


def _ties_matched(graph: OpGraph, placements: dict[str, str]) -> dict[str, str]:
    """Both modules of a tied weight (LM head and token embedding) split the same way, else both
    replicated: the trainer refuses tied parameters with different tensor-parallel layouts."""
    out = dict(placements)
    for path, op in graph.parametric_ops.items():
        for owner in op.tied.values():
            a, b = out.get(path, "replicate"), out.get(owner, "replicate")
            if a != b and (a, b) not in _TIE_PAIRS:
                out[path] = out[owner] = "replicate"
    return out


def _group_key(c: MeshConfig) -> tuple:
    """Configurations equal in all but vpp and ZeRO stage: they share block times, p2p time and m."""
    return c.tp, c.pp, c.dp, c.ep, c.cp, c.micro_batch, c.sequence_parallel, c.grad_reduce_dtype


def _min_max_blocks(ends: np.ndarray, t_block: float, blocks: int, v: int) -> float:
    """Smallest tau with sum_d floor((tau - ends_d) / t_block) >= blocks, every rank holding >= v
    blocks: the bottleneck time when every block runs at its fastest (a valid lower bound)."""
    tau = max(float(np.max(ends + v * t_block)), (blocks * t_block + float(ends.sum())) / len(ends))
    k = np.floor((tau - ends) / t_block + 1e-9)
    while k.sum() < blocks:  # raise tau to the next rank's next block boundary, one block at a time
        nxt = ends + (k + 1) * t_block
        d = int(np.argmin(nxt))
        tau = float(nxt[d])
        k[d] += 1
    return tau


def _lower_hull(ks: np.ndarray, ts: np.ndarray) -> list[tuple[float, float]]:
    """Lower convex hull of the points (k, t), k increasing (Andrew's monotone chain)."""
    hull: list[tuple[float, float]] = []
    for k, t in zip(ks.tolist(), ts.tolist()):
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (k - hull[-2][0]) >= (t - hull[-2][1]) * (hull[-1][0] - hull[-2][0]):
            hull.pop()
        hull.append((k, t))
    return hull


def MeshConfig_of(plan: Plan) -> tuple:
    return (plan.dp, plan.tp, plan.pp, plan.ep, plan.vpp, plan.micro_batch, plan.zero, plan.sequence_parallel,
            plan.cp)


def why_slower(winner: Estimate, other: Estimate) -> str:
    """'+12.3% step time: tp_comm +0.41 s' — the breakdown term that grew most against the winner."""
    pct = (other.step_time_s / winner.step_time_s - 1) * 100
    deltas = {k: other.breakdown.get(k, 0.0) - winner.breakdown.get(k, 0.0) for k in winner.breakdown
              if k != "dp_comm_total_s"}
    key = max(deltas, key=deltas.get)
    return f"+{pct:.1f}% step time: {key.removesuffix('_s')} +{deltas[key]:.3g} s"


# ---------------------------------------------------------------------------------------------------------
class StageModel:
    """The CP-SAT model for one mesh configuration. Notation: S = pp*vpp virtual stages, stage s on
    pipeline rank d = s mod pp, C block classes, R = {none, selective, full}, m micro-batches."""

    def __init__(self, planner: Planner, cfg: MeshConfig):
        self.pl = planner
        self.cfg = cfg
        self.proven: bool | None = None  # set by solve(): True when the solver proved its plan optimal
        self.objective: float | None = None  # set by solve(): the model's own step time of its plan [s]
        self.cm = planner.cm
        self.plan0 = planner.base_plan(cfg)
        self.m = self.plan0.num_micro_batches
        self.S = cfg.pp * cfg.vpp
        graph = self.cm.graph
        bc = self.cm.block_class
        self.classes = sorted(set(bc))
        self.class_counts = {c: bc.count(c) for c in self.classes}
        self.rep = {c: graph.blocks[bc.index(c)] for c in self.classes}
        self.sp = cfg.sequence_parallel and cfg.tp > 1
        self.placements = self.plan0.placements
        self.segs, self.key = planner.segments_of(cfg.tp, self.sp, self.placements)
        self.span = self.plan0.mesh_span()
        self._cost_prefix = (cfg.tp, self.sp, cfg.ep, cfg.micro_batch, self.span["tp"], self.span["ep"], cfg.cp,
                             self.span["cp"])
        if planner.fp8 != "none":  # every plan of this configuration carries the per-block FP8 choice
            fp8 = tuple(planner.fp8_choice(self._cost_prefix, self.key, graph.blocks[bc.index(c)]) for c in bc)
            self.plan0 = replace(self.plan0, fp8=fp8 if any(r != "none" for r in fp8) else ())
        self.modes = [self.pl.fix["recompute"]] if "recompute" in self.pl.fix else list(planner.recompute_modes)
        self.mem_unit = planner.budget / RESOLUTION   # bytes per integer unit
        self.p2p_per_virtual_stage = planner.p2p_time(self.plan0, self.span["pp"]) if cfg.pp > 1 else 0.0

    @property
    def ns(self) -> float:
        """Integer time units per second: the whole step's work spans about RESOLUTION units."""
        if not hasattr(self, "_ns"):
            total = self.pre_post_time() + self.p2p_per_virtual_stage * self.S + sum(
                max(self.block_time(c, r) for r in self.modes) * k for c, k in self.class_counts.items())
            self._ns = RESOLUTION / max(total, 1e-12)
        return self._ns

    # ---- coefficients --------------------------------------------------------------------------------------
    def cost(self, name: str, rc: str):
        return self.pl.segment_cost(self._cost_prefix, self.key, name, rc)

    def block_time(self, cls: int, rc: str) -> float:
        return self.cost(self.rep[cls], rc).total_s

    def pre_post_time(self) -> float:
        return self.cost("pre", "none").total_s + self.cost("post", "none").total_s

    def params_of(self, name: str) -> tuple[float, float]:
        """(all params, expert params) held by one device for a segment."""
        s = self.segs[name]
        c = self.cfg
        e = s.expert_params / c.ep
        return s.dense_params + s.tp_params / c.tp + e, e

    @cached_property
    def state_bytes_per_param(self) -> tuple[float, float]:
        """Bytes per local parameter of model states after ZeRO sharding: (dense, expert). A function of plan0
        alone, computed once (the bounds and the options ask for it per rank and per block)."""
        return sum(self.cm.model_states(self.plan0, 1.0, 0.0)), sum(self.cm.model_states(self.plan0, 0.0, 1.0))

    @cached_property
    def end_state_bytes_per_param(self) -> tuple[float, float]:
        """The same with every gradient, as the backward ends (CostModel.reduce_peak)."""
        return (sum(self.cm.model_states(self.plan0, 1.0, 0.0, grads=True)),
                sum(self.cm.model_states(self.plan0, 0.0, 1.0, grads=True)))

    def reduce_fixed(self, d: int) -> float:
        """Rank d's bytes as the backward ends beside its blocks' `block_end_memory`: CostModel.reduce_peak of its
        root unit alone (its states with gradients, ZeRO-3's gathered blocks, the largest unit's reduce buffer);
        0 where the runtime has no such peak (Megatron-LM)."""
        dense = expert = 0.0
        for name, here in (("pre", d == 0), ("post", d == (self.S - 1) % self.cfg.pp)):
            if here:
                p, e = self.params_of(name)
                dense, expert = dense + p - e, expert + e
        return self.cm.reduce_peak(self.plan0, dense, expert, dense + expert)

    def block_end_memory(self, cls: int) -> float:
        """A block's model states with its gradients (`reduce_fixed`)."""
        p, e = self.params_of(self.rep[cls])
        dense_b, exp_b = self.end_state_bytes_per_param
        return (p - e) * dense_b + e * exp_b

    def fixed_memory(self, d: int) -> float:
        """Bytes on rank d independent of the partition: buffers and the ends' model states."""
        c = self.cfg
        dense_b, exp_b = self.state_bytes_per_param
        mem = self.cm.gathered_bytes(self.plan0)  # CostModel._memory's gathered blocks under ZeRO-3
        infl = in_flight_micro_batches(d, c.pp, c.vpp, self.m)
        if d == 0:
            p, e = self.params_of("pre")
            mem += (p - e) * dense_b + e * exp_b + infl * self.cost("pre", "none").act_bytes
        if d == (self.S - 1) % c.pp:
            p, e = self.params_of("post")
            mem += (p - e) * dense_b + e * exp_b + infl * self.cost("post", "none").act_bytes
        return mem

    def logits_floor(self, d: int) -> float:
        """The working-set term's floor on rank d: the logits buffers on the last stage (CostModel._memory)."""
        return self.cm.logits_bytes(self.plan0) if d == (self.S - 1) % self.cfg.pp else 0.0

    def block_memory(self, cls: int) -> float:
        p, e = self.params_of(self.rep[cls])
        dense_b, exp_b = self.state_bytes_per_param
        return (p - e) * dense_b + e * exp_b

    def dp_time_linear(self) -> tuple[float, float, float, float]:
        """Gradient-sync time as slope*params + const for dense and expert params [s per param, s]
        (dp_sync_time is affine in the parameter count)."""
        if not hasattr(self, "_dp_lin"):
            self._dp_lin = self._dp_time_linear()
        return self._dp_lin

    def _dp_time_linear(self) -> tuple[float, float, float, float]:
        c = self.cfg
        gd = c.grad_reduce_dtype
        pb = DTYPE_BYTES.get(self.plan0.param_dtype, 2)
        qbw = self.cm.quant_bandwidth()
        dense_link, exp_link = self.cm.data_parallel_links(self.plan0)

        sched = self.cm.dp_schedule(c.zero, self.m, c.pp)

        def lin(d: int, link: Link) -> tuple[float, float]:
            n = 1e9
            a = dp_sync_time(n, d, link, c.zero, sched, gd, pb, qbw)
            slope = (dp_sync_time(2 * n, d, link, c.zero, sched, gd, pb, qbw) - a) / n
            return slope, a - slope * n
        ds, dc = lin(c.dense_dp, dense_link)
        es, ec = lin(c.expert_dp, exp_link)
        return ds, dc, es, ec

    def cover(self, sc) -> float:
        """Work a segment offers to hide gradient sync behind (CostModel.dp_cover; its overlap switch is the
        callers')."""
        return self.cm.dp_cover(self.plan0, sc.fwd_s, sc.bwd_s)

    # ---- feasibility shortcuts ------------------------------------------------------------------------------
    @property
    def leanest_mode(self) -> str:
        """The recompute mode of the smallest footprint this search may use: full, or the pinned mode."""
        return "full" if "full" in self.modes else self.modes[0]

    def min_memory_estimate(self) -> tuple[float, Estimate | None]:
        """Peak memory of the balanced partition under `leanest_mode` (a near-minimal footprint: a pinned
        recompute mode is the only one the plan may have, so the explanation of a miss must not assume full)."""
        plan = replace(self.plan0, recompute=(self.leanest_mode,) * self.cm.num_blocks)
        try:
            est = self.cm.estimate(plan, self.pl.budget)
        except UserError:
            return math.inf, None
        return est.peak_memory_gib * 2**30, est

    def memory_may_fit(self) -> bool:
        """Quick necessary condition: model states alone (no activations) fit on the average rank. Also
        notes `need_guess`, a rough footprint (states and rank 0's in-flight activations at the least
        keeping recompute mode) that only ranks misses for the INFEASIBLE explanation."""
        states = sum(self.block_memory(c) * k for c, k in self.class_counts.items()) / self.cfg.pp
        act = {c: min(self.cost(self.rep[c], r).act_bytes for r in self.modes) for c in self.classes}
        infl = in_flight_micro_batches(0, self.cfg.pp, self.cfg.vpp, self.m)
        self.need_guess = states + infl * sum(act[c] * k for c, k in self.class_counts.items()) / self.cfg.pp
        return states * (1 + ALLOCATOR_RESERVE) <= self.pl.budget

    # ---- the model -----------------------------------------------------------------------------------------
    def solve(self, below: float = math.inf, time_limit_s: float = SOLVE_TIME_S) -> Plan | None:
        """Uniform blocks (one class): the per-rank model `solve_uniform`; mixed classes: `solve_general` (CP-SAT, for
        at most `time_limit_s`: its best plan by then, `proven` False). With `below`, None also where no plan of this
        configuration is faster than it."""
        return self.solve_uniform(below) if len(self.classes) == 1 else self.solve_general(below, time_limit_s)

    def _solver(self, time_limit_s: float = SOLVE_TIME_S, restarts: bool = False) -> cp_model.CpSolver:
        """One deterministic CP-SAT worker (same inputs, same plan); `restarts`: it cycles its search heuristics
        with quick restarts (the rank-count models of solve_general: Gemma 3 27B's proved in 1.7-5 s each where
        the default branching ran some to the 20 s limit; on the partitioned model it did worse: MiniMax's)."""
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_time_in_seconds = time_limit_s
        if restarts:
            solver.parameters.search_branching = cp_model.PORTFOLIO_WITH_QUICK_RESTART_SEARCH
        return solver

    # ---- uniform blocks: one choice per pipeline rank -----------------------------------------------------
    def all_device_options(self) -> list[dict[int, tuple[float, tuple[int, int, int, str]]]]:
        """For every rank d and block count k it may hold: the fastest recompute mix (none, partial,
        full counts and the partial mode: selective or op) whose memory fits, and its time per
        micro-batch [s]. With k, the number of full-recompute blocks and the partial mode fixed, time is
        linear in the number of none-blocks and memory k*states + in_flight_d*(sum_r n_r*act_r) +
        max_r(working_r * [n_r > 0]) is linear too, so the optimum sits at an end of the feasible
        interval, computed in closed form (arrays over ranks d, counts k and full-recompute counts nf).
        One partial mode per rank: exact when the two partial modes' costs do not interleave (attention
        kernels that save nothing quadratic make selective cost what none costs)."""
        c = self.classes[0]
        rep = self.rep[c]
        modes = RECOMPUTE_MODES
        ok = {r: r in self.modes for r in modes}
        t = {r: self.block_time(c, r) for r in modes}
        costs = {r: self.cost(rep, r) for r in modes}
        v, L, p = self.cfg.vpp, self.cm.num_blocks, self.cfg.pp
        ks = np.arange(v, L - v * (p - 1) + 1)
        if ks.size == 0:
            return [{} for _ in range(p)]
        infl = np.array([in_flight_micro_batches(d, p, v, self.m) for d in range(p)])[:, None, None]
        cap = np.array([self.pl.budget / (1 + ALLOCATOR_RESERVE) - self.fixed_memory(d) for d in range(p)])[:, None, None]
        # A rank whose model states alone exceed its memory holds no more blocks (every other term is
        # >= 0): dropping those counts shrinks the grid without changing any option (+1 for rounding).
        state = self.block_memory(c)
        if state > 0:
            ks = ks[ks <= math.floor(float(cap.max()) / state) + 1]
            if ks.size == 0:
                return [{} for _ in range(p)]
        act = {r: infl * costs[r].act_bytes for r in modes}
        work = {r: costs[r].working_bytes for r in modes}
        K, NF = np.meshgrid(ks, np.arange(0, ks[-1] + 1 if ok["full"] else 1), indexing="ij")
        K, NF = K[None], NF[None]
        valid = NF <= K
        # the end of the backward's peak (CostModel.reduce_peak), the same for any recompute mix: a bound on k
        end_cap = self.pl.budget / (1 + ALLOCATOR_RESERVE)
        valid = valid & (np.array([self.reduce_fixed(d) for d in range(p)])[:, None, None]
                         + K * self.block_end_memory(c) <= end_cap)
        rest = K - NF
        base = cap - K * self.block_memory(c) - NF * act["full"]   # for none/selective + working set
        w_full = np.maximum(np.where(NF > 0, work["full"], 0.0),
                            np.array([self.logits_floor(d) for d in range(p)])[:, None, None])
        shape = np.broadcast_shapes(base.shape, K.shape)
        best_t = np.full(shape, np.inf)
        best_na = np.zeros(shape, dtype=np.int64)
        best_ns = np.zeros(shape, dtype=np.int64)
        best_mode = np.zeros(shape, dtype=np.int64)        # index into PARTIAL_MODES

        def consider(na: np.ndarray, ns: np.ndarray, mode: int, allowed: np.ndarray) -> None:
            r = PARTIAL_MODES[mode]
            used = na * act["none"] + ns * act[r] + np.maximum(w_full, np.where(ns > 0, work[r], 0.0))
            time_ = na * t["none"] + ns * t[r] + NF * t["full"]
            better = allowed & valid & (used <= base) & (time_ < best_t)
            best_t[better] = np.broadcast_to(time_, shape)[better]
            best_na[better] = np.broadcast_to(na, shape)[better]
            best_ns[better] = np.broadcast_to(ns, shape)[better]
            best_mode[better] = mode

        # no partial block: the rest recompute nothing
        consider(rest, np.zeros_like(rest), 0, np.full(rest.shape, ok["none"]) | (rest == 0))
        for mode, r in enumerate(PARTIAL_MODES):
            if not ok[r]:
                continue
            # >= 1 block of partial mode r: na in [lo, hi] from one linear memory inequality
            r2 = base - np.maximum(w_full, work[r]) - rest * act[r]
            alpha = act["none"] - act[r]          # per rank (in-flight scaled)
            hi0 = rest - 1 if ok["none"] else np.zeros_like(rest)
            with np.errstate(divide="ignore", invalid="ignore"):
                pos = np.where(alpha > 0, np.minimum(hi0, np.floor(r2 / alpha)), hi0)
                hi = np.where((alpha > 0) & (r2 < 0), -1, np.where(alpha > 0, pos, hi0))
                lo = np.where(alpha < 0, np.maximum(0, np.ceil(r2 / alpha)), 0)
                hi = np.where((alpha == 0) & (r2 < 0), -1, hi)
            hi = np.nan_to_num(hi, nan=-1).astype(np.int64)
            lo = np.nan_to_num(lo, nan=0).astype(np.int64)
            fine = (rest > 0) & (lo <= hi)
            for na in (lo, hi):
                na = np.clip(na, 0, np.maximum(rest - 1, 0))
                consider(na, rest - na, mode, fine)
        j = np.argmin(best_t, axis=2)
        at = (np.arange(shape[0])[:, None], np.arange(shape[1])[None, :], j)   # plain indexing: cheaper than
        tb, nab, nsb, mb = best_t[at], best_na[at], best_ns[at], best_mode[at]  # take_along_axis here
        out: list[dict[int, tuple[float, tuple[int, int, int, str]]]] = []
        for d in range(p):
            fin = np.isfinite(tb[d])
            out.append({int(k): (float(tb[d, i]), (int(nab[d, i]), int(nsb[d, i]), int(k - nab[d, i] - nsb[d, i]),
                                                  PARTIAL_MODES[int(mb[d, i])]))
                        for i, k in enumerate(ks) if fin[i]})
        return out

    def options(self) -> list[dict[int, tuple[float, tuple[int, int, int]]]]:
        if not hasattr(self, "_options"):
            self._options = self.all_device_options()
        return self._options

    def min_max_time(self) -> tuple[float, list[int] | None]:
        """The smallest bottleneck time tau such that every rank d can hold k_d blocks with
        t*(d, k_d) + ends_d <= tau and sum k_d = L (bisection over the candidate times; t* grows with
        k and feasibility is downward closed), and a greedy assignment achieving it (computed once: the
        bounds, the greedy plan and CBC's cut and hint all read it)."""
        if not hasattr(self, "_min_max"):
            self._min_max = self._min_max_time()
        return self._min_max

    def _min_max_time(self) -> tuple[float, list[int] | None]:
        opts, L = self.options(), self.cm.num_blocks
        ends = [self._device_constants(d)[0] for d in range(self.cfg.pp)]
        table = [sorted((k, t + e) for k, (t, _) in o.items()) for o, e in zip(opts, ends)]
        cands = sorted({t for tab in table for _, t in tab})

        def take(tau: float) -> list[int] | None:
            ks = []
            for tab in table:
                fit = [k for k, t in tab if t <= tau]
                if not fit:
                    return None
                ks.append(max(fit))
            return ks if sum(ks) >= L else None
        lo, hi = 0, len(cands) - 1
        if not cands or take(cands[hi]) is None:
            return math.inf, None
        while lo < hi:
            mid = (lo + hi) // 2
            if take(cands[mid]) is None:
                lo = mid + 1
            else:
                hi = mid
        tau, cap = cands[lo], take(cands[lo])
        ks = [tab[0][0] for tab in table]
        need = L - sum(ks)
        times = [dict(tab) for tab in table]
        while need > 0:  # add blocks where the marginal time is smallest, within the caps
            d = min((d for d in range(len(ks)) if ks[d] < cap[d] and ks[d] + 1 in times[d]),
                    key=lambda d: (times[d][ks[d] + 1] - times[d][ks[d]], d), default=None)
            if d is None:
                return tau, None
            ks[d] += 1
            need -= 1
        return tau, ks

    def quick_relaxed_bound(self) -> float:
        """A cheaper lower bound on `relaxed_bound` (uniform blocks): each rank's fastest fitting time
        t*(d, k) relaxed to the linear program with fractional recompute counts and the working set cut
        to its floor (the logits on the last rank): k * t_none plus the cheapest way to free the memory
        k blocks of no recompute exceed, on the lower convex hull of the per-block (memory saved, time
        added) points of selective and full recompute. Then the convex-minorant bound of _relaxed without
        the min-max term, scaled down by 1e-9 so rounding never lifts it above relaxed_bound."""
        if tuple(self.modes) != RECOMPUTE_MODES:
            return -math.inf
        c = self.classes[0]
        rep_ = self.rep[c]
        v, L, p = self.cfg.vpp, self.cm.num_blocks, self.cfg.pp
        ks = np.arange(v, L - v * (p - 1) + 1, dtype=float)
        if ks.size == 0:
            return math.inf
        t = {r: self.block_time(c, r) for r in RECOMPUTE_MODES}
        act = {r: self.cost(rep_, r).act_bytes for r in RECOMPUTE_MODES}
        saving = [r for r in RECOMPUTE_MODES if r != "none"]
        cost = {r: t[r] - t["none"] for r in saving}
        if min(cost.values()) < 0 or min(act.values()) < 0:
            return -math.inf
        infl = np.array([in_flight_micro_batches(d, p, v, self.m) for d in range(p)], dtype=float)[:, None]
        cap = np.array([self.pl.budget / (1 + ALLOCATOR_RESERVE) - self.fixed_memory(d) - self.logits_floor(d)
                        for d in range(p)])[:, None]
        excess = ks[None, :] * (self.block_memory(c) + infl * act["none"]) - cap      # [p, K] bytes to free
        per_block = np.maximum(excess, 0.0) / ks[None, :]
        # (bytes freed, seconds added) per block of each mode, with the origin (no recompute): the lower
        # convex envelope at x is the smallest chord between two points whose freed bytes bracket x
        points = [(np.zeros_like(infl), 0.0)] + [(infl * (act["none"] - act[r]), cost[r]) for r in saving]
        extra = np.full(per_block.shape, np.inf)                                         # [p, K] s per block
        extra[per_block <= 0] = 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            for (xa, ca), (xb, cb) in itertools.combinations(points, 2):
                lo, hi = np.minimum(xa, xb), np.maximum(xa, xb)
                inside = (per_block >= lo) & (per_block <= hi) & (hi > lo)
                chord = ca + (per_block - xa) * (cb - ca) / (xb - xa)
                extra = np.where(inside, np.minimum(extra, chord), extra)
        times = ks[None, :] * (t["none"] + extra)                                        # [p, K]
        ends = np.array([self._device_constants(d)[0] for d in range(p)])
        base = float(np.sum(times[:, 0] + ends))
        floor_max = float(np.max(times[:, 0] + ends))
        need = L - p * v
        slopes = []
        for d in range(p):
            fin = np.isfinite(times[d])
            if not fin.any():
                return math.inf
            last = int(np.flatnonzero(fin)[-1])   # infeasibility only grows with k
            hull = _lower_hull(ks[: last + 1], times[d, : last + 1])
            for (k0, t0), (k1, t1) in zip(hull, hull[1:]):
                slopes.append(np.full(int(k1 - k0), (t1 - t0) / (k1 - k0)))
        allslopes = np.sort(np.concatenate(slopes)) if slopes else np.zeros(0)
        if allslopes.size < need:
            return math.inf
        total = base + float(allslopes[:need].sum())
        m = self.m
        return ((m - 1 / v) * max(total / p, floor_max) + total / v + self.sync_bound()) * (1 - 1e-9)

    def mixed_relaxed_bound(self) -> float:
        """A memory-aware lower bound on the step for mixed block classes (the CP-SAT model's counterpart of
        quick_relaxed_bound): y[c,d,r] >= 0 class-c blocks on rank d recomputed with mode r, every block placed
        (sum_{d,r} y = count_c), every rank at least vpp blocks, and each rank's add_memory rows with the working
        set at its floor (the logits on the last rank) and the block counts fractional, stage contiguity dropped;
        T_d = sum_{c,r} y[c,d,r] t(c, r) + rank d's ends and Tmax >= T_d as in add_stage_times, so
        min (m - 1/v) Tmax + sum_d T_d / v (GLOP) is at most every plan's pipeline term, and the step at least
        that plus sync_bound. The bottleneck rank, not the mean sum_d T_d / p: the in-flight activations make
        the first ranks recompute more (DeepSeek-V3 on 1024 H100s: 21 configurations left to CP-SAT, 28 with the
        mean). inf when the relaxation is infeasible (nothing fits); scaled down by 1e-6 against the CP-SAT
        model's rounding of its terms."""
        p, v, m = self.cfg.pp, self.cfg.vpp, self.m
        solver = pywraplp.Solver.CreateSolver("GLOP")
        cap = self.pl.budget / (1 + ALLOCATOR_RESERVE)
        unit = max(cap, 1.0)  # bytes in units of the cap and seconds in units of the step's scale: GLOP's tolerances
        scale = 1.0 / max(self.block_time(self.classes[0], "none") * self.cm.num_blocks, 1e-12)
        y = {(k, d, r): solver.NumVar(0, solver.infinity(), "") for k in self.classes for d in range(p)
             for r in self.modes}
        for k in self.classes:
            solver.Add(sum(y[k, d, r] for d in range(p) for r in self.modes) == self.class_counts[k])
        blocks = [(k, r) for k in self.classes for r in self.modes]
        for d in range(p):
            solver.Add(sum(y[k, d, r] for k, r in blocks) >= v)
            infl = in_flight_micro_batches(d, p, v, m)
            solver.Add(sum(y[k, d, r] * ((self.block_memory(k) + infl * self.cost(self.rep[k], r).act_bytes) / unit)
                           for k, r in blocks) <= (cap - self.fixed_memory(d) - self.logits_floor(d)) / unit)
            solver.Add(sum(y[k, d, r] * (self.block_end_memory(k) / unit) for k, r in blocks)
                       <= (cap - self.reduce_fixed(d)) / unit)
        stage = [sum(y[k, d, r] * (self.block_time(k, r) * scale) for k, r in blocks)
                 + self._device_constants(d)[0] * scale for d in range(p)]
        tmax = solver.NumVar(0, solver.infinity(), "")
        for t in stage:
            solver.Add(tmax >= t)
        solver.Minimize((m - 1 / v) * tmax + sum(stage) * (1 / v))
        status = solver.Solve()
        if status == pywraplp.Solver.INFEASIBLE:
            return math.inf
        if status != pywraplp.Solver.OPTIMAL:
            return -math.inf
        return (solver.Objective().Value() / scale + self.sync_bound()) * (1 - 1e-6)

    def relaxed_sum(self) -> float:
        """Lower bound on sum_d T_d: the convex-minorant greedy of `relaxed_bound`."""
        return self._relaxed()[0]

    def relaxed_bound(self) -> float:
        """A lower bound on this configuration's step time that respects memory (uniform blocks):
        min sum_d t*(d, k_d) s.t. sum_d k_d = L over the convex minorants of each rank's fastest-
        fitting time t*(d, k) (greedy on sorted marginal costs is exact for convex costs), then
        t >= (m - 1/v) * max(sum_T / p, max_d T_d(min)) + sum_T / v.  inf when nothing fits."""
        total, floor_max = self._relaxed()
        if math.isinf(total):
            return math.inf
        tau = self.min_max_time()[0]
        v, m, p = self.cfg.vpp, self.m, self.cfg.pp
        return (m - 1 / v) * max(total / p, floor_max, tau) + total / v + self.sync_bound()

    def sync_bound(self) -> float:
        """Lower bound on E + Opt: a maximum over ranks is at least their mean, and both terms are
        affine in the blocks a rank holds, whose mean is L/pp; E is at least each affine piece of
        comm.dp_overlap_cost, whose GPU idle time is at most every block's largest over the recompute modes.
        Computed once (lower_bound and both relaxed bounds add it) for the configurations that differ only in vpp:
        none of its terms reads vpp (the ends sit on the first and last rank whatever the interleaving; the
        collective schedule, covers and updates are per micro-batch and per block)."""
        if not hasattr(self, "_sync_bound"):
            key = replace(self.cfg, vpp=1)
            hit = self.pl._sync.get(key)
            if hit is None:
                hit = self.pl._sync[key] = self._compute_sync_bound()
            self._sync_bound = hit
        return self._sync_bound

    def _compute_sync_bound(self) -> float:
        if len(self.classes) != 1:
            return self._mixed_sync_bound()
        p, L = self.cfg.pp, self.cm.num_blocks
        rep = self.rep[self.classes[0]]
        sync_k, opt_k, cover_k, _ = self._dp_coefficients(rep)
        overlap = self.cm.overlap_grad_sync
        consts = [self._device_constants(d) for d in range(p)]
        sync = sum(c[1] for c in consts) / p + sync_k * L / p
        cover = (sum(c[3] for c in consts) / p + cover_k * L / p) if overlap else 0.0
        idle = self.m * (sum(c[5] for c in consts) / p + max(self.cost(rep, r).idle_s for r in self.modes) * L / p)
        e = max(dp_overlap_pieces(sync, cover, idle, self.cm.interference))
        # the optimizer term's update part and the per-step host work; the FSDP meetings (>= 0) left out
        o = sum(c[2] for c in consts) / p + opt_k * L / p + self.cm.host.step_s
        return max(e, 0.0) + o

    def _mixed_sync_bound(self) -> float:
        """sync_bound for mixed block classes, from add_data_parallel's rows: E and Opt are at least each rank's
        affine terms, so at least their mean over the ranks, which sums every block's coefficient once (per class:
        its count); a block's backward cover and GPU idle at their largest over the recompute modes, and the
        expert groups' constant (>= 0) left out. The CP-SAT model's search prunes on it (DeepSeek-V3's 3 dense +
        58 MoE blocks: without it every configuration whose memory-blind pipeline bound is below the incumbent
        was solved, on 1024 GPUs past the search's time limit)."""
        c, p, m = self.cfg, self.cfg.pp, self.m
        ds, dc, es, _ = self.dp_time_linear()
        const = (dc if c.dense_dp > 1 else 0.0) * p
        sync = cover = idle = 0.0
        opt = self.cm.host.step_s * p
        for name in ("pre", "post"):
            pa, pe = self.params_of(name)
            const += ds * (pa - pe) + es * pe
            opt += self.opt_time(name)
            cover += self.cover(self.cost(name, "none"))
            idle += m * self.cost(name, "none").idle_s
        for cls, k in self.class_counts.items():
            pa, pe = self.params_of(self.rep[cls])
            sync += k * (ds * (pa - pe) + (es * pe if c.expert_dp > 1 else 0.0))
            opt += k * self.opt_time(self.rep[cls])
            costs = [self.cost(self.rep[cls], r) for r in self.modes]
            cover += k * max(self.cover(sc) for sc in costs)
            idle += k * m * max(sc.idle_s for sc in costs)
        if not self.cm.overlap_grad_sync:
            cover = 0.0
        e = max(dp_overlap_pieces((const + sync) / p, cover / p, idle / p, self.cm.interference))
        return max(e, 0.0) + opt / p

    def _relaxed(self) -> tuple[float, float]:
        """(convex-minorant lower bound on sum_d T_d, largest single-rank minimum time)."""
        if hasattr(self, "_relaxed_cache"):
            return self._relaxed_cache
        opts = self.options()
        self._relaxed_cache = (math.inf, math.inf)
        if any(not o for o in opts):
            return self._relaxed_cache
        L = self.cm.num_blocks
        base = 0.0
        need = L
        slopes: list[np.ndarray] = []
        floor_max = 0.0
        for d, o in enumerate(opts):
            ks = np.array(sorted(o))
            ts = np.array([o[k][0] for k in ks])
            ends = self._device_constants(d)[0]
            base += ts[0] + ends
            floor_max = max(floor_max, ts[0] + ends)
            need -= int(ks[0])
            hull = _lower_hull(ks, ts)
            for (k0, t0), (k1, t1) in zip(hull, hull[1:]):
                slopes.append(np.full(int(k1 - k0), (t1 - t0) / (k1 - k0)))
        if need < 0:
            return self._relaxed_cache
        allslopes = np.sort(np.concatenate(slopes)) if slopes else np.zeros(0)
        if allslopes.size < need:
            return self._relaxed_cache
        self._relaxed_cache = (base + float(allslopes[:need].sum()), floor_max)
        return self._relaxed_cache

    def solve_uniform(self, below: float = math.inf) -> Plan | None:
        """x[d,k] = 1 when rank d holds k blocks (each with its fastest fitting recompute mix):
            sum_k x[d,k] = 1,  sum_{d,k} k x[d,k] = L,  k >= vpp (every virtual stage >= 1 block)
            T_d = sum_k t(d,k) x[d,k] + ends_d + vpp * p2p;  Tmax >= T_d
            E >= sync_d - overlap_d,  Opt >= optimizer_d        (see add_data_parallel)
            minimize m*Tmax + (sum_d T_d - Tmax)/vpp + E + Opt        (= the step time, seconds).
        With `below` (pp > 2), only over the block counts that can give a step faster than it (options_below):
        None then also when no plan of this configuration is faster."""
        p, L = self.cfg.pp, self.cm.num_blocks
        options = self.options()
        if any(not o for o in options):
            self.proven = True  # some rank has no fitting block count: infeasible in closed form
            return None
        if p <= 2:  # one or two ranks: enumerate the assignments exactly (the MIP's optimum, no solver)
            pairs = ([[L]] if L in options[0] else []) if p == 1 else \
                [[k, L - k] for k in options[0] if L - k in options[1]]
            if not pairs:
                self.proven = True  # no split of the blocks fits
                return None
            best = min(pairs, key=lambda c: (self._uniform_objective(c, options), c))
            self.proven = True
            return self._uniform_plan(best, options)
        if below < math.inf:
            options = self.options_below(below)
            if options is None:
                self.proven = True  # no block count of some rank can beat `below`
                return None
        return self._cbc(options, below)

    def _cbc(self, options: list[dict], below: float) -> Plan | None:
        """solve_uniform's MIP over `options` on OR-Tools' CBC: continuous times in seconds, binary x;
        single-threaded and deterministic. The cuts close most of the LP gap, so it solves in milliseconds."""
        p = self.cfg.pp
        solver, x = self._uniform_program("CBC", options)
        status = solver.Solve()
        if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            self.proven = status == pywraplp.Solver.INFEASIBLE  # else stopped at the limit: unknown
            return None
        self.proven = status == pywraplp.Solver.OPTIMAL
        plan = self._uniform_plan([next(k for k in options[d] if x[d, k].solution_value() > 0.5) for d in range(p)],
                                  options)
        return plan if self.objective < below else None  # the window is necessary for `below`, not sufficient

    def options_below(self, below: float) -> list[dict] | None:
        """The options (all_device_options) of block counts that a plan faster than `below` can use, or None when
        some rank keeps none. The step is at least (m - 1/v) Tmax + sum_d T_d / v + E + Opt with sum_d T_d >=
        relaxed_sum and E + Opt >= sync_bound, so a faster plan has Tmax < (below - relaxed_sum / v - sync_bound)
        / (m - 1/v), and every rank's time at its count is at most Tmax. With many micro-batches the window is a
        block or two wide: CBC's program shrinks to a few variables a rank and its LP bound tightens."""
        options = self.options()
        v, m = self.cfg.vpp, self.m
        if m - 1 / v <= 0:
            return options
        t_hi = (below - self.relaxed_sum() / v - self.sync_bound()) / (m - 1 / v) * (1 + 1e-9)
        out = []
        for d, o in enumerate(options):
            ends = self._device_constants(d)[0]
            kept = {k: val for k, val in o.items() if val[0] + ends <= t_hi}
            if not kept:
                return None
            out.append(kept)
        return out

    def _uniform_program(self, backend: str, options: list[dict]
                         ) -> tuple[pywraplp.Solver, dict[tuple[int, int], pywraplp.Variable]]:
        """solve_uniform's program over `options` on `backend`: "CBC" with binary x, or "GLOP" with x relaxed to
        [0, 1] (its optimum then a lower bound on the MIP's: `improve`)."""
        cfg, p, L = self.cfg, self.cfg.pp, self.cm.num_blocks
        solver = pywraplp.Solver.CreateSolver(backend)
        solver.SetNumThreads(1)
        solver.SetTimeLimit(20_000)
        relax = backend == "GLOP"
        x = {(d, k): solver.NumVar(0, 1, f"x{d}_{k}") if relax else solver.BoolVar(f"x{d}_{k}")
             for d in range(p) for k in options[d]}
        for d in range(p):
            solver.Add(sum(x[d, k] for k in options[d]) == 1)
        solver.Add(sum(k * var for (d, k), var in x.items()) == L)
        sync_k, opt_k, cover_k, coll_k = self._dp_coefficients(self.rep[self.classes[0]])
        overlap = self.cm.overlap_grad_sync
        inf = solver.infinity()
        T = [solver.NumVar(0, inf, f"T{d}") for d in range(p)]
        Tmax, E, Opt = solver.NumVar(0, inf, "Tmax"), solver.NumVar(0, inf, "E"), solver.NumVar(0, inf, "Opt")
        step = self.cm.host.step_s
        for d in range(p):
            ends, sync0, opt0, cover0, tail0, idle0 = self._device_constants(d)
            solver.Add(T[d] == ends + sum(options[d][k][0] * x[d, k] for k in options[d]))
            solver.Add(Tmax >= T[d])
            # E >= each affine piece of comm.dp_overlap_cost's exposure + interference (T sync, W cover, S idle)
            sync = sync0 + sum(sync_k * k * x[d, k] for k in options[d])
            cover = (cover0 + sum(cover_k * k * x[d, k] for k in options[d])) if overlap else 0.0
            idle = self.m * (idle0 + sum(self.option_total(options[d][k][1], "idle_s") * x[d, k] for k in options[d]))
            for piece in dp_overlap_pieces(sync, cover, idle, self.cm.interference):
                solver.Add(E >= piece)
            # Opt >= the update, and >= it plus the FSDP meetings less the host's lead
            # (CostModel.tail_host_time: a max of two affine terms, exact under minimization)
            solver.Add(Opt >= opt0 + step + sum(opt_k * k * x[d, k] for k in options[d]))
            solver.Add(Opt >= opt0 + step + tail0 + sum(
                (opt_k * k + coll_k * k - self.m * self.option_total(options[d][k][1], "lead_s")) * x[d, k] for k in options[d]))
        # Valid cuts that close most of the LP gap: the exact min-max stage time (bisection) and the
        # convex-minorant bound on the summed stage time; the greedy assignment at that min-max warm-starts.
        tau, hint = self.min_max_time()
        solver.Add(Tmax >= tau * (1 - 1e-9))
        solver.Add(sum(T) >= self.relaxed_sum() * (1 - 1e-9))
        if hint is not None and all(k in o for k, o in zip(hint, options)):
            solver.SetHint([x[d, k] for d in range(p) for k in options[d]],
                           [1.0 if hint[d] == k else 0.0 for d in range(p) for k in options[d]])
        v, m = cfg.vpp, self.m
        solver.Minimize(m * Tmax + (sum(T) - Tmax) * (1.0 / v) + E + Opt)
        return solver, x

    def improve(self, incumbent: float) -> Plan | None:
        """Uniform blocks, pp > 2: this configuration's best plan where it is faster than `incumbent`, else None.
        First the LP relaxation of solve_uniform's program over options_below (GLOP, about a millisecond against
        CBC's tens): at or above `incumbent` nothing here can beat it; an integral LP optimum is the MIP's
        optimum; else CBC. The LP's objective equals estimate's to ~1e-9 (test_planner_objective): the 1e-7
        margin has a near tie solved, not pruned on rounding."""
        below = incumbent * (1 + 1e-7)
        options = self.options_below(below)
        if options is None:
            self.proven = True
            return None
        solver, x = self._uniform_program("GLOP", options)
        status = solver.Solve()
        if status == pywraplp.Solver.INFEASIBLE or (status == pywraplp.Solver.OPTIMAL
                                                    and solver.Objective().Value() >= below):
            self.proven = True
            return None
        if status == pywraplp.Solver.OPTIMAL:
            counts = [[k for k in options[d] if x[d, k].solution_value() > 1 - 1e-6] for d in range(self.cfg.pp)]
            if all(len(c) == 1 for c in counts) and sum(c[0] for c in counts) == self.cm.num_blocks:
                self.proven = True
                return self._uniform_plan([c[0] for c in counts], options)
        return self._cbc(options, below)

    def greedy_plan(self) -> Plan | None:
        """Uniform blocks: the plan of min_max_time's greedy assignment (every rank within the min-max stage
        time, the other blocks added where the marginal time is least), or None. A real plan, and on the
        llama3-70b case of benchmarks/plan_speed.py CBC's optimum in each of its 15 solves: the search takes
        it as an incumbent and runs CBC only where a bound says the optimum may be better (Planner._solve)."""
        options = self.options()
        if any(not o for o in options):
            return None
        _, hint = self.min_max_time()
        return None if hint is None else self._uniform_plan(hint, options)

    def _uniform_objective(self, counts: list[int], options: list[dict]) -> float:
        """The uniform model's step time [s] at block counts per rank (solve_uniform's objective)."""
        v, m = self.cfg.vpp, self.m
        sync_k, opt_k, cover_k, coll_k = self._dp_coefficients(self.rep[self.classes[0]])
        overlap = self.cm.overlap_grad_sync
        t_d = [self._device_constants(d)[0] + options[d][k][0] for d, k in enumerate(counts)]
        e_d = [sum(dp_overlap_cost(
            self._device_constants(d)[1] + sync_k * k,
            (self._device_constants(d)[3] + cover_k * k) if overlap else 0.0,
            self.m * (self._device_constants(d)[5] + self.option_total(options[d][k][1], "idle_s")), self.cm.interference))
            for d, k in enumerate(counts)]
        o_d = [self._device_constants(d)[2] + opt_k * k + self.cm.tail_host_time(
            self._device_constants(d)[4] + coll_k * k, self.m * self.option_total(options[d][k][1], "lead_s"))
            for d, k in enumerate(counts)]
        return m * max(t_d) + (sum(t_d) - max(t_d)) / v + max(0.0, *e_d) + max(0.0, *o_d)

    def _uniform_plan(self, counts: list[int], options: list[dict]) -> Plan:
        """The plan of block counts per rank, and the model's step time at it (self.objective, evaluated
        here rather than read from CBC, whose continuous variables satisfy their rows only within its
        primal tolerance, 1e-7 absolute)."""
        p, v = self.cfg.pp, self.cfg.vpp
        self.objective = self._uniform_objective(counts, options)
        stage_layers = [0] * self.S
        mix_of_stage: list[list[str]] = [[] for _ in range(self.S)]
        for d, k in enumerate(counts):
            chunks = [k // v + (1 if j < k % v else 0) for j in range(v)]
            na, ns_, nf, partial = options[d][k][1]
            modes = ["full"] * nf + [partial] * ns_ + ["none"] * na
            for j, size in enumerate(chunks):
                stage_layers[j * p + d] = size
                mix_of_stage[j * p + d] = modes[:size]
                modes = modes[size:]
        recompute = tuple(r for st in mix_of_stage for r in st)
        return replace(self.plan0, stage_layers=tuple(stage_layers), recompute=recompute)

    def _dp_coefficients(self, rep: str) -> tuple[float, float, float, float]:
        """Per block on a rank: (gradient-sync seconds, optimizer seconds, backward cover seconds, FSDP
        meeting seconds)."""
        c = self.cfg
        ds, _, es, _ = self.dp_time_linear()
        pa, pe = self.params_of(rep)
        sync = ds * (pa - pe) + (es * pe if c.expert_dp > 1 else 0.0)
        return sync, self.opt_time(rep), self.cover(self.cost(rep, "none")), self.collective_time(rep)

    def opt_time(self, name: str) -> float:
        """The update of one segment's parameters on its rank (CostModel._data_parallel_time)."""
        pa, _ = self.params_of(name)
        return pa * self.cm.optimizer_seconds_per_param(self.plan0)

    def collective_time(self, name: str) -> float:
        """The ranks' meetings at one segment's FSDP collectives: host work that the host's lead hides
        (CostModel.fsdp_collective_time, tail_host_time)."""
        seg = self.segs[name]
        return self.cm.fsdp_collective_time(self.plan0, self.cm.fsdp_units(seg, self.plan0))

    def option_total(self, mix: tuple[int, int, int, str], field: str) -> float:
        """A SegmentCost field (lead_s, idle_s) summed over a uniform rank option's blocks (none, partial, full
        counts)."""
        na, ns_, nf, partial = mix
        rep = self.rep[self.classes[0]]
        return (na * getattr(self.cost(rep, "none"), field) + ns_ * getattr(self.cost(rep, partial), field)
                + nf * getattr(self.cost(rep, "full"), field))

    def _device_constants(self, d: int) -> tuple[float, float, float, float, float, float]:
        if not hasattr(self, "_consts"):
            self._consts = [self._compute_device_constants(r) for r in range(self.cfg.pp)]
        return self._consts[d]

    def ends_time(self, d: int, vpp: int) -> float:
        """Rank d's time per micro-batch outside its blocks with vpp virtual stages per rank: p2p of
        its virtual stages plus the ends (embeddings on the first stage, head on the last) it runs."""
        p = self.cfg.pp
        time_ = self.p2p_per_virtual_stage * vpp
        for s, name in ((0, "pre"), (p * vpp - 1, "post")):
            if s % p == d:
                time_ += self.cost(name, "none").total_s
        return time_

    def _compute_device_constants(self, d: int) -> tuple[float, float, float, float, float, float]:
        """Rank d's partition-independent terms: (time of its ends + p2p, gradient-sync constant and
        its ends' sync, update time of its ends, backward cover of its ends, its ends' FSDP meetings less
        m * their lead, its ends' GPU idle per micro-batch)."""
        c, p = self.cfg, self.cfg.pp
        ds, dc, es, ec = self.dp_time_linear()
        time_ = self.ends_time(d, c.vpp)
        sync = dc if c.dense_dp > 1 else 0.0
        if c.expert_dp > 1 and self.params_of(self.rep[self.classes[0]])[1] > 0:
            sync += ec
        opt = cover = tail = idle = 0.0
        for s, name in ((0, "pre"), (self.S - 1, "post")):
            if s % p != d:
                continue
            sc = self.cost(name, "none")
            pa, pe = self.params_of(name)
            sync += ds * (pa - pe) + es * pe
            opt += self.opt_time(name)
            cover += self.cover(sc)
            tail += self.collective_time(name) - self.m * sc.lead_s
            idle += sc.idle_s
        return time_, sync, opt, cover, tail, idle

    # ---- general: mixed block classes, contiguous boundaries ----------------------------------------------
    def solve_general(self, below: float = math.inf, time_limit_s: float = SOLVE_TIME_S) -> Plan | None:
        """The CP-SAT model (mixed block classes). With `below`, only plans whose step the model puts under it
        (None, proven, when there is none): a configuration the search's incumbent already beats is then a short
        infeasibility proof, not a search for its own optimum to the time limit (DeepSeek-V3's 3 dense + 58 MoE
        blocks on 1024 H100s: 20 s a pp=4 configuration before).

        Every term reads the partition only through each rank's class counts (the sums over its stages), so the
        model is solved in two steps: over the counts alone (`add_rank_counts`, a relaxation: any counts that
        add up, no partition), then a partition that gives the optimum's counts is sought (`realize`). Found, the
        relaxation's optimum is the model's. The partition's variables had made every rank-count vector many
        solutions to tell apart: Gemma 3 27B's pp4 x vpp3-5 configurations ran to the 20 s limit each, where the
        two steps prove them in 1-6 s. Counts no partition gives are excluded and the relaxation solved again, up to
        REALIZE_TRIES times (Cohere 2's global layers, one in four: 6 tries at pp4 x vpp8, 32 stages for 40
        blocks); past those, or where no partition was found in time, the whole model is solved, bounded below by
        the relaxation."""
        deadline = time.perf_counter() + time_limit_s
        model = cp_model.CpModel()
        cnt = self.add_rank_counts(model)
        n, objective = self.add_terms(model, cnt, below)
        keys = [(d, c) for d in range(self.cfg.pp) for c in self.classes]
        bound = 0
        for _ in range(REALIZE_TRIES):
            solver = self._solver(max(0.5, deadline - time.perf_counter()), restarts=True)
            status = solver.Solve(model)
            if not self._solved(solver, status):
                return None
            counts = {k: solver.Value(cnt[k]) for k in keys}
            starts, none = self.realize(counts, min(REALIZE_TIME_S, max(0.5, deadline - time.perf_counter())))
            if starts is not None:
                return self._plan_of(starts, {k: solver.Value(x) for k, x in n.items()})
            bound = int(math.floor(solver.BestObjectiveBound()))
            if status != cp_model.OPTIMAL or not none:
                break
            # no partition gives these counts: the relaxation without them is still one, and at least as slow
            model.AddForbiddenAssignments([cnt[k] for k in keys], [[counts[k] for k in keys]])
            model.Add(objective >= bound)
        return self._solve_partitioned(below, max(time_limit_s / 4, deadline - time.perf_counter()), bound)

    def _solve_partitioned(self, below: float, time_limit_s: float, bound: int = 0) -> Plan | None:
        """The whole model, the partition's boundaries its variables (`add_partition`); `bound`: a lower bound
        on its objective in integer units (the rank-count relaxation's)."""
        model = cp_model.CpModel()
        B, cnt = self.add_partition(model)
        n, objective = self.add_terms(model, cnt, below)
        model.Add(objective >= bound)
        solver = self._solver(time_limit_s)
        if not self._solved(solver, solver.Solve(model)):
            return None
        return self._plan_of([solver.Value(b) for b in B], {k: solver.Value(x) for k, x in n.items()})

    def _solved(self, solver: cp_model.CpSolver, status: int) -> bool:
        """Whether CP-SAT found a plan: then `objective` (its integer units back to seconds) and `proven` (OPTIMAL);
        else `proven` says whether none exists (INFEASIBLE) or none was found in time."""
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            self.proven = status == cp_model.INFEASIBLE
            return False
        self.objective = solver.ObjectiveValue() / (self.cfg.vpp * self.ns)
        self.proven = status == cp_model.OPTIMAL
        return True

    def add_terms(self, model: cp_model.CpModel, cnt, below: float = math.inf):
        """Recompute counts, stage times, memory and the data-parallel terms over the class counts `cnt[s, c]`;
        the objective v m Tmax + sum T - Tmax + v E + v Opt minimized (with `below`: kept under it).
        Returns (n, objective)."""
        n, used = self.add_recompute(model, cnt)
        T, Tmax = self.add_stage_times(model, cnt, n)
        self.add_memory(model, cnt, n, used)
        E, Opt = self.add_data_parallel(model, cnt, n)
        v, m = self.cfg.vpp, self.m
        objective = v * m * Tmax + sum(T) - Tmax + v * E + v * Opt
        model.Minimize(objective)
        if below < math.inf:
            # in the model's integer units (RESOLUTION of the step's work: each term rounds by half a unit, so
            # the model's step is within ~1e-5 of estimate's); the 1e-4 margin keeps a near tie in
            model.Add(objective <= int(below * (1 + 1e-4) * v * self.ns))
        return n, objective

    def _plan_of(self, starts: Sequence[int], n: dict[tuple, int]) -> Plan:
        """The plan of stage boundaries `starts` (B_0 .. B_S) and per-rank recompute counts `n[d, c, r]`."""
        stage_layers = [starts[s + 1] - starts[s] for s in range(self.S)]
        recompute = [""] * self.cm.num_blocks
        for d in range(self.cfg.pp):  # each rank's mode counts over its blocks, stage by stage
            left = {(c, r): n[d, c, r] for c in self.classes for r in self.modes}
            for s in range(d, self.S, self.cfg.pp):
                for j in range(starts[s], starts[s] + stage_layers[s]):
                    c = self.cm.block_class[j]
                    r = next(r for r in reversed(self.modes) if left[c, r] > 0)  # full first, then selective
                    left[c, r] -= 1
                    recompute[j] = r
        return replace(self.plan0, stage_layers=tuple(stage_layers), recompute=tuple(recompute))

    def add_rank_counts(self, model: cp_model.CpModel):
        """The relaxation of `add_partition`: N[d,c] >= 0 class-c blocks on pipeline rank d, sum_d N[d,c] = L_c,
        sum_c N[d,c] >= v (a block per virtual stage), with no partition behind them; as cnt, N[d,c] on rank
        d's first stage and 0 on its others (every term reads cnt through sum_{s on d} cnt[s,c] only)."""
        p = self.cfg.pp
        cnt: dict[tuple[int, int], object] = {}
        for d in range(p):
            for c in self.classes:
                cnt[d, c] = model.NewIntVar(0, self.class_counts[c], f"N{d}_{c}")
            model.Add(sum(cnt[d, c] for c in self.classes) >= self.cfg.vpp)
        for c in self.classes:
            model.Add(sum(cnt[d, c] for d in range(p)) == self.class_counts[c])
        for s in range(p, self.S):
            for c in self.classes:
                cnt[s, c] = 0
        return cnt

    def realize(self, counts: dict[tuple[int, int], int], time_limit_s: float) -> tuple[list[int] | None, bool]:
        """(boundaries B_0 .. B_S of a contiguous partition whose ranks hold `counts[d, c]` blocks of class c
        (`add_partition`'s constraints with sum_{s on d} cnt[s,c] = counts[d,c]), True); (None, True) where no
        partition gives them, (None, False) where none was found in `time_limit_s`."""
        model = cp_model.CpModel()
        B, cnt = self.add_partition(model)
        p = self.cfg.pp
        for d in range(p):
            for c in self.classes:
                model.Add(sum(cnt[s, c] for s in range(d, self.S, p)) == counts[d, c])
        solver = self._solver(time_limit_s)
        status = solver.Solve(model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None, status == cp_model.INFEASIBLE
        return [solver.Value(b) for b in B], True

    def add_partition(self, model: cp_model.CpModel):
        """Contiguous partition: 0 = B_0 < B_1 < ... < B_S = L (every virtual stage >= 1 block);
        cnt[s,c] = P_c[B_{s+1}] - P_c[B_s] with P_c[k] = number of class-c blocks among the first k
        (AddElement), so stages may be uneven and mixed-class models stay exact."""
        L = self.cm.num_blocks
        B = [model.NewIntVar(0, L, f"B{s}") for s in range(self.S + 1)]
        model.Add(B[0] == 0)
        model.Add(B[self.S] == L)
        for s in range(self.S):
            model.Add(B[s + 1] >= B[s] + 1)
        cnt = {}
        if len(self.classes) == 1:
            c = self.classes[0]
            for s in range(self.S):
                cnt[s, c] = B[s + 1] - B[s]
            return B, cnt
        prefix = {c: [0] for c in self.classes}
        for j in range(L):
            for c in self.classes:
                prefix[c].append(prefix[c][-1] + (self.cm.block_class[j] == c))
        pc = {}
        for s in range(self.S + 1):
            for c in self.classes:
                pc[s, c] = model.NewIntVar(0, L, f"P{s}_{c}")
                model.AddElement(B[s], prefix[c], pc[s, c])
        for s in range(self.S):
            for c in self.classes:
                cnt[s, c] = pc[s + 1, c] - pc[s, c]
        return B, cnt

    def add_recompute(self, model: cp_model.CpModel, cnt):
        """n[d,c,r] >= 0 blocks of class c on pipeline rank d recomputed with mode r; sum_r n[d,c,r] =
        sum_{s on d} cnt[s,c]; used[d,c,r] = (n[d,c,r] >= 1) for the working-set term. Per rank, not per stage:
        every term that reads them (time, memory, the data-parallel rows) sums a rank's stages with the same
        coefficients, so which of its stages holds a mode changes no value, and the per-stage variables only
        multiplied the solutions CP-SAT had to tell apart (a 64-block Mamba-2 on 8 H100s: pp2 x vpp7, 14
        stages, ran to the 20 s limit)."""
        L, p = self.cm.num_blocks, self.cfg.pp
        n, used = {}, {}
        for d in range(p):
            for c in self.classes:
                for r in self.modes:
                    n[d, c, r] = model.NewIntVar(0, L, f"n{d}_{c}_{r}")
                    used[d, c, r] = model.NewBoolVar(f"u{d}_{c}_{r}")
                    model.Add(n[d, c, r] <= L * used[d, c, r])
                model.Add(sum(n[d, c, r] for r in self.modes) == sum(cnt[s, c] for s in range(d, self.S, p)))
        return n, used

    def add_stage_times(self, model: cp_model.CpModel, cnt, n):
        """T_d = sum_{c,r} n[d,c,r] * t(c,r) + sum_{s on d} [ pre/post + p2p ] (ns per micro-batch);
        Tmax >= T_d for every pipeline rank d (the bottleneck stage)."""
        p = self.cfg.pp
        # the bound sums the same rounded terms as the stage times: rounding each block's time to whole units
        # pushed a stage of all-slowest blocks past a bound rounded once (a 26-block Gemma 3 with recompute
        # pinned to one mode was INFEASIBLE by 13 units)
        def units(seconds: float) -> int:
            return int(round(self.ns * seconds))

        horizon = (units(self.cost("pre", "none").total_s) + units(self.cost("post", "none").total_s)
                   + units(self.p2p_per_virtual_stage) * self.S
                   + sum(max(units(self.block_time(c, r)) for r in self.modes) * k for c, k in self.class_counts.items()))
        T = []
        for d in range(p):
            expr = sum(units(self.block_time(c, r)) * n[d, c, r] for c in self.classes for r in self.modes)
            for s in range(d, self.S, p):
                expr += units(self.p2p_per_virtual_stage)
                if s == 0:
                    expr += units(self.cost("pre", "none").total_s)
                if s == self.S - 1:
                    expr += units(self.cost("post", "none").total_s)
            t = model.NewIntVar(0, horizon, f"T{d}")
            model.Add(t == expr)
            T.append(t)
        Tmax = model.NewIntVar(0, horizon, "Tmax")
        for t in T:
            model.Add(Tmax >= t)
        self.T = T
        return T, Tmax

    def add_memory(self, model: cp_model.CpModel, cnt, n, used) -> None:
        """(1 + reserve) * [ fixed_d + sum_{s on d,c} cnt[s,c] * states(c)
                              + in_flight(d) * sum_{c,r} n[d,c,r] * act(c,r) + W_d ] <= budget,
        W_d >= working(c,r) * used[d,c,r]  (the largest rematerialized block during its backward), and
        (1 + reserve) * [ reduce_fixed_d + sum_{s on d,c} cnt[s,c] * end_states(c) ] <= budget (the backward's
        end, CostModel.reduce_peak)."""
        p = self.cfg.pp
        cap = int(self.pl.budget / (1 + ALLOCATOR_RESERVE) / self.mem_unit)
        for d in range(p):
            infl = in_flight_micro_batches(d, p, self.cfg.vpp, self.m)
            W = model.NewIntVar(0, cap * 4 + 1, f"W{d}")
            model.Add(W >= int(math.ceil(self.logits_floor(d) / self.mem_unit)))
            expr = int(math.ceil(self.fixed_memory(d) / self.mem_unit)) + W
            for s in range(d, self.S, p):
                for c in self.classes:
                    expr += int(math.ceil(self.block_memory(c) / self.mem_unit)) * cnt[s, c]
            for c in self.classes:
                for r in self.modes:
                    sc = self.cost(self.rep[c], r)
                    expr += int(math.ceil(infl * sc.act_bytes / self.mem_unit)) * n[d, c, r]
                    model.Add(W >= int(math.ceil(sc.working_bytes / self.mem_unit)) * used[d, c, r])
            model.Add(expr <= cap)
            # the end of the backward (CostModel.reduce_peak): every gradient and the largest unit's reduce buffer
            end = int(math.ceil(self.reduce_fixed(d) / self.mem_unit))
            for s in range(d, self.S, p):
                for c in self.classes:
                    end += int(math.ceil(self.block_end_memory(c) / self.mem_unit)) * cnt[s, c]
            model.Add(end <= cap)

    def add_data_parallel(self, model: cp_model.CpModel, cnt, n):
        """E >= dp_sync_d - overlap_d, E >= 0 (gradient sync hidden behind the last backward; ZeRO-3:
        behind all compute), and E >= the two pieces of the work's slowdown beside it (comm.dp_overlap_cost:
        kappa sync_d - idle_d, sync_d - (1 - kappa) overlap_d - idle_d); O >= optimizer_d = local params *
        32 B / (mem BW * eff). Both in ns."""
        c = self.cfg
        kappa = self.cm.interference
        ds, dc, es, ec = self.dp_time_linear()
        big = int(RESOLUTION * 1e4)
        E = model.NewIntVar(0, big, "E")
        Opt = model.NewIntVar(0, big, "Opt")
        p = c.pp
        for d in range(p):
            sync = 0
            opt = int(round(self.ns * self.cm.host.step_s))  # per-step host work (CostModel.tail_host_time)
            tail = 0  # the FSDP meetings less the host's lead, on top of opt when positive
            overlap = idle = 0
            kappa_sync = rest_overlap = 0  # kappa * sync and (1 - kappa) * overlap, rounded term by term
            has_dense = c.dense_dp > 1
            has_exp = c.expert_dp > 1
            const = (dc if has_dense else 0.0)
            ends = [name for s, name in ((0, "pre"), (self.S - 1, "post")) if s % p == d]
            for name in ends:
                pa, pe = self.params_of(name)
                const += ds * (pa - pe) + es * pe
                opt += int(round(self.ns * self.opt_time(name)))
                tail += int(round(self.ns * (self.collective_time(name) - self.m * self.cost(name, "none").lead_s)))
                overlap += int(round(self.ns * self.cover(self.cost(name, "none"))))
                rest_overlap += int(round(self.ns * (1 - kappa) * self.cover(self.cost(name, "none"))))
                idle += int(round(self.ns * self.m * self.cost(name, "none").idle_s))
            has_exp_blocks = False
            for s in range(d, self.S, p):
                for cls in self.classes:
                    pa, pe = self.params_of(self.rep[cls])
                    has_exp_blocks |= pe > 0
                    coef = ds * (pa - pe) + (es * pe if has_exp else 0.0)
                    sync += int(round(self.ns * coef)) * cnt[s, cls]
                    kappa_sync += int(round(self.ns * kappa * coef)) * cnt[s, cls]
                    opt += int(round(self.ns * self.opt_time(self.rep[cls]))) * cnt[s, cls]
                    tail += int(round(self.ns * self.collective_time(self.rep[cls]))) * cnt[s, cls]
            for cls in self.classes:
                for r in self.modes:
                    sc = self.cost(self.rep[cls], r)
                    ov = self.cover(sc)
                    overlap += int(round(self.ns * ov)) * n[d, cls, r]
                    rest_overlap += int(round(self.ns * (1 - kappa) * ov)) * n[d, cls, r]
                    idle += int(round(self.ns * self.m * sc.idle_s)) * n[d, cls, r]
                    tail -= int(round(self.ns * self.m * sc.lead_s)) * n[d, cls, r]
            if has_exp and has_exp_blocks:
                const += ec
            if not self.cm.overlap_grad_sync:
                overlap = rest_overlap = 0
            # comm.dp_overlap_pieces, each term rounded to the model's integer units
            model.Add(E >= int(round(self.ns * const)) + sync - overlap)
            model.Add(E >= int(round(self.ns * kappa * const)) + kappa_sync - idle)
            model.Add(E >= int(round(self.ns * const)) + sync - rest_overlap - idle)
            model.Add(Opt >= opt)
            model.Add(Opt >= opt + tail)
        return E, Opt


# ---------------------------------------------------------------------------------------------------------
def solve(graph: OpGraph, cluster: Cluster, global_batch: int, seq_len: int,
          max_memory_bytes: float | None = None, fix=None, top_k: int = 3, model_name: str = "",
          progress: bool = False, placements: dict[str, str] | None = None) -> PlanResult:
    """Plan `graph` on `cluster` (see the module docstring)."""
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else None
    return Planner(graph, cluster, global_batch, seq_len, max_memory_bytes, fix, model_name,
                   progress=say, placements=placements).solve(top_k=top_k)


__all__ = ["Planner", "PlanResult", "SolverInfo", "Candidate", "MeshConfig", "StageModel", "solve", "parse_fix",
           "why_slower"]
