"""Does the host's per-op rate of the small calibration probes hold for the sweep's models? (issue 12)

`autoparallel calibrate --trainer` fits the trainer's host rates from small host-bound models; the cost
model applies them to every model. This measures the rate where it is used: for each model, the host
time AutoParallelTrainer takes to issue the forward of its first blocks in the step's first micro-batch
(forward hooks, time.perf_counter, after a device synchronization, so no queue of earlier kernels holds
the host back), next to the GPU time of the same span (CUDA events). `report` divides the host time by
the ops the cost model counts in those blocks' forward (CostModel segments) and prints the per-op rate
of each model beside the probes'. It also runs the sweep's own models at 32 tokens a row (`SHORT`), where
the host paces every phase, and `report --profile` predicts them with a profile fitted from the same VM's
probes: a held-out test of the host model on large models.

It also times the launch of small kernels with the GPU idle and with it busy on a GEMM chain (whether a
launch into a non-empty queue costs the host less; on one VM it did not: 7.8 against 7.2 us).

    python benchmarks/host_rate.py measure --out $OUT/host_rate.jsonl               # one GPU
    autoparallel calibrate --trainer --fit $OUT/probes.jsonl --base h200 --output fit.yaml   # that VM's probes
    python benchmarks/host_rate.py report --raw benchmarks/results/raw/host_rate_h200.jsonl \
        --profile benchmarks/results/h200_trainer_fit_s10.yaml

Results: docs/trainer_sweep_notes.md, section "Host-bound steps across VMs".
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import host_mix  # noqa: E402
import trainer_sweep as ts  # noqa: E402

from autoparallel import calibrate_trainer as ct  # noqa: E402

BLOCKS = 3          # blocks timed from the start of the first forward
SWEEP = ("1g-llama-eager", "1g-llama-mb4x2", "1g-gpt-eager", "1g-moe-eager", "1g-llama-mb2x4")
PROBE_NAMES = ("llama-m1", "llama-m4", "wide-m4", "gpt-m1", "moe-m2", "llama-bias-m4")
# the sweep's models at 32 tokens a row: the same ops, modules and parameter tensors as their sweep
# configurations, kernels a small fraction of the host's work (name, model, rows, micro-batch, compile)
SHORT_SEQ = 32
SHORT = (("short-llama-m1", "llama-1.3b", 1, 1, 0), ("short-llama-m4", "llama-1.3b", 4, 1, 0),
         ("short-gpt-m1", "gpt-350m", 1, 1, 0), ("short-gpt-m4", "gpt-350m", 4, 1, 0),
         ("short-moe-m2", "moe-1.2b-8e", 2, 1, 0), ("short-gpt-m4-compiled", "gpt-350m", 4, 1, 1),
         ("short-llama-m4-compiled", "llama-1.3b", 4, 1, 1))


def _blocks(model: Any) -> list[Any]:
    from autoparallel.trainer.structure import find_layout, get_submodule
    layout = find_layout(model)
    return [get_submodule(model, p) for p in layout.block_paths]


class BlockTimer:
    """Host and GPU time of the first micro-batch forward of blocks 0..n-1 in each step."""

    def __init__(self, blocks: list[Any], n: int) -> None:
        import torch
        self.armed = False
        self.t0 = self.t1 = 0.0
        self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        blocks[0].register_forward_pre_hook(self._start)
        blocks[n - 1].register_forward_hook(self._end)

    def _start(self, *_: Any) -> None:
        if self.armed and not self.t0:
            self.e0.record()
            self.t0 = time.perf_counter()

    def _end(self, *_: Any) -> None:
        if self.armed and self.t0 and not self.t1:
            self.t1 = time.perf_counter()
            self.e1.record()

    def take(self) -> tuple[float, float]:
        import torch
        torch.cuda.synchronize()
        host, gpu = self.t1 - self.t0, self.e0.elapsed_time(self.e1) / 1e3
        self.t0 = self.t1 = 0.0
        return host, gpu


def time_blocks(trainer: Any, batches: list[Any], steps: int, warmup: int) -> dict[str, Any]:
    import torch
    part = trainer.model_parts[0]
    blocks = _blocks(part)
    n = min(BLOCKS, len(blocks))
    timer = BlockTimer(blocks, n)
    for i in range(warmup):
        trainer.step(batches[i % len(batches)])
    host, gpu, step = [], [], []
    for i in range(steps):
        torch.cuda.synchronize()
        timer.armed = True
        t = time.perf_counter()
        trainer.step(batches[i % len(batches)])
        torch.cuda.synchronize()
        step.append(time.perf_counter() - t)
        timer.armed = False
        h, g = timer.take()
        host.append(h)
        gpu.append(g)
    return {"blocks": n, "host_s": host, "gpu_s": gpu, "step_s": step}


def launch_rates(n: int = 500) -> dict[str, float]:
    """Host seconds per small-kernel launch with the GPU idle, and behind a long GEMM chain."""
    import torch
    x = torch.zeros(16, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out: dict[str, list[float]] = {"idle": [], "busy": []}
    for _ in range(3):
        for mode in ("idle", "busy"):
            torch.cuda.synchronize()
            if mode == "busy":
                for _ in range(20):  # ~20 x 1.1 TFLOP, longer than the launches below, which stay within
                    # the launch queue's depth (about a thousand) so that the host never waits for room
                    a @ a
            t = time.perf_counter()
            for _ in range(n):
                x.add_(1.0)
            out[mode].append((time.perf_counter() - t) / n)
            torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in out.items()}


def short_plan(model: str, rows: int, micro_batch: int, compile_: int) -> Any:
    return host_mix.plan_of(ts.MODELS[model], bool(compile_), rows, micro_batch, SHORT_SEQ)


def cmd_measure(args: argparse.Namespace) -> int:
    import torch

    from autoparallel import AutoParallelTrainer
    out = Path(args.out)

    def emit(rec: dict[str, Any]) -> None:
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if "host_s" in rec:
            print(f"{rec['name']}: host {statistics.median(rec['host_s']) * 1e3:.2f} ms, gpu "
                  f"{statistics.median(rec['gpu_s']) * 1e3:.2f} ms for {rec['blocks']} blocks; step "
                  f"{statistics.median(rec['step_s']) * 1e3:.1f} ms", flush=True)

    emit({"name": "launch", **launch_rates()})
    print(out.read_text().splitlines()[-1], flush=True)

    def fresh(model: Any, plan: Any, vocab: int, rows: int, seq: int) -> tuple[Any, list[Any]]:
        """A trainer of its own (the previous one's graphs and memory released) and two random batches."""
        gc.collect()
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        gen = torch.Generator().manual_seed(0)
        return (AutoParallelTrainer(model, optimizer=None, plan=plan),
                [torch.randint(0, vocab, (rows, seq + 1), generator=gen) for _ in range(2)])

    shared: dict[str, Any] = {}
    for probe in (p for p in ct.PROBES if p.name in PROBE_NAMES):
        spec = ct.MODELS[probe.model]
        trainer, batches = fresh(ct.meta_model(spec), ct.probe_plan(probe, "h200"), spec["vocab_size"], probe.rows,
                                 ct.SEQ)
        emit({"name": probe.name, "kind": "probe", **time_blocks(trainer, batches, args.steps, 5)})
        del trainer
    for name, model, rows, mb, comp in SHORT:
        plan = short_plan(model, rows, mb, comp)
        trainer, batches = fresh(ts._shared_init_model(model, shared), plan, ts.MODELS[model]["vocab_size"], rows,
                                 SHORT_SEQ)
        timing = ct.time_trainer_steps(trainer, batches, 5, 20)
        emit({"name": name, "kind": "short", "model": model, "plan": plan.to_dict(),
              "measured": {"step_time_s": timing.step_time_s, "step_times_s": timing.step_times_s}})
        print(f"{name}: {timing.step_time_s * 1e3:.1f} ms", flush=True)
        del trainer
    for cfg in ts._selected(",".join(SWEEP)):
        trainer, batches, _ = ts.sweep_trainer(cfg, shared)
        emit({"name": cfg.name, "kind": "sweep", **time_blocks(trainer, batches, args.steps, 3)})
        del trainer
    return 0


def _ops_per_block(name: str, kind: str) -> float:
    """Forward ops of the first block as the cost model counts them (its host floor's n_ops)."""
    from autoparallel.api import context
    from autoparallel.plan import Plan
    if kind == "probe":
        probe = next(p for p in ct.PROBES if p.name == name)
        plan = ct.probe_plan(probe, "h200")
        model, seq = ct.meta_model(ct.MODELS[probe.model]), ct.SEQ
    else:
        cfg = next(c for c in ts.CONFIGS if c.name == name)
        plan, model, seq = Plan.load(cfg.plan_file), ts._meta_model(cfg), cfg.seq
    cm = context(model, "h200", 1, seq, gpus_per_node=1).cost_model
    return float(len(cm.segments(cm.placements_for(plan), False)[cm.graph.blocks[0]].fwd.flops))


def cmd_report(args: argparse.Namespace) -> int:
    recs = [json.loads(line) for line in Path(args.raw).read_text().splitlines() if line.strip()]
    from autoparallel.api import context
    from autoparallel.plan import Plan
    short = [r for r in recs if r.get("kind") == "short"]
    if short and args.profile:
        print("| short configuration | measured ms | predicted ms | error |\n|---|---:|---:|---:|")
        for r in short:
            plan = Plan.from_dict(r["plan"])
            import torch

            from autoparallel.models import build_model, load_model_spec
            with torch.device("meta"):
                meta = build_model(load_model_spec(ts.MODELS[r["model"]]))
            est = context(meta, args.profile, 1, SHORT_SEQ, gpus_per_node=1).cost_model.estimate(plan)
            m = r["measured"]["step_time_s"]
            print(f"| {r['name']} | {m * 1e3:.1f} | {est.step_time_s * 1e3:.1f} | {est.step_time_s / m - 1:+.1%} |")
        print()
    for r in recs:
        if r["name"] == "launch":
            print(f"launch of a small kernel: {r['idle'] * 1e6:.1f} us with the GPU idle, "
                  f"{r['busy'] * 1e6:.1f} us behind a GEMM chain\n")
    print("| model | blocks timed | host ms | GPU ms | forward ops a block (cost model) | host us per op |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in recs:
        if r.get("kind") not in ("probe", "sweep"):
            continue
        ops = _ops_per_block(r["name"], r["kind"])
        host, gpu = statistics.median(r["host_s"]), statistics.median(r["gpu_s"])
        print(f"| {r['name']} ({r['kind']}) | {r['blocks']} | {host * 1e3:.2f} | {gpu * 1e3:.2f} | {ops:.0f} | "
              f"{host / (ops * r['blocks']) * 1e6:.1f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--steps", type=int, default=10)
    r = sub.add_parser("report")
    r.add_argument("--raw", required=True)
    r.add_argument("--profile", default=None, help="a fitted profile: predict the short configurations")
    args = p.parse_args(argv)
    return cmd_measure(args) if args.cmd == "measure" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
