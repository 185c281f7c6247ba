"""AutoParallelTrainer itself against the cost model's prediction of the exact plan it runs (issue 12).

Three steps, so that the GPUs only measure and every prediction is recomputed on any machine:

    python benchmarks/trainer_sweep.py plans                    # CPU: plan every configuration -> plan files
    python3 benchmarks/trainer_sweep.py measure --gpus 1 --out $OUT/single.jsonl          # one GPU
    torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out $OUT/dist.jsonl
    autoparallel calibrate --trainer --raw $OUT/probes.jsonl                      # the host probes, same machine
    torchrun --nproc-per-node 2 $(which autoparallel) calibrate --trainer --raw $OUT/probes.jsonl
    python benchmarks/trainer_sweep.py fit --raw RAW.jsonl ... --probes probes.jsonl   # CPU: -> fitted profile
    python benchmarks/trainer_sweep.py report --raw RAW.jsonl [RAW.jsonl ...]    # CPU: predict, compare

`plans` writes benchmarks/results/trainer_sweep_plans/NAME.yaml with the planner of this checkout and
the `h200` profile (the planner's own pick where a configuration pins nothing, else its best plan
under the pins). `measure` builds each model on the meta device, hands it and the plan file to
AutoParallelTrainer (which materializes it and runs its default runtime: FSDP2 mixed precision,
fused AdamW on CUDA) and times `trainer.step(batch)` on random tokens: warm-up steps, then timed steps
between device synchronizations; peak memory is torch.cuda.max_memory_allocated over the timed steps
(rank 0) above what was allocated before the configuration was built (earlier configurations of the
same process can leave tensors behind: a compiled trainer's graphs held 5 GiB). `report` predicts each plan with CostModel.estimate and writes
benchmarks/results/trainer_sweep_h200.json (one record per configuration: gpus, predicted{step_time_s,
peak_memory_gib}, measured{...}) and docs/trainer_sweep.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from h200_memory_time import MOE_1B  # noqa: E402  (the same models as the earlier H200 benchmarks)
from h200_trainer_throughput import LLAMA_1_3B  # noqa: E402

from autoparallel.calibrate_trainer import fit_host_terms, load_records, time_trainer_steps  # noqa: E402

PLANS = ROOT / "benchmarks" / "results" / "trainer_sweep_plans"
RESULTS = ROOT / "benchmarks" / "results" / "trainer_sweep_h200.json"
DOC = ROOT / "docs" / "trainer_sweep.md"
PROFILE = "h200"
BUDGET = "140GB"

GPT_350M = {"name": "gpt-350m", "model_type": "gpt2", "vocab_size": 50304, "n_positions": 2048, "n_embd": 1024,
            "n_layer": 24, "n_head": 16}
LLAMA_7B = {"name": "llama-7b", "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 4096}
MODELS = {m["name"]: m for m in (LLAMA_1_3B, GPT_350M, MOE_1B, LLAMA_7B)}


@dataclass(frozen=True)
class SweepConfig:
    name: str
    model: str                      # key of MODELS
    gpus: int
    rows: int                       # global batch (sequences per step)
    seq: int = 2048
    # planner pins; the "-auto" configurations pin only compile=1: the planner's own plan, compiled
    fix: dict[str, Any] = field(default_factory=dict)
    profile: bool = False           # also record one profiled step's kernel time per class

    @property
    def plan_file(self) -> Path:
        return PLANS / f"{self.name}.yaml"


def _c(name: str, model: str, gpus: int, rows: int, **kw: Any) -> SweepConfig:
    return SweepConfig(name, model, gpus, rows, **kw)


CONFIGS = [
    # one GPU: micro-batching, every recompute mode, eager and compiled, three model kinds
    _c("1g-llama-auto", "llama-1.3b", 1, 8, fix={"compile": 1}, profile=True),
    _c("1g-llama-eager", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "compile": 0}, profile=True),
    _c("1g-llama-mb4x2", "llama-1.3b", 1, 8, fix={"micro_batch": 4, "compile": 0}),
    _c("1g-llama-selective", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "recompute": "selective", "compile": 0}),
    _c("1g-llama-full", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("1g-llama-mb2x4-full", "llama-1.3b", 1, 8, fix={"micro_batch": 2, "recompute": "full", "compile": 0}),
    _c("1g-llama-op", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "recompute": "op", "compile": 0}),
    _c("1g-llama-b16", "llama-1.3b", 1, 16, fix={"compile": 0}),
    _c("1g-gpt-auto", "gpt-350m", 1, 8, fix={"compile": 1}),
    _c("1g-gpt-eager", "gpt-350m", 1, 8, fix={"micro_batch": 8, "compile": 0}),
    _c("1g-gpt-selective", "gpt-350m", 1, 8, fix={"micro_batch": 8, "recompute": "selective", "compile": 0}),
    _c("1g-moe-eager", "moe-1.2b-8e", 1, 8, fix={"micro_batch": 8, "compile": 0}, profile=True),
    _c("1g-moe-full", "moe-1.2b-8e", 1, 8, fix={"micro_batch": 4, "recompute": "full", "compile": 0}),
    _c("1g-moe-auto", "moe-1.2b-8e", 1, 8, fix={"compile": 1}),
    # two GPUs: dp with ZeRO 0-3, tp2 + SP, pp2 1F1B and interleaved, ep2, eager and compiled
    _c("2g-llama-auto", "llama-1.3b", 2, 16, fix={"compile": 1}, profile=True),
    _c("2g-llama-eager", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "compile": 0}),
    _c("2g-llama-zero0", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 0, "micro_batch": 8, "compile": 0}),
    _c("2g-llama-zero1", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 1, "micro_batch": 4, "compile": 0}),
    _c("2g-llama-zero3", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 3, "micro_batch": 8, "compile": 0}),
    _c("2g-llama-op", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "recompute": "op", "compile": 0}),
    _c("2g-llama-zero2-full", "llama-1.3b", 2, 16,
       fix={"dp": 2, "zero": 2, "micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("2g-llama-tp2sp", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 1, "compile": 0}, profile=True),
    _c("2g-llama-tp2", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 0, "micro_batch": 4, "compile": 0}),
    _c("2g-llama-tp2sp-compiled", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 1, "compile": 1}),
    _c("2g-llama-pp2", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 1, "micro_batch": 2, "compile": 0}),
    _c("2g-llama-pp2-vpp2", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 2, "micro_batch": 2, "compile": 0}),
    _c("2g-gpt-auto", "gpt-350m", 2, 16, fix={"compile": 1}),
    _c("2g-gpt-tp2sp", "gpt-350m", 2, 16, fix={"tp": 2, "sp": 1, "compile": 0}),
    _c("2g-moe-ep2", "moe-1.2b-8e", 2, 16, fix={"ep": 2, "micro_batch": 8, "compile": 0}),
    _c("2g-moe-dp2", "moe-1.2b-8e", 2, 16, fix={"dp": 2, "micro_batch": 8, "compile": 0}),
    # added with the trainer's host terms (2026-11-30, second session): more micro-batches and stages
    _c("1g-llama-mb2x4", "llama-1.3b", 1, 8, fix={"micro_batch": 2, "recompute": "none", "compile": 0}),
    _c("1g-gpt-mb2x4-op", "gpt-350m", 1, 8, fix={"micro_batch": 2, "recompute": "op", "compile": 0}),
    _c("2g-llama-pp2-mb4", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 1, "micro_batch": 4, "compile": 0}),
    _c("2g-llama-zero3-mb2x4-full", "llama-1.3b", 2, 16,
       fix={"dp": 2, "zero": 3, "micro_batch": 2, "recompute": "full", "compile": 0}),
    _c("2g-moe-ep2-mb4x2", "moe-1.2b-8e", 2, 16, fix={"ep": 2, "micro_batch": 4, "compile": 0}),
    _c("2g-gpt-dp2-eager", "gpt-350m", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "compile": 0}),
    # one-GPU references at the two-GPU global batch of 16 rows, eager (docs/loss_matching.md)
    _c("1g-gpt-b16", "gpt-350m", 1, 16, fix={"micro_batch": 16, "compile": 0}),
    _c("1g-moe-b16", "moe-1.2b-8e", 1, 16, fix={"micro_batch": 16, "compile": 0}),
    # a ~7B llama at seq 4096, 8 rows per step: a scale none of the fits saw
    _c("2g-llama7b-eager", "llama-7b", 2, 8, seq=4096, fix={"compile": 0}),
    _c("2g-llama7b-compiled", "llama-7b", 2, 8, seq=4096, fix={"compile": 1}),
]


def _meta_model(cfg: SweepConfig):
    import torch

    from autoparallel.models import build_model, load_model_spec
    with torch.device("meta"):
        return build_model(load_model_spec(MODELS[cfg.model]))


# ============================================================================ plans (CPU)
def cmd_plans(args: argparse.Namespace) -> int:
    from autoparallel.api import plan_model
    PLANS.mkdir(parents=True, exist_ok=True)
    for cfg in _selected(args.only):
        model = _meta_model(cfg)
        t = time.perf_counter()
        plan = plan_model(model, hardware=PROFILE, gpus=cfg.gpus, gpus_per_node=cfg.gpus, global_batch=cfg.rows,
                          seq_len=cfg.seq, max_memory_per_gpu=BUDGET, fix=cfg.fix or None)
        plan.save(cfg.plan_file)
        print(f"{cfg.name:28s} {_describe(plan)}  ({time.perf_counter() - t:.1f} s)", flush=True)
    return 0


def _describe(plan: Any) -> str:
    rec = sorted(set(plan.recompute))
    return (f"dp{plan.dp} tp{plan.tp} pp{plan.pp} vpp{plan.vpp} ep{plan.ep} mb{plan.micro_batch}x"
            f"{plan.num_micro_batches} zero{plan.zero}{' sp' if plan.sequence_parallel else ''} "
            f"recompute {'/'.join(rec)}")


def _selected(only: str | None, skip: str | None = None) -> list[SweepConfig]:
    names = set(only.split(",")) if only else {c.name for c in CONFIGS}
    names -= set(skip.split(",")) if skip else set()
    return [c for c in CONFIGS if c.name in names]


# ============================================================================ measure (GPU)
def _kernel_class(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "adam" in n:
        return "optimizer"
    if "nccl" in n:
        return "comm"
    if any(k in n for k in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "sm90_", "sm80_", "cublas")):
        return "gemm"
    if "copy" in n or "cast" in n or "to_copy" in n:
        return "copy"
    if "reduce" in n or "norm" in n or "softmax" in n:
        return "reduce"
    return "elementwise"


def _profiled_step(trainer: Any, batch: Any) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        trainer.step(batch)
        torch.cuda.synchronize()
    averages = prof.key_averages()  # aggregating the events is the slow part: once
    kernels: dict[str, float] = {}
    for e in averages:
        if e.device_type is not None and str(e.device_type).endswith("CUDA"):
            t = getattr(e, "self_device_time_total", 0.0) * 1e-6
            if t > 0:
                kernels[e.key[:120]] = kernels.get(e.key[:120], 0.0) + t
    classes: dict[str, float] = {}
    for name, t in kernels.items():
        classes[_kernel_class(name)] = classes.get(_kernel_class(name), 0.0) + t
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
    # device time of the kernels each aten op launched itself (self), its call count and host time: the
    # per-op comparison with the cost model's per-op times
    ops = {e.key: [e.count, getattr(e, "self_device_time_total", 0.0) * 1e-6, e.self_cpu_time_total * 1e-6]
           for e in averages if e.key.startswith(("aten::", "c10d::", "_c10d", "FSDP", "fsdp"))}
    return {"classes_s": classes, "kernel_s": sum(kernels.values()), "top_kernels_s": dict(top), "ops": ops}


# Every plan of a model starts from the same weights, so that their losses compare (docs/loss_matching.md):
# the catalog init (init_weights) with each parameter drawn from its own generator seeded by (seed, its
# name), built once per model and process, then handed to the trainer as a materialized model, which
# copies each rank's slice out of it (rank 0's values broadcast). The weights live on the host during the
# timed steps: no device memory. Not for the 7B: it has no one-GPU reference to compare with (a 7B with
# fp32 master weights and Adam state needs 112 GB before activations), and its host copy (28 GB per rank,
# plus the trainer's broadcast copy) would cost more setup than its two configurations are worth; it keeps
# the trainer's own meta-device init under a seed drawn per run.
SHARED_INIT_SEED = 0
PER_RUN_INIT = {"llama-7b"}


def init_label(model: str) -> str:
    """What a record's "init" says: "seed0" for the shared init, "per-run" for a seed drawn per run."""
    return "per-run" if model in PER_RUN_INIT else f"seed{SHARED_INIT_SEED}"


def _shared_init_model(model: str, cache: dict[str, Any]) -> Any:
    """`model` with the shared initial weights, on the host. Drawn on the GPU when there is one (the
    1.3B's init_weights took 18 s on two host cores, 2026-11-30; every measurement draws on the GPU, so
    all plans see the same numbers), then moved to the host before the configuration's memory baseline
    is taken (the device copy is freed by the empty_cache before it)."""
    import torch

    from autoparallel.models import build_model, load_model_spec
    if model not in cache:
        with torch.device("meta"):
            m = build_model(load_model_spec(MODELS[model]))
        m.to_empty(device="cuda" if torch.cuda.is_available() else "cpu")
        with torch.no_grad():
            m.init_weights(seed=SHARED_INIT_SEED)
        cache[model] = m.to("cpu")
        del m
    return cache[model]


def cmd_measure(args: argparse.Namespace) -> int:
    import torch

    from autoparallel import AutoParallelTrainer
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out)
    shared: dict[str, Any] = {}
    for cfg in _selected(args.only, args.skip):
        if cfg.gpus != args.gpus:
            continue
        rec: dict[str, Any] = {"name": cfg.name, "gpus": cfg.gpus, "init": init_label(cfg.model)}
        try:
            source = None if cfg.model in PER_RUN_INIT else _shared_init_model(cfg.model, shared)
            gc.collect()  # the previous configuration's trainer (and compiled graphs holding its tensors)
            torch._dynamo.reset()  # each compiled configuration compiles afresh, within the recompile limit
            gc.collect()
            torch.cuda.empty_cache()
            # what an earlier configuration left allocated is not this one's: peaks are taken above it
            base = torch.cuda.memory_allocated()
            model = _meta_model(cfg) if source is None else source
            vocab = MODELS[cfg.model]["vocab_size"]
            trainer = AutoParallelTrainer(model, optimizer=None, plan=cfg.plan_file)  # compile as planned
            # the source's broadcast buckets (2 x 256 MiB on the device) are freed: not kept reserved
            torch.cuda.empty_cache()
            gen = torch.Generator().manual_seed(0)
            batches = [torch.randint(0, vocab, (cfg.rows, cfg.seq + 1), generator=gen) for _ in range(4)]
            t0 = time.perf_counter()
            timing = time_trainer_steps(trainer, batches, args.warmup, args.steps, base)
            rec["wall_s"] = time.perf_counter() - t0
            rec["measured"] = {"step_time_s": timing.step_time_s, "step_times_s": timing.step_times_s,
                               "peak_memory_gib": timing.peak_memory_gib,
                               "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                               "allocated_before_gib": base / 2**30}
            rec["losses"] = timing.losses
            if (cfg.profile and args.profile) or args.profile_all:
                rec["profile"] = _profiled_step(trainer, batches[0])
            del trainer
        except Exception as ex:  # one configuration's failure must not lose the others
            rec["error"] = repr(ex)[:500]
            rec["traceback"] = traceback.format_exc()[-2000:]
        if rank == 0:
            print(json.dumps({k: v for k, v in rec.items() if k not in ("traceback", "losses")})[:600], flush=True)
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


# ============================================================================ report (CPU)
# The trainer's runtime terms are fitted on these configurations only (`fit`); every other one is held out.
# In this order, each fit using the ones before it: (calibration key, configuration, search range).
# The host terms come first, from the small probes of `autoparallel calibrate --trainer` measured on the
# same machine (none of them is a configuration of the sweep).
FIT = {"fsdp_copy_fraction": "1g-llama-eager", "compiled_memory_fraction": "1g-llama-auto"}
FIT_RANGE = {"fsdp_copy_fraction": (0.02, 1.0), "compiled_memory_fraction": (0.05, 1.0)}
FITTED_PROFILE = ROOT / "benchmarks" / "results" / "h200_trainer_fit.yaml"


def predict(cfg: SweepConfig, profile: Any = PROFILE, raw: dict | None = None) -> tuple[dict[str, float], Any]:
    """Predicted step time and rank-0 allocated peak (stage 0; without the allocator reserve, which
    torch.cuda.max_memory_allocated does not see) of the configuration's plan; `raw`: the measured
    record, whose `compile` says how it ran when that differs from the plan file (older runs)."""
    import dataclasses

    from autoparallel.api import context
    from autoparallel.plan import Plan
    plan = Plan.load(cfg.plan_file)
    if raw is not None and "compile" in raw:
        plan = dataclasses.replace(plan, compile=bool(raw["compile"]))
    ctx = context(_meta_model(cfg), profile, cfg.gpus, cfg.seq, gpus_per_node=cfg.gpus, max_memory_per_gpu=BUDGET)
    est = ctx.cost_model.estimate(plan, ctx.budget_bytes)
    stage0 = est.memory_breakdown_gib[0]
    allocated = sum(v for k, v in stage0.items() if k != "allocator")
    return {"step_time_s": est.step_time_s, "peak_memory_gib": allocated}, est


H200_BF16_PEAK = 989e12


def mfu(cfg: SweepConfig, step_s: float) -> float:
    """(6N + 12 L h s) tokens/s / (GPUs x 989 TFLOP/s): the MFU definition of the two-GPU issue (N the
    parameters, L layers, h hidden size, s the sequence length; attention counted without the causal
    halving, as PaLM does)."""
    m = MODELS[cfg.model]
    layers = m.get("num_hidden_layers", m.get("n_layer"))
    hidden = m.get("hidden_size", m.get("n_embd"))
    n = sum(p.numel() for p in _meta_model(cfg).parameters())
    tokens_per_s = cfg.rows * cfg.seq / step_s
    return (6 * n + 12 * layers * hidden * cfg.seq) * tokens_per_s / (cfg.gpus * H200_BF16_PEAK)


def _measured(raws: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for raw in raws:
        for line in Path(raw).read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[rec["name"]] = rec
    return out


def cmd_fit(args: argparse.Namespace) -> int:
    """Each runtime term by bisection so that its one fitting configuration is predicted exactly (the
    step time is monotone in each term); prints the calibration entries for the profile."""
    import dataclasses

    from hardware_profiles import load_profile, profile_to_yaml
    base = load_profile(PROFILE)
    host = fit_host_terms(load_records(args.probes), base)
    for name, r in host.residuals.items():
        print(f"  probe {name}: model {r:+.1%}")
    print("host terms: " + ", ".join(f"{k} {v}" for k, v in host.terms.items()), flush=True)
    base = dataclasses.replace(base, calibration={**base.calibration, **host.terms})
    measured = _measured(args.raw)
    fitted: dict[str, float] = {}
    for key, name in FIT.items():
        cfg = next(c for c in CONFIGS if c.name == name)
        target = measured[name]["measured"]["step_time_s"]
        lo, hi = FIT_RANGE[key]

        def step_time(value: float, key: str = key, cfg: SweepConfig = cfg, raw: dict = measured[name]) -> float:
            prof = dataclasses.replace(base, calibration={**base.calibration, **fitted, key: value})
            return predict(cfg, prof, raw)[0]["step_time_s"]

        rising = step_time(hi) > step_time(lo)
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (step_time(mid) < target) == rising else (lo, mid)
        fitted[key] = round((lo + hi) / 2, 3)
        print(f"{key}: {fitted[key]}  (from {name}: measured {target * 1e3:.1f} ms)", flush=True)
    Path(args.output).write_text(profile_to_yaml(base, extra={"calibration": fitted}))
    print(f"wrote {args.output}")
    return 0


def cmd_ship(args: argparse.Namespace) -> int:
    """Write the fitted trainer terms of `fit`'s profile into hardware_profiles/h200.yaml in place (its
    comments and every other value kept): the fractions, host terms and per-op rates."""
    import re

    import yaml

    from cost_models.host import HOST_TERMS
    fitted = yaml.safe_load(Path(args.profile).read_text())["calibration"]
    keys = ("fsdp_copy_fraction", "compiled_memory_fraction", *HOST_TERMS, "host_us_per_op", "host_us_per_op_moe",
            "host_us_per_op_fwd_bwd", "host_us_per_op_moe_fwd_bwd")
    path = ROOT / "hardware_profiles" / f"{PROFILE}.yaml"
    text = path.read_text()
    for key in keys:
        value = fitted[key]
        line = (f"  {key}:\n" + "".join(f"  - {v}\n" for v in value)) if isinstance(value, list) else f"  {key}: {value}\n"
        pattern = re.compile(rf"^  {key}:(?: [^\n]*\n|\n(?:  - [^\n]*\n)+)", re.M)
        if pattern.search(text):
            text = pattern.sub(lambda _, line=line: line, text, count=1)
        else:  # a new term: after the fitted fractions
            text = re.sub(r"^(  compiled_memory_fraction: [^\n]*\n)", lambda m, line=line: m.group(1) + line, text, count=1,
                          flags=re.M)
    for stale in re.findall(r"^  (host_us_per_[a-z_]+):", text, re.M):
        if stale not in keys and stale not in ("host_us_per_new_gemm_shape", "host_us_per_seen_gemm_shape"):
            text = re.sub(rf"^  {stale}: [^\n]*\n", "", text, flags=re.M)
    path.write_text(text)
    print(f"wrote the fitted terms of {args.profile} into {path}")
    return 0


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def cmd_report(args: argparse.Namespace) -> int:
    from hardware_profiles import load_profile
    profile = load_profile(args.profile)
    measured = _measured(args.raw)
    records = []
    for cfg in CONFIGS:
        m = measured.get(cfg.name)
        if m is None or "measured" not in m:
            continue
        pred, est = predict(cfg, profile, raw=m)
        from autoparallel.plan import Plan
        rec = {"name": cfg.name, "gpus": cfg.gpus, "model": cfg.model, "compile": est.plan.compile,
               "fitted": cfg.name in FIT.values(),
               "plan": _describe(Plan.load(cfg.plan_file)), "predicted": pred,
               "measured": {k: m["measured"][k] for k in ("step_time_s", "peak_memory_gib")},
               "breakdown": est.breakdown}
        rec["time_error"] = pred["step_time_s"] / m["measured"]["step_time_s"] - 1
        rec["memory_error"] = pred["peak_memory_gib"] / m["measured"]["peak_memory_gib"] - 1
        if "profile" in m:
            rec["profile"] = m["profile"]
        records.append(rec)
    failed = sorted(n for n, m in measured.items() if "error" in m)
    RESULTS.write_text(json.dumps({"profile": PROFILE, "records": records, "failed": failed}, indent=1) + "\n")
    lines = ["| configuration | gpus | plan | predicted ms | measured ms | error | predicted GiB | measured GiB | error "
             "| measured MFU |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        cfg = next(c for c in CONFIGS if c.name == r["name"])
        r["measured"]["mfu"] = mfu(cfg, r["measured"]["step_time_s"])
        lines.append(f"| {r['name']}{' (fit)' if r['fitted'] else ''} | {r['gpus']} | {r['plan']}"
                     f"{' compiled' if r['compile'] else ''} | "
                     f"{r['predicted']['step_time_s'] * 1e3:.1f} | {r['measured']['step_time_s'] * 1e3:.1f} | "
                     f"{r['time_error']:+.1%} | {r['predicted']['peak_memory_gib']:.1f} | "
                     f"{r['measured']['peak_memory_gib']:.1f} | {r['memory_error']:+.1%} | "
                     f"{r['measured']['mfu']:.1%} |")
    held = [r for r in records if not r["fitted"]]
    te = [abs(r["time_error"]) for r in held]
    me = [abs(r["memory_error"]) for r in held]
    summary = (f"{len(held)} held-out configurations (the {len(records) - len(held)} fitting ones excluded); time: mean "
               f"|error| {statistics.mean(te):.1%}, max {max(te):.1%}, {sum(e <= 0.10 for e in te)} within 10%; "
               f"memory: mean |error| {statistics.mean(me):.1%}, max {max(me):.1%}, "
               f"{sum(e <= 0.05 for e in me)} within 5%" if held else "no records")
    print("\n".join(lines))
    print(summary)
    if failed:
        print("failed:", ", ".join(failed))
    raws = " ".join(_rel(r) for r in args.raw)
    fitted = ", ".join(f"`{k}` from {v}" for k, v in FIT.items())
    DOC.write_text(
        "# AutoParallelTrainer against the cost model (H200)\n\n"
        f"Command: `python benchmarks/trainer_sweep.py report --raw {raws} --profile {_rel(args.profile)}` "
        "(measured with the `measure` commands in the script's docstring on a lent two-H200 machine; plans "
        "from `plans`).\n\n"
        "The profile is `fit`'s: the trainer's host terms fitted from the small probes of `autoparallel "
        "calibrate --trainer` measured on the same machine (autoparallel/calibrate_trainer.py; none is a "
        f"configuration below), then {fitted}; every other row is held out. Predicted memory "
        "is rank 0's allocated peak (stage 0, without the allocator reserve) against "
        "torch.cuda.max_memory_allocated.\n\n" + "\n".join(lines) + f"\n\n{summary}\n\n"
        "What the errors say, mechanism by mechanism, and what is left: docs/trainer_sweep_notes.md.\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plans")
    p.add_argument("--only", default=None)
    m = sub.add_parser("measure")
    m.add_argument("--gpus", type=int, required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--only", default=None)
    m.add_argument("--skip", default=None, help="comma-separated configurations to leave out")
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--steps", type=int, default=6)
    m.add_argument("--profile", action="store_true", help="profile one step of the configurations marked so")
    m.add_argument("--profile-all", action="store_true", help="profile one step of every configuration")
    r = sub.add_parser("report")
    r.add_argument("--raw", nargs="+", required=True)
    r.add_argument("--profile", default=str(FITTED_PROFILE), help="the profile `fit` wrote (default: %(default)s)")
    sh = sub.add_parser("ship", help="write fit's terms into hardware_profiles/h200.yaml")
    sh.add_argument("--profile", default=str(FITTED_PROFILE))
    f = sub.add_parser("fit")
    f.add_argument("--raw", nargs="+", required=True)
    f.add_argument("--probes", nargs="+", required=True, help="`autoparallel calibrate --trainer --raw` files")
    f.add_argument("--output", default=str(FITTED_PROFILE))
    args = ap.parse_args(argv)
    return {"plans": cmd_plans, "measure": cmd_measure, "report": cmd_report, "fit": cmd_fit,
            "ship": cmd_ship}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
