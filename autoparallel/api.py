"""Python API: the pipeline stages wired together (what the CLI and the trainer call).

    graph = trace_model("llama3-8b", seq_len=4096)
    plan = autoparallel.plan("llama3-8b", hardware="h100-sxm", gpus=64, global_batch=512, seq_len=4096,
                             max_memory_per_gpu="80GB")
    rows = autoparallel.compare("llama3-8b", hardware=["h100-sxm", "mi300x"], gpus=64, ...)
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from autoparallel.errors import UserError
from autoparallel.graph import OpGraph
from autoparallel.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN, MAX_TOP, MAX_TRACE_BATCH, check_int
from autoparallel.plan import Plan
from autoparallel.planner import (
    PRECISIONS,
    SCHEDULE_PINS,
    Planner,
    PlanResult,
    fp8_recipe,
    parse_fix,
    pinned_tp_placements,
    splits_some_module,
)
from autoparallel.sharding import cost_model as sharding_cost_model
from autoparallel.trace_cache import TraceCache, TraceKey, hf_config_identity, module_identity, spec_identity
from autoparallel.units import parse_bytes
from cost_models.estimate import TRAINER, CostModel, Estimate, RuntimeVariant
from cost_models.graph import no_pipeline_clause
from hardware_profiles import Cluster, HardwareProfile, load_profile

if TYPE_CHECKING:  # torch loads only when a model is actually traced (a warm cache never needs it)
    import torch
    from torch import nn

# Costs scale linearly in the micro-batch: the trace's ops are priced per sample. Two samples, not one: at one
# sample torch takes views that become copies from two up (a matmul whose batch dims broadcast one operand:
# DeepSeek V3.2's indexer copied 8.6 GB a sequence a layer on an H200 that a batch-1 trace never saw), and code
# specializes on size 1 as torch.export avoids by tracing with 2. Micro-batches of one pay those copies too.
TRACE_BATCH = 2
DEFAULT_SEQ_LEN = 2048


@dataclass(frozen=True)
class Progress:
    """Progress lines on stderr for the steps that can take seconds; `enabled=False` is silent."""

    enabled: bool = True
    stream: TextIO = field(default_factory=lambda: sys.stderr)

    def say(self, msg: str) -> None:
        if self.enabled:
            print(msg, file=self.stream, flush=True)


QUIET = Progress(enabled=False)


@dataclass
class PlanContext:
    model_name: str
    graph: OpGraph
    cluster: Cluster
    cost_model: CostModel
    budget_bytes: float


def _model_name(model: Any) -> str:
    if isinstance(model, str):
        return model
    name = getattr(model, "name", None)
    return name if isinstance(name, str) else type(model).__name__


def _model_identity(model: Any) -> str | None:
    """What determines the traced graph for the cache key; None when it cannot be known without
    running user code (`package.module:callable`), so that model is traced every time."""
    from autoparallel.specs import ModelSpec, hf_config_of, load_model_spec

    if isinstance(model, (str, dict, ModelSpec)):
        try:
            hf = hf_config_of(model) if not isinstance(model, ModelSpec) else None
            return hf_config_identity(hf.raw) if hf is not None else spec_identity(load_model_spec(model))
        except UserError:
            if isinstance(model, str) and ":" in model:
                return None  # package.module:callable (or bad input the tracer reports in its words)
            raise
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and isinstance(model, torch_mod.nn.Module):
        return module_identity(model)
    return None


def trace_model(model: str | nn.Module | Any, batch: int | None = None, seq_len: int = 2048,
                dtype: torch.dtype | None = None, cache: TraceCache | bool = True,
                progress: Progress = QUIET, padded: bool = False) -> OpGraph:
    """OpGraph of one training step, in bf16 unless `dtype`. Looked up in and stored to the on-disk
    trace cache (autoparallel.trace_cache; `cache=True`: the default directory, False: bypassed).
    `padded`: batches with an attention mask (tracer.trace). `batch`: TRACE_BATCH unless given."""
    batch = TRACE_BATCH if batch is None else batch
    check_int(batch, "--batch", 1, MAX_TRACE_BATCH)
    check_int(seq_len, "--seq-len", 1, MAX_SEQ_LEN)
    from autoparallel.specs import check_seq_len, spec_of
    check_seq_len(spec_of(model), seq_len)  # also reads and validates a config before any tracing
    dtype_name = "bfloat16" if dtype is None else str(dtype).removeprefix("torch.")
    store = TraceCache.default() if cache is True else (cache or None)
    identity = _model_identity(model)  # also rejects an unknown model before any progress line
    if identity is not None and padded:
        identity += "|padded"
    key = TraceKey.of(identity, batch, seq_len, dtype_name) if identity is not None and store else None
    if key is not None:
        graph = store.load(key)
        if graph is not None:
            progress.say(f"trace {_model_name(model)}: from cache ({graph.g.number_of_nodes():,} ops)")
            for w in graph.warnings:  # what the trace said when it ran holds for its cached graph too
                warnings.warn(w, stacklevel=2)
            return graph
    progress.say(f"tracing {_model_name(model)} (batch {batch} x seq {seq_len}, {dtype_name}) on the meta device ...")
    t0 = time.perf_counter()
    import torch

    from autoparallel.tracer import trace
    graph = trace(model, batch=batch, seq_len=seq_len, dtype=dtype or torch.bfloat16, padded=padded)
    if key is not None:
        store.store(key, graph)
    progress.say(f"traced {graph.g.number_of_nodes():,} ops in {time.perf_counter() - t0:.1f} s")
    return graph


def make_cluster(hardware: str | Any, gpus: int, gpus_per_node: int | None = None) -> Cluster:
    check_int(gpus, "--gpus", 1, MAX_GPUS)
    if gpus_per_node is not None:
        check_int(gpus_per_node, "--gpus-per-node", 1, MAX_GPUS)
    if not isinstance(hardware, (str, Path, HardwareProfile)):
        raise UserError(f"hardware: {hardware!r} is not a profile name, a YAML path or a HardwareProfile "
                        f"(`autoparallel profiles list` shows the names)")
    profile = hardware if isinstance(hardware, HardwareProfile) else load_profile(hardware)
    return Cluster(profile, gpus, gpus_per_node)


def _budget(max_memory_per_gpu: str | int | float | None) -> float | None:
    return None if max_memory_per_gpu is None else parse_bytes(max_memory_per_gpu, "--max-memory-per-gpu")


def context(model: Any, hardware: str | Any, gpus: int, seq_len: int, gpus_per_node: int | None = None,
            max_memory_per_gpu: Any = None, graph: OpGraph | None = None,
            overlap_grad_sync: bool = True, runtime: str = "trainer", cache: TraceCache | bool = True,
            progress: Progress = QUIET, padded: bool = False, variant: RuntimeVariant = TRAINER) -> PlanContext:
    """What planning `model` on `gpus` devices of `hardware` needs: its graph, the cluster, the cost model of
    `runtime` (variant: where it differs from the trainer, CostModel) and the memory budget."""
    cluster = hardware if isinstance(hardware, Cluster) else make_cluster(hardware, gpus, gpus_per_node)
    budget = _budget(max_memory_per_gpu)  # parsed before the trace: bad input costs no work
    graph = graph or trace_model(model, seq_len=seq_len, cache=cache, progress=progress, padded=padded)
    cm = sharding_cost_model(graph, cluster, overlap_grad_sync=overlap_grad_sync, runtime=runtime, variant=variant)
    return PlanContext(_model_name(model), graph, cluster, cm, cm._budget(budget))


def plan_result(model: Any, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
                max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None,
                top_k: int = 3, progress: Progress | bool = False, graph: OpGraph | None = None,
                overlap_grad_sync: bool = True, cache: TraceCache | bool = True,
                precision: str = "bf16", padded: bool = False, variant: RuntimeVariant = TRAINER
                ) -> tuple[PlanResult, PlanContext]:
    """The planner's result and what it planned with; `progress`: lines on stderr (True) or a Progress.
    precision: "bf16" (default), or "fp8" / "fp8-rowwise": FP8 linears in every block (only when asked).
    padded: the batches carry an attention mask with padding (a Hugging Face model's attention then runs a
    masked kernel, priced as such). variant: where the runtime differs from the trainer's defaults (the trainer's
    own planning passes the attention kernel torch runs on its device, trainer.hardware.attention_kernel)."""
    check_int(global_batch, "--global-batch", 1, MAX_GLOBAL_BATCH)
    check_int(top_k, "--top", 0, MAX_TOP)
    fix = parse_fix(fix)  # pins are read before the trace, so a bad --fix costs nothing
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    prog = progress if isinstance(progress, Progress) else Progress(enabled=progress)
    ctx = context(model, hardware, gpus, seq_len, gpus_per_node, max_memory_per_gpu, graph, overlap_grad_sync,
                  cache=cache, progress=prog, padded=padded, variant=variant)
    planner = Planner(ctx.graph, ctx.cluster, global_batch, seq_len, ctx.budget_bytes, fix,
                      model_name=ctx.model_name, progress=prog.say if prog.enabled else None,
                      cost_model=ctx.cost_model, precision=precision)
    return planner.solve(top_k=top_k), ctx


def plan(model: Any, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
         max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None,
         precision: str = "bf16", padded: bool = False, variant: RuntimeVariant = TRAINER) -> Plan:
    """The fastest plan that fits; raises UserError (with the explanation) when none does."""
    result, _ = plan_result(model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                            max_memory_per_gpu=max_memory_per_gpu, fix=fix, gpus_per_node=gpus_per_node,
                            precision=precision, padded=padded, variant=variant)
    if result.plan is None:
        raise UserError(f"INFEASIBLE: {result.explanation}")
    return result.plan


# Explicit-plan options of `estimate` and their values when not given.
ESTIMATE_DEFAULTS: dict[str, Any] = {"tp": 1, "pp": 1, "ep": 1, "cp": 1, "vpp": 1, "micro_batch": 1, "recompute": "none",
                                     "zero": 0, "sequence_parallel": False, "grad_reduce_dtype": "fp32",
                                     "compile": False, "precision": "bf16", "schedule": "1f1b"}


def estimate_plan(model: Any, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int | None = None,
                  max_memory_per_gpu: Any = None, gpus_per_node: int | None = None, plan_file: str | None = None,
                  cache: TraceCache | bool = True, progress: Progress = QUIET, padded: bool = False,
                  variant: RuntimeVariant = TRAINER, **options: Any) -> tuple[Estimate, Plan]:
    """Predict one explicitly given plan (dp = gpus / (tp*pp*ep*cp); `options` are ESTIMATE_DEFAULTS' keys,
    None = not given), or a saved plan file, which then defines the mesh, seq_len and batch: an option
    given with a plan file, or a seq_len / global_batch that differs from the file's, is an error instead
    of a silent mix of the two."""
    unknown = sorted(set(options) - set(ESTIMATE_DEFAULTS))
    if unknown:
        raise UserError(f"estimate: unknown option {unknown[0]!r}; options are {', '.join(ESTIMATE_DEFAULTS)}")
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    check_int(global_batch, "--global-batch", 1, MAX_GLOBAL_BATCH)
    if plan_file:
        return _estimate_plan_file(model, hardware, gpus, global_batch, seq_len, max_memory_per_gpu,
                                   gpus_per_node, plan_file, given, cache, progress, padded, variant)
    o = {**ESTIMATE_DEFAULTS, **given}
    for name in ("sequence_parallel", "compile"):  # a string ("no") had been read as its truth
        if not isinstance(o[name], bool):
            raise UserError(f"estimate: {name}={o[name]!r} is not True or False")
    for name in ("tp", "pp", "ep", "cp", "vpp", "micro_batch"):
        check_int(o[name], f"--{name.replace('_', '-')}", 1, MAX_GPUS if name != "micro_batch" else MAX_GLOBAL_BATCH)
    tp, pp, ep, cp = o["tp"], o["pp"], o["ep"], o["cp"]
    check_int(gpus, "--gpus", 1, MAX_GPUS)
    if gpus % (tp * pp * ep * cp):
        cp_part = f" x --cp {cp}" if cp > 1 else ""
        raise UserError(f"--tp {tp} x --pp {pp} x --ep {ep}{cp_part} = {tp * pp * ep * cp} does not divide --gpus "
                        f"{gpus}")
    if o["sequence_parallel"] and tp == 1:  # it shards the sequence over the tp ranks: was dropped without a word
        raise UserError("--sequence-parallel needs --tp > 1 (it splits each sequence over the tensor-parallel ranks); "
                        "drop it or pass --tp")
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    ctx = context(model, hardware, gpus, seq_len, gpus_per_node, max_memory_per_gpu, cache=cache, progress=progress,
                  padded=padded, variant=variant)
    if pp > 1 and ctx.graph.no_pipeline:  # as the planner's pin and the trainer refuse it
        raise UserError(f"--pp {pp}: {no_pipeline_clause(ctx.model_name, ctx.graph.no_pipeline)}; use --pp 1")
    p = Plan(model=ctx.model_name, hardware=ctx.cluster.profile.name, gpus=gpus,
             gpus_per_node=ctx.cluster.devices_per_node, global_batch=global_batch, seq_len=seq_len,
             dp=gpus // (tp * pp * ep * cp), tp=tp, pp=pp, ep=ep, cp=cp, vpp=o["vpp"], micro_batch=o["micro_batch"],
             zero=o["zero"], sequence_parallel=bool(o["sequence_parallel"]),
             recompute=(o["recompute"],) * len(ctx.graph.blocks), grad_reduce_dtype=o["grad_reduce_dtype"],
             compile=bool(o["compile"]), pipeline_schedule=SCHEDULE_PINS[parse_fix({"schedule": o["schedule"]})["schedule"]])
    recipe = fp8_recipe(o["precision"], ctx.cluster.profile)
    placements = ctx.cost_model.placements_for(p)
    if tp > 1 and not splits_some_module(placements):
        # the solver splits nothing at this tp: the layout the planner emits for a pinned tp, not a tp that
        # repeats every module on every rank (priced as if it had split)
        placements = pinned_tp_placements(ctx.cost_model, tp, p.sequence_parallel)
    p = replace(p, placements=placements, fp8=(recipe,) * len(ctx.graph.blocks) if recipe != "none" else ())
    p.check_runnable(len(ctx.graph.blocks))  # what the trainer refuses (int8 at ZeRO-0, ...) is not priced either
    return ctx.cost_model.estimate(p, ctx.budget_bytes), p


def _estimate_plan_file(model: Any, hardware: Any, gpus: int, global_batch: int, seq_len: int | None,
                        max_memory_per_gpu: Any, gpus_per_node: int | None, plan_file: str,
                        given: dict[str, Any], cache: TraceCache | bool = True,
                        progress: Progress = QUIET, padded: bool = False,
                        variant: RuntimeVariant = TRAINER) -> tuple[Estimate, Plan]:
    if given:
        flag = "--" + next(iter(given)).replace("_", "-")
        raise UserError(f"estimate: {flag} conflicts with --plan {plan_file}, which sets the whole layout; drop "
                        f"{flag} or drop --plan")
    p = Plan.load(plan_file)
    for flag, mine, theirs in (("--gpus", gpus, p.gpus), ("--global-batch", global_batch, p.global_batch),
                               ("--seq-len", seq_len, p.seq_len)):
        if mine is not None and mine != theirs:
            raise UserError(f"estimate: {flag} {mine} but plan file {plan_file} is for {flag} {theirs}; pass "
                            f"{flag} {theirs} or re-plan")
    ctx = context(model, hardware, gpus, p.seq_len, gpus_per_node, max_memory_per_gpu, cache=cache, progress=progress,
                  padded=padded, variant=variant)
    p.validate(len(ctx.graph.blocks))
    if p.pp > 1 and ctx.graph.no_pipeline:
        raise UserError(f"plan file {plan_file} has pp={p.pp}, but "
                        f"{no_pipeline_clause(ctx.model_name, ctx.graph.no_pipeline)}; re-plan with pp=1")
    mine = getattr(ctx.graph, "fingerprint", "") or ""
    if p.model_fingerprint and mine and p.model_fingerprint != mine:  # as the trainer refuses it
        raise UserError(f"plan file {plan_file} was made for another model (fingerprint {p.model_fingerprint} != "
                        f"{ctx.model_name}'s {mine}); re-plan this model")
    unknown = sorted(set(p.placements) - set(ctx.graph.parametric_ops))
    if unknown:
        raise UserError(f"plan file {plan_file}: placement for {unknown[0]!r}, which is no parametric module of "
                        f"{ctx.model_name}; the plan was made for another model: re-plan")
    p = replace(p, hardware=ctx.cluster.profile.name, gpus_per_node=ctx.cluster.devices_per_node)
    return ctx.cost_model.estimate(p, ctx.budget_bytes), p


@dataclass
class CompareRow:
    hardware: str
    result: PlanResult
    context: PlanContext
    precision: str = "bf16"   # what the row was planned with (bf16 where the device has no FP8)


def compare(model: Any, *, hardware: list[str], gpus: int, global_batch: int, seq_len: int,
            max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None,
            cache: TraceCache | bool = True, progress: Progress = QUIET, precision: str = "bf16",
            padded: bool = False, variant: RuntimeVariant = TRAINER) -> list[CompareRow]:
    """Plan the same model on each hardware profile (one trace shared by all); `padded`, `variant`: see
    plan_result."""
    if isinstance(hardware, str):  # "h100-sxm,mi300x" as --hardware takes it (a string had been read letter by letter)
        hardware = [h.strip() for h in hardware.split(",") if h.strip()]
    if not hardware:
        raise UserError("--hardware: give at least one profile, e.g. h100-sxm,mi300x")
    clusters = [make_cluster(hw, gpus, gpus_per_node) for hw in hardware]  # every name checked before the trace
    check_int(global_batch, "--global-batch", 1, MAX_GLOBAL_BATCH)
    fix = parse_fix(fix)
    graph = trace_model(model, seq_len=seq_len, cache=cache, progress=progress, padded=padded)
    rows = []
    for k, cluster in enumerate(clusters, 1):
        hw = cluster.profile.name
        progress.say(f"[{k}/{len(hardware)}] planning on {hw} ...")
        t0 = time.perf_counter()
        # a profile without an FP8 peak is planned in bf16 (its row says so) rather than failing the comparison
        mine = precision if precision == "bf16" or "fp8" in cluster.profile.peak_flops else "bf16"
        result, ctx = plan_result(model, hardware=cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                                  max_memory_per_gpu=max_memory_per_gpu, fix=fix, gpus_per_node=gpus_per_node,
                                  graph=graph, precision=mine, variant=variant)
        progress.say(f"[{k}/{len(hardware)}] {hw}: {result.solver.status} in {time.perf_counter() - t0:.1f} s")
        rows.append(CompareRow(ctx.cluster.profile.name, result, ctx, precision=mine))
    return rows


def plan_model(model: nn.Module, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
               max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None,
               precision: str = "bf16", padded: bool = False, variant: RuntimeVariant = TRAINER) -> Plan:
    """Plan an in-memory nn.Module (the trainer's entry point); the plan carries its fingerprint. A model
    the trainer cannot split into pipeline stages (blocks not in a root-level nn.ModuleDict) is planned
    with pp=1, so the plan is one the trainer runs. `padded`, `variant`: see plan_result."""
    from autoparallel.plan import fingerprint
    from autoparallel.trainer.structure import find_layout, pipelineable
    fix = parse_fix(fix)
    if not pipelineable(model, find_layout(model)):
        if fix.get("pp", 1) > 1:
            raise UserError(f"pin pp={fix['pp']}: {type(model).__name__}'s blocks are not in a root-level "
                            f"nn.ModuleDict, which pipeline stages need (docs/architecture.md); use pp=1")
        fix["pp"] = 1
    p = plan(model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
             max_memory_per_gpu=max_memory_per_gpu, fix=fix, gpus_per_node=gpus_per_node, precision=precision,
             padded=padded, variant=variant)
    return replace(p, model_fingerprint=fingerprint([(n, tuple(t.shape)) for n, t in model.named_parameters()]))
