"""Where a trainer step's time goes on the GPU: a timeline summary of sweep configurations (issue 14).

    python benchmarks/profile_timeline.py --only 1g-llama-auto --out $OUT/timeline.jsonl
    torchrun --nproc-per-node 2 benchmarks/profile_timeline.py --only 2g-llama-auto --out $OUT/timeline.jsonl

Each configuration of benchmarks/trainer_sweep.py named runs its plan file with AutoParallelTrainer (warm-up
steps, then `--steps` profiled steps between device synchronizations), and rank 0 appends one JSON line:
the step's wall time, per CUDA stream the kernel time and its classes, and on the compute stream (the
one with the most non-collective kernel time) the idle time with its largest gaps, each with the host's innermost
annotated region (FSDP's and the trainer's record_function names) running when the gap began. Idle
compute-stream time is what the host or an exposed collective costs the step; the classes say what the
GPU spent the rest on.

`--sources aten::copy_,aten::cat` also records, for each named op, where its device time comes from: one more
profiled step with input shapes, the op's device time grouped by them.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as TS  # noqa: E402

GAP_US = 50.0  # compute-stream idle spans shorter than this are launch spacing, not counted as gaps


def _kernels(trace: dict) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]


def _host_regions(trace: dict) -> dict[Any, list[dict]]:
    """The host's annotated regions and ops by thread (forward runs on the main thread, backward on
    autograd's)."""
    out: dict[Any, list[dict]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") in ("user_annotation", "cpu_op") and "dur" in e:
            out.setdefault(e.get("tid"), []).append(e)
    return out


def _innermost(regions: dict[Any, list[dict]], t: float) -> str:
    """Per thread busy at time t, its innermost region (shortest span containing t), joined by " | "."""
    names = []
    for events in regions.values():
        inside = [e for e in events if e["ts"] <= t <= e["ts"] + e["dur"]]
        if inside:
            names.append(min(inside, key=lambda e: e["dur"]).get("name", "?")[:60])
    return " | ".join(names[:3]) or "-"


def _top_kernels(kernels: list[dict], steps: int, n: int = 30) -> dict[str, float]:
    total: dict[str, float] = {}
    for e in kernels:
        total[e.get("name", "?")[:90]] = total.get(e.get("name", "?")[:90], 0.0) + e["dur"] / 1e3 / steps
    return {k: round(v, 3) for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:n]}


def _host_totals(regions: dict[Any, list[dict]], steps: int, n: int = 25) -> dict[str, float]:
    """Host time per step by annotated region (FSDP's hooks, compiled graphs, the optimizer), the block
    index dropped ("FSDP::post_backward_reduce (layers.3)" counts as "FSDP::post_backward_reduce")."""
    total: dict[str, float] = {}
    for events in regions.values():
        for e in events:
            if e.get("cat") != "user_annotation":
                continue
            name = e.get("name", "?").split(" (")[0][:80]
            total[name] = total.get(name, 0.0) + e["dur"] / 1e3 / steps
    return {k: round(v, 3) for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:n]}


# host regions whose kernel launches `launch_regions` counts: a compiled block's forward (its graph call) and
# backward (AOTAutograd's CompiledFunctionBackward), and, for comparison, eager linear layers
LAUNCH_REGIONS = ("Torch-Compiled Region", "autograd::engine::evaluate_function: CompiledFunctionBackward",
                  "aten::linear")


def launch_regions(trace: dict) -> dict[str, dict[str, float]]:
    """Per region kind (LAUNCH_REGIONS): calls, and per call the median host time, kernel launches (runtime
    and driver API: cuBLAS's and Triton's) and the time in those launch calls [us], all as profiled, and the
    names of the kernels a call with the median launch count issued, in order."""
    import statistics
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    launches: dict[Any, list[dict]] = {}
    # the kernels by the correlation id of the launch that issued them
    names = {e.get("args", {}).get("correlation"): e.get("name") for e in events if e.get("cat") == "kernel"}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "aunch" in e.get("name", ""):
            launches.setdefault(e.get("tid"), []).append(e)
    out = {}
    for kind in LAUNCH_REGIONS:
        calls = [e for e in events if e.get("name", "").startswith(kind) and e.get("cat") in ("cpu_op", "user_annotation")]
        if not calls:
            continue
        inside = [[x for x in launches.get(c.get("tid"), []) if c["ts"] <= x["ts"] <= c["ts"] + c["dur"]] for c in calls]
        median = statistics.median_low(len(x) for x in inside)
        typical = next(x for x in inside if len(x) == median)
        out[kind] = {"calls": len(calls), "host_us": statistics.median(c["dur"] for c in calls),
                     "launches": statistics.median(len(x) for x in inside),
                     "launch_api_us": statistics.median(sum(e["dur"] for e in x) for x in inside),
                     "kernels": [names.get(x.get("args", {}).get("correlation"), "?") for x in typical]}
    return out


def regions_of_call(fn: Any) -> dict[str, dict[str, float]]:
    """`launch_regions` of one profiled call of `fn` (CPU and CUDA activity, the device synchronized after)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return launch_regions(json.loads(_chrome_trace(prof)))


def _chrome_trace(prof: Any) -> str:
    """A finished profiler's Chrome trace, as text (torch exports only to a file)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        return path.read_text()


def summarize(trace: dict, steps: int) -> dict[str, Any]:
    kernels = sorted(_kernels(trace), key=lambda e: e["ts"])
    if not kernels:
        return {"error": "no kernels in the trace"}
    per_stream: dict[str, dict[str, float]] = {}
    for e in kernels:
        s = str(e.get("args", {}).get("stream", "?"))
        c = TS._kernel_class(e.get("name", ""))
        d = per_stream.setdefault(s, {})
        d[c] = d.get(c, 0.0) + e["dur"] / 1e3
    busy = {s: sum(d.values()) for s, d in per_stream.items()}
    # the stream with the most non-collective kernel time (NCCL's streams can be busier, under TP)
    compute = max(per_stream, key=lambda s: sum(v for c, v in per_stream[s].items() if c != "comm"))
    ck = [e for e in kernels if str(e.get("args", {}).get("stream", "?")) == compute]
    start, end = ck[0]["ts"], max(e["ts"] + e["dur"] for e in ck)
    regions = _host_regions(trace)
    gaps = []
    last = start
    for e in ck:
        if e["ts"] - last > GAP_US:
            gaps.append((e["ts"] - last, last))
        last = max(last, e["ts"] + e["dur"])
    gaps.sort(reverse=True)
    return {
        "streams_ms": {s: {c: round(v / steps, 2) for c, v in d.items()} for s, d in per_stream.items()},
        "stream_busy_ms": {s: round(v / steps, 2) for s, v in busy.items()},
        "compute_stream": compute,
        "compute_span_ms": round((end - start) / 1e3 / steps, 2),
        "compute_idle_ms": round(sum(g for g, _ in gaps) / 1e3 / steps, 2),
        "gaps": [{"at_ms": round((t - start) / 1e3, 2), "ms": round(g / 1e3, 3), "host": _innermost(regions, t)}
                 for g, t in gaps[:25]],
        "kernel_count": round(len(ck) / steps),
        "top_kernels_ms": _top_kernels(ck, steps),
        "host_regions_ms": _host_totals(regions, steps),
        "launch_regions": launch_regions(trace),
    }


def profile_config(cfg: Any, warmup: int, steps: int, save_trace: Path | None = None,
                   sources: list[str] | None = None) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from autoparallel import AutoParallelTrainer
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    trainer = AutoParallelTrainer(TS._meta_model(cfg), optimizer=None, plan=cfg.plan_file)
    gen = torch.Generator().manual_seed(0)
    vocab = TS.MODELS[cfg.model]["vocab_size"]
    batches = [torch.randint(0, vocab, (cfg.rows, cfg.seq + 1), generator=gen) for _ in range(2)]
    for i in range(warmup):
        trainer.step(batches[i % 2])
    torch.cuda.synchronize()
    times = []
    for i in range(steps):  # unprofiled timing first: the profiler's own host cost is not the step's
        t = time.perf_counter()
        trainer.step(batches[i % 2])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for i in range(steps):
            trainer.step(batches[i % 2])
        torch.cuda.synchronize()
        profiled = (time.perf_counter() - t) / steps
    text = _chrome_trace(prof)
    trace = json.loads(text)
    if save_trace is not None:  # the whole trace, for questions the summary does not answer
        save_trace.mkdir(parents=True, exist_ok=True)
        with gzip.open(save_trace / f"{cfg.name}.json.gz", "wt") as f:
            f.write(text)
    out = {"step_ms": round(1e3 * sorted(times)[len(times) // 2], 2), "profiled_step_ms": round(1e3 * profiled, 2),
           **summarize(trace, steps)}
    if sources:
        out["sources"] = op_sources(trainer, batches[0], sources)
    del trainer
    return out


def op_sources(trainer: Any, batch: Any, ops: list[str], top: int = 12) -> dict[str, Any]:
    """Per op name, its device time [ms] in one step grouped by input shapes (the `top` largest groups).
    (Grouping by Python stack came back empty on the device: the trainer's forward runs under hooks.)"""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=True) as prof:
        trainer.step(batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    found: dict[str, list] = {op: [] for op in ops}
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in found:
            found[e.key].append({"shapes": [str(x) for x in e.input_shapes][:8], "count": e.count,
                                 "device_ms": round(getattr(e, "self_device_time_total", 0.0) / 1e3, 3)})
    return {op: {"by_shapes": sorted(v, key=lambda g: -g["device_ms"])[:top]} for op, v in found.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None, help="comma-separated sweep configuration names")
    ap.add_argument("--regions-of", type=Path, nargs="+", default=None,
                    help="CPU: saved traces (--save-trace's .json.gz) -> one launch_regions line each, to --out")
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--save-trace", type=Path, default=None, help="folder for each configuration's gzipped trace")
    ap.add_argument("--sources", default=None, help="comma-separated aten ops whose callers to record (op_sources)")
    args = ap.parse_args()
    if args.regions_of:
        with Path(args.out).open("a") as f:
            for path in args.regions_of:
                with gzip.open(path, "rt") as g:
                    regions = launch_regions(json.load(g))
                f.write(json.dumps({"trace": path.name, "launch_regions": regions}) + "\n")
                print(path.name, json.dumps(regions))
        return 0
    if not args.only:
        ap.error("--only is required (or --regions-of)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    for cfg in TS._selected(args.only):
        if cfg.gpus != world:
            continue
        rec: dict[str, Any] = {"name": cfg.name, "gpus": cfg.gpus}
        try:
            rec.update(profile_config(cfg, args.warmup, args.steps, args.save_trace if rank == 0 else None,
                                      args.sources.split(",") if args.sources else None))
        except Exception as ex:  # one configuration's failure must not lose the others
            rec["error"] = repr(ex)[:500]
            rec["traceback"] = traceback.format_exc()[-2000:]
        if rank == 0:
            print(json.dumps({k: rec.get(k) for k in ("name", "step_ms", "profiled_step_ms", "stream_busy_ms",
                                                     "compute_idle_ms", "error")}), flush=True)
            with Path(args.out).open("a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
