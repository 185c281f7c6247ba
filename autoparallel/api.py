"""Python API: the pipeline stages wired together (what the CLI and the trainer call).

    graph = trace_model("llama3-8b", seq_len=4096)
    plan = autoparallel.plan("llama3-8b", hardware="h100-sxm", gpus=64, global_batch=512, seq_len=4096,
                             max_memory_per_gpu="80GB")
    rows = autoparallel.compare("llama3-8b", hardware=["h100-sxm", "mi300x"], gpus=64, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from autoparallel.errors import UserError
from autoparallel.graph import OpGraph
from autoparallel.plan import Plan
from autoparallel.planner import Planner, PlanResult
from autoparallel.sharding import cost_model as sharding_cost_model
from autoparallel.units import parse_bytes
from cost_models.estimate import CostModel, Estimate
from hardware_profiles import Cluster, load_profile

TRACE_BATCH = 1  # costs scale linearly in the micro-batch; one sample is traced


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


@lru_cache(maxsize=8)
def _trace_cached(ref: str, batch: int, seq_len: int) -> OpGraph:
    from autoparallel.tracer import trace
    return trace(ref, batch=batch, seq_len=seq_len)


def trace_model(model: str | nn.Module | Any, batch: int = TRACE_BATCH, seq_len: int = 2048,
                dtype: torch.dtype = torch.bfloat16) -> OpGraph:
    """OpGraph of one training step; catalog names and spec paths are cached per process."""
    if batch < 1 or seq_len < 1:
        raise UserError(f"batch={batch} and seq_len={seq_len} must be >= 1")
    if isinstance(model, str) and dtype == torch.bfloat16:
        return _trace_cached(model, batch, seq_len)
    from autoparallel.tracer import trace
    return trace(model, batch=batch, seq_len=seq_len, dtype=dtype)


def make_cluster(hardware: str | Any, gpus: int, gpus_per_node: int | None = None) -> Cluster:
    profile = load_profile(hardware) if isinstance(hardware, str) else hardware
    return Cluster(profile, gpus, gpus_per_node)


def _budget(max_memory_per_gpu: str | int | float | None) -> float | None:
    return None if max_memory_per_gpu in (None, "") else parse_bytes(max_memory_per_gpu, "--max-memory-per-gpu")


def context(model: Any, hardware: str | Any, gpus: int, seq_len: int, gpus_per_node: int | None = None,
            max_memory_per_gpu: Any = None, graph: OpGraph | None = None,
            overlap_grad_sync: bool = True, runtime: str = "trainer") -> PlanContext:
    cluster = make_cluster(hardware, gpus, gpus_per_node)
    graph = graph or trace_model(model, seq_len=seq_len)
    cm = sharding_cost_model(graph, cluster, overlap_grad_sync=overlap_grad_sync, runtime=runtime)
    return PlanContext(_model_name(model), graph, cluster, cm, cm._budget(_budget(max_memory_per_gpu)))


def plan_result(model: Any, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
                max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None,
                top_k: int = 3, progress: bool = False, graph: OpGraph | None = None,
                overlap_grad_sync: bool = True) -> tuple[PlanResult, PlanContext]:
    ctx = context(model, hardware, gpus, seq_len, gpus_per_node, max_memory_per_gpu, graph, overlap_grad_sync)
    import sys
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else None
    planner = Planner(ctx.graph, ctx.cluster, global_batch, seq_len, ctx.budget_bytes, fix,
                      model_name=ctx.model_name, progress=say, cost_model=ctx.cost_model)
    return planner.solve(top_k=top_k), ctx


def plan(model: Any, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
         max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None) -> Plan:
    """The fastest plan that fits; raises UserError (with the explanation) when none does."""
    result, _ = plan_result(model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                            max_memory_per_gpu=max_memory_per_gpu, fix=fix, gpus_per_node=gpus_per_node)
    if result.plan is None:
        raise UserError(f"INFEASIBLE: {result.explanation}")
    return result.plan


def estimate_plan(model: Any, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
                  max_memory_per_gpu: Any = None, gpus_per_node: int | None = None, plan_file: str | None = None,
                  tp: int = 1, pp: int = 1, ep: int = 1, vpp: int = 1, micro_batch: int = 1,
                  recompute: str = "none", zero: int = 0, sequence_parallel: bool = False,
                  grad_reduce_dtype: str = "fp32") -> tuple[Estimate, Plan]:
    """Predict one explicitly given plan (dp = gpus / (tp*pp*ep)), or a saved plan file."""
    ctx = context(model, hardware, gpus, seq_len, gpus_per_node, max_memory_per_gpu)
    if plan_file:
        p = Plan.load(plan_file)
        if p.gpus != gpus:
            raise UserError(f"plan file {plan_file} is for {p.gpus} devices, not --gpus {gpus}")
        p = replace(p, hardware=ctx.cluster.profile.name, gpus_per_node=ctx.cluster.devices_per_node)
    else:
        for name, v in (("--tp", tp), ("--pp", pp), ("--ep", ep), ("--vpp", vpp), ("--micro-batch", micro_batch)):
            if v < 1:
                raise UserError(f"{name} {v} must be >= 1")
        if gpus % (tp * pp * ep):
            raise UserError(f"--tp {tp} x --pp {pp} x --ep {ep} = {tp * pp * ep} does not divide --gpus {gpus}")
        dp = gpus // (tp * pp * ep)
        p = Plan(model=ctx.model_name, hardware=ctx.cluster.profile.name, gpus=gpus,
                 gpus_per_node=ctx.cluster.devices_per_node, global_batch=global_batch, seq_len=seq_len, dp=dp,
                 tp=tp, pp=pp, ep=ep, vpp=vpp, micro_batch=micro_batch, zero=zero,
                 sequence_parallel=sequence_parallel and tp > 1, recompute=(recompute,) * len(ctx.graph.blocks),
                 grad_reduce_dtype=grad_reduce_dtype)
        p = replace(p, placements=ctx.cost_model.placements_for(p))
    return ctx.cost_model.estimate(p, ctx.budget_bytes), p


@dataclass
class CompareRow:
    hardware: str
    result: PlanResult
    context: PlanContext


def compare(model: Any, *, hardware: list[str], gpus: int, global_batch: int, seq_len: int,
            max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None) -> list[CompareRow]:
    """Plan the same model on each hardware profile (one trace shared by all)."""
    if not hardware:
        raise UserError("--hardware: give at least one profile, e.g. h100-sxm,mi300x")
    graph = trace_model(model, seq_len=seq_len)
    rows = []
    for hw in hardware:
        result, ctx = plan_result(model, hardware=hw, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                                  max_memory_per_gpu=max_memory_per_gpu, fix=fix, gpus_per_node=gpus_per_node,
                                  graph=graph)
        rows.append(CompareRow(ctx.cluster.profile.name, result, ctx))
    return rows


def plan_model(model: nn.Module, *, hardware: str | Any, gpus: int, global_batch: int, seq_len: int,
               max_memory_per_gpu: Any = None, fix: Any = None, gpus_per_node: int | None = None) -> Plan:
    """Plan an in-memory nn.Module (the trainer's entry point); the plan carries its fingerprint."""
    from autoparallel.plan import fingerprint
    p = plan(model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
             max_memory_per_gpu=max_memory_per_gpu, fix=fix, gpus_per_node=gpus_per_node)
    return replace(p, model_fingerprint=fingerprint([(n, tuple(t.shape)) for n, t in model.named_parameters()]))
