"""Tensor parallelism at the speed of the link (issue 14): the 1.3B llama on two GPUs, 16 x 2048 per step.

    torchrun --nproc-per-node 2 benchmarks/tp_speed.py --out $OUT/tp_speed.json
    python benchmarks/tp_speed.py --dry-run        # CPU: build and print the plans, nothing else

Variants, in this order, one process group, one after the other (each built, warmed up, timed, profiled
and freed before the next; dynamo's caches are reset between them so each compiles its own graphs):

  dp2-zero2-compiled      dp2 ZeRO-2, 8 rows per rank, compiled blocks (the planner's own 2-GPU plan)
  tp2-sp-compiled         tp2 + sequence parallel, 16 rows, compiled blocks
  tp2-sp-compiled-reorder the same, with inductor's compute/communication reordering passes
  tp2-sp-compiled-overlap the same, with inductor's ATen-graph overlap scheduler
  tp2-sp-compiled-async   the same, plan.async_tp: inductor's micro-pipeline TP over symmetric memory.
                          After every other compiled variant on purpose: it sets
                          torch._inductor.config._micro_pipeline_tp for the rest of the process
                          (trainer.tensor_parallel.enable_async_tp), which only compiled graphs read
  tp2-sp-eager            tp2 + SP eager (last: the quickest to build, the first the budget drops)

Per variant: median step time over --steps timed steps after --warmup (calibrate_trainer.time_trainer_steps:
device-synchronized), peak memory above what was allocated before it was built, the losses, and for the tp
variants one profiled step: kernel time by class (comm = NCCL kernels, peer-to-peer copies and
symmetric-memory kernels; compute = every other kernel), the comm time not overlapped by any compute kernel
("exposed"), device idle time, the top kernels, and how many fused collective matmuls (async TP) ran. A
variant that fails records its error line and the others still run; rank 0 rewrites --out after every
variant, so a run cut short keeps what finished. Expects NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 from the caller (no NVLink multicast).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from h200_trainer_throughput import LLAMA_1_3B  # noqa: E402

from autoparallel.plan import Plan  # noqa: E402

PLANS = ROOT / "benchmarks" / "results" / "trainer_sweep_plans"
ROWS, SEQ = 16, 2048
VARIANTS = ("dp2-zero2-compiled", "tp2-sp-compiled", "tp2-sp-compiled-reorder", "tp2-sp-compiled-overlap",
            "tp2-sp-compiled-async", "tp2-sp-eager")
# torch.compile kwargs per variant (AutoParallelTrainer's compile=dict); others compile as the plan says.
# Both let inductor move a collective away from the compute it does not depend on (in backward, the input
# gradient's reduce-scatter beside the weight-gradient matmul: Megatron's TP overlap): "reorder", the
# scheduler-IR passes torch's config recommends; "overlap", the ATen-graph overlap scheduler
COMPILE_KWARGS: dict[str, dict[str, Any]] = {
    "tp2-sp-compiled-reorder": {"options": {
        "reorder_for_compute_comm_overlap": True,
        "reorder_for_compute_comm_overlap_passes": ["reorder_communication_preserving_peak_memory",
                                                    "sink_waits_iterative",
                                                    "reorder_communication_preserving_peak_memory"]}},
    "tp2-sp-compiled-overlap": {"options": {"aten_distributed_optimizations.enable_overlap_scheduling": True}}}
COMM_MARKERS = ("nccl", "memcpy ptop", "symm", "multimem", "one_shot",
                "two_shot", "barrier", "signal", "all_gather", "reduce_scatter", "allreduce")
ASYNC_MARKERS = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter", "fused_all_gather_scaled_matmul")


def build_plans() -> dict[str, Plan]:
    """The plans, from the sweep's plan files for this model (their fingerprint is the model's)."""
    dp = Plan.load(PLANS / "2g-llama-auto.yaml")
    tp = Plan.load(PLANS / "2g-llama-tp2sp-compiled.yaml")
    if (dp.dp, dp.zero, dp.compile) != (2, 2, True) or (tp.tp, tp.sequence_parallel) != (2, True):
        raise SystemExit(f"{PLANS}: the sweep's plan files changed (dp2 zero2 compiled, tp2 sp expected)")
    plans = {"dp2-zero2-compiled": dp,
             "tp2-sp-compiled": dataclasses.replace(tp, compile=True),
             "tp2-sp-compiled-reorder": dataclasses.replace(tp, compile=True),
             "tp2-sp-compiled-overlap": dataclasses.replace(tp, compile=True),
             "tp2-sp-compiled-async": dataclasses.replace(tp, compile=True, async_tp=True),
             "tp2-sp-eager": dataclasses.replace(tp, compile=False)}
    for plan in plans.values():
        plan.check_runnable(LLAMA_1_3B["num_hidden_layers"])
        if plan.global_batch != ROWS or plan.seq_len != SEQ:
            raise SystemExit(f"plan for {plan.global_batch} x {plan.seq_len}, expected {ROWS} x {SEQ}")
    return plans


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="JSON results (rank 0 writes it; rewritten after every variant)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--only", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled step of the tp variants")
    p.add_argument("--budget-s", type=float, default=225.0,
                   help="skip variants not started by then (the whole run must stay under 4 minutes)")
    p.add_argument("--dry-run", action="store_true", help="CPU: build and print the plans only")
    args = p.parse_args(argv)
    unknown = sorted(set(args.only.split(",")) - set(VARIANTS))
    if unknown:
        p.error(f"--only: unknown variant {unknown[0]!r}; pick from {', '.join(VARIANTS)}")
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1")
    if not args.dry_run and args.out is None:
        p.error("--out is required (unless --dry-run)")
    return args


# ---- profile ------------------------------------------------------------------------------------
def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_comm(name: str) -> bool:
    n = name.lower()
    return any(m in n for m in COMM_MARKERS)


def breakdown(kernels: list[tuple[str, float, float]], wall_s: float) -> dict[str, Any]:
    """kernels: (name, start_us, end_us) of every device kernel / copy of one step."""
    comm = _union([(s, e) for n, s, e in kernels if is_comm(n)])
    compute = _union([(s, e) for n, s, e in kernels if not is_comm(n)])
    busy = _union(comm + compute)
    per_kernel: dict[str, float] = {}
    for n, s, e in kernels:
        per_kernel[n[:120]] = per_kernel.get(n[:120], 0.0) + (e - s) * 1e-6
    return {"wall_s": wall_s,
            "comm_kernel_s": sum((e - s) for n, s, e in kernels if is_comm(n)) * 1e-6,
            "compute_kernel_s": sum((e - s) for n, s, e in kernels if not is_comm(n)) * 1e-6,
            "comm_busy_s": _length(comm) * 1e-6, "compute_busy_s": _length(compute) * 1e-6,
            "comm_exposed_s": (_length(comm) - _intersection(comm, compute)) * 1e-6,
            "device_busy_s": _length(busy) * 1e-6,
            "device_idle_s": max(0.0, wall_s - _length(busy) * 1e-6),
            "top_kernels_s": dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])[:20])}


def profiled_step(trainer: Any, batch: Any) -> dict[str, Any]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trainer.step(batch)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    events = prof.events()
    # device kernels and copies; record_function ranges mirrored onto the device timeline (user
    # annotations) span many kernels and are left out
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in events
               if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
               and e.time_range.end > e.time_range.start]
    out = breakdown(kernels, wall)
    out["async_tp_ops"] = sum(1 for e in events if e.device_type == DeviceType.CPU
                              and any(m in e.name for m in ASYNC_MARKERS))
    out["note"] = "wall_s includes the profiler's overhead; compare the kernel terms, not wall_s, with step_time_s"
    return out


# ---- measure ------------------------------------------------------------------------------------
def _meta_model() -> Any:
    import torch

    from autoparallel.models import build_model, load_model_spec
    with torch.device("meta"):
        return build_model(load_model_spec(LLAMA_1_3B))


def run_variant(name: str, plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from autoparallel import AutoParallelTrainer
    from autoparallel.calibrate_trainer import time_trainer_steps

    gc.collect()
    torch._dynamo.reset()  # the previous variant's graphs: each variant compiles its own
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    rec: dict[str, Any] = {"variant": name, "plan": {"dp": plan.dp, "tp": plan.tp, "zero": plan.zero,
                                                     "micro_batch": plan.micro_batch, "sp": plan.sequence_parallel,
                                                     "compile": plan.compile, "async_tp": plan.async_tp}}
    t0 = time.perf_counter()
    trainer = AutoParallelTrainer(_meta_model(), optimizer=None, plan=plan, compile=COMPILE_KWARGS.get(name))
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, LLAMA_1_3B["vocab_size"], (ROWS, SEQ + 1), generator=gen) for _ in range(4)]
    rec["build_s"] = time.perf_counter() - t0
    timing = time_trainer_steps(trainer, batches, args.warmup, args.steps, base)
    rec.update(step_time_s=timing.step_time_s, step_times_s=timing.step_times_s,
               peak_memory_gib=timing.peak_memory_gib, reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
               losses=timing.losses, wall_s=time.perf_counter() - t0)
    if plan.tp > 1 and not args.no_profile:
        rec["profile"] = profiled_step(trainer, batches[0])
    del trainer
    return rec


def _agree(flag: bool) -> bool:
    """Every rank takes the same branch: True when any rank says so."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([1.0 if flag else 0.0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def measure(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    plans = build_plans()
    wanted = [v for v in VARIANTS if v in args.only.split(",")]
    results: dict[str, Any] = {"model": LLAMA_1_3B["name"], "rows": ROWS, "seq": SEQ, "world": dist.get_world_size(),
                               "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                               "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",
                                       "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
                               "warmup": args.warmup, "steps": args.steps, "variants": {}}
    for name in wanted:
        if _agree(time.perf_counter() - start > args.budget_s):
            rec = {"variant": name, "skipped": f"time budget {args.budget_s:.0f} s spent before it started"}
        else:
            try:
                rec = run_variant(name, plans[name], args)
            except Exception as ex:  # one variant's failure must not lose the others
                rec = {"variant": name, "error": f"{type(ex).__name__}: {ex}"[:600],
                       "traceback": traceback.format_exc()[-3000:]}
            failed = _agree("error" in rec)  # both ranks move on together
            if "error" in rec and rank != 0:  # rank 0 prints its own below
                print(f"rank {rank}: {name}: {rec['error']}", flush=True)
            if failed and "error" not in rec:
                rec["error"] = "another rank failed in this variant (its error line is printed above)"
        results["variants"][name] = rec
        results["elapsed_s"] = time.perf_counter() - start
        if rank == 0:
            line = {k: rec.get(k) for k in ("variant", "step_time_s", "peak_memory_gib", "error", "skipped")
                    if rec.get(k) is not None}
            if "profile" in rec:
                line["comm_exposed_s"] = rec["profile"]["comm_exposed_s"]
                line["async_tp_ops"] = rec["profile"]["async_tp_ops"]
            print(json.dumps(line), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2))
    times = {n: r.get("step_time_s") for n, r in results["variants"].items() if r.get("step_time_s")}
    if rank == 0 and "dp2-zero2-compiled" in times:
        ratio = {n: times["dp2-zero2-compiled"] / t for n, t in times.items()}
        results["speed_vs_dp2_compiled"] = ratio
        args.out.write_text(json.dumps(results, indent=2))
        print(json.dumps({"speed_vs_dp2_compiled": ratio, "elapsed_s": results["elapsed_s"]}), flush=True)
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        for name, plan in build_plans().items():
            if name in args.only.split(","):
                print(f"{name:24s} dp{plan.dp} tp{plan.tp} zero{plan.zero} mb{plan.micro_batch} "
                      f"sp={plan.sequence_parallel} compile={plan.compile} async_tp={plan.async_tp}")
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
