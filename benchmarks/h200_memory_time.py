"""Predicted vs measured peak memory and step time on one GPU (issue 7 a and b).

Two halves, so that the GPU machine needs neither the planner nor OR-Tools:

    # on the GPU machine: measure every configuration, raw numbers to JSON (no cost model involved)
    python benchmarks/h200_memory_time.py measure --out raw.json [--only NAME,...] [--smoke]
    # anywhere: predict each configuration with the cost model and the calibrated profile, join the
    # pairs, write benchmarks/results/h200_memory_time.json and docs/benchmarks_h200.md
    python benchmarks/h200_memory_time.py report --raw raw.json [--profile hardware_profiles/h200.yaml]

The training loop that is measured keeps exactly the layout the cost model accounts for a plan with
param_dtype bf16 and grad_reduce_dtype fp32 (Megatron-LM's mixed-precision layout, CostModel._memory):
bf16 parameters (2 B/param), a persistent fp32 gradient buffer (4 B/param; each micro-batch's bf16
weight gradient is added into it by a post-accumulate hook and then freed), fp32 master parameters and
the two Adam moments (12 B/param) in torch's fused AdamW, whose result is copied back into the bf16
parameters. Activations are what autograd saves in bf16 with SDPA flash attention (or the eager
attention of Megatron's GPT); recompute "full" checkpoints each block (torch.utils.checkpoint,
non-reentrant, as the trainer does), "selective" checkpoints the attention core of eager attention
(Korthikanti et al. 2022: the ops whose outputs are seq x seq), which is what the cost model assumes.

Emulated shards run alone on the one GPU:
  tp=T   the piece one rank of a Megatron TP=T plan holds: heads, key/value heads, MLP width and
         vocabulary divided by T, hidden size and norms whole (the collectives are not run; the
         prediction is the per-rank step time minus its TP communication)
  pp=P   stage 0 of a P-stage 1F1B pipeline: the embedding and the first L/P blocks, with P
         micro-batches in flight (P forwards, then P backwards, as stage 0 holds at its peak)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoparallel.models import build_model  # noqa: E402
from autoparallel.specs import ModelSpec, load_model_spec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "h200_memory_time.json"
DOC = ROOT / "docs" / "benchmarks_h200.md"
GIB = 2**30

# Models beyond the catalog (HF config dicts, read by load_model_spec like a user's config.json).
LLAMA_1B = {"name": "llama-1.1b", "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 8192}
LLAMA_3B = {"name": "llama-3b", "model_type": "llama", "vocab_size": 32000, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
            "num_key_value_heads": 8, "max_position_embeddings": 8192}
MOE_1B = {"name": "moe-1.2b-8e", "model_type": "qwen2_moe", "vocab_size": 32000, "hidden_size": 1024,
          "intermediate_size": 4096, "moe_intermediate_size": 2816, "shared_expert_intermediate_size": 2816,
          "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 8, "num_experts": 8,
          "num_experts_per_tok": 2, "norm_topk_prob": False, "max_position_embeddings": 8192}

# fine-grained experts (qwen3-moe style: 64 experts of width 512, top-8, every layer MoE): each grouped
# GEMM runs 64 small groups, the regime where the per-group efficiency curve matters
MOE_64E = {"name": "moe-1.3b-64e", "model_type": "qwen3_moe", "vocab_size": 32000, "hidden_size": 1024,
           "intermediate_size": 4096, "moe_intermediate_size": 512, "num_hidden_layers": 12,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "num_experts": 64,
           "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 8192}


def gpt_eager(name: str, hidden: int, layers: int, heads: int) -> dict:
    """A GPT-3 size with Megatron's eager attention and dropout 0.1 (selective recompute has work)."""
    return {"name": f"{name}-eager", "model_type": "gpt2", "vocab_size": 50257, "n_positions": 2048,
            "n_embd": hidden, "n_layer": layers, "n_head": heads, "attn_impl": "eager", "resid_pdrop": 0.1}


@dataclass(frozen=True)
class Config:
    name: str
    model: str | dict          # catalog name or HF config dict
    micro_batch: int
    seq_len: int
    recompute: str = "none"    # none | selective | full, every block
    micro_batches: int = 1     # gradient-accumulation steps per optimizer step
    tp: int = 1                # emulated tensor-parallel shard (see module docstring)
    pp: int = 1                # emulated first pipeline stage
    group: str = ""            # configurations that are alternatives for one job (same model, batch)

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.micro_batches * self.seq_len


JOB = "llama-1.1b, 16 x 2048 tokens"  # the "pick" group: one job, several plans
CONFIGS: tuple[Config, ...] = (
    Config("gpt3-125m mb16 s1k", "gpt3-125m", 16, 1024),
    Config("gpt3-350m-eager mb8 s2k", gpt_eager("gpt3-350m", 1024, 24, 16), 8, 2048),
    Config("gpt3-350m-eager mb8 s2k sel", gpt_eager("gpt3-350m", 1024, 24, 16), 8, 2048, "selective"),
    Config("gpt3-1.3b-eager mb4 s2k sel", gpt_eager("gpt3-1.3b", 2048, 24, 16), 4, 2048, "selective"),
    Config("gpt3-1.3b mb8 s2k full", "gpt3-1.3b", 8, 2048, "full"),
    Config("llama-1.1b mb16 s2k", LLAMA_1B, 16, 2048, group=JOB),
    Config("llama-1.1b mb8x2 s2k", LLAMA_1B, 8, 2048, micro_batches=2, group=JOB),
    Config("llama-1.1b mb4x4 s2k", LLAMA_1B, 4, 2048, micro_batches=4, group=JOB),
    Config("llama-1.1b mb2x8 s2k", LLAMA_1B, 2, 2048, micro_batches=8, group=JOB),
    Config("llama-1.1b mb1x16 s2k", LLAMA_1B, 1, 2048, micro_batches=16, group=JOB),
    Config("llama-1.1b mb16 s2k full", LLAMA_1B, 16, 2048, "full", group=JOB),
    Config("llama-1.1b mb4x4 s2k full", LLAMA_1B, 4, 2048, "full", micro_batches=4, group=JOB),
    Config("llama-3b mb2 s8k full", LLAMA_3B, 2, 8192, "full"),
    Config("llama-3b mb1 s8k", LLAMA_3B, 1, 8192),
    Config("llama2-7b mb1 s2k full", "llama2-7b", 1, 2048, "full"),
    Config("llama2-7b tp2-shard mb1 s4k", "llama2-7b", 1, 4096, tp=2),
    Config("llama2-13b tp4-shard mb2 s4k full", "llama2-13b", 2, 4096, "full", tp=4),
    Config("llama2-13b tp8-shard mb4 s4k", "llama2-13b", 4, 4096, tp=8),
    Config("llama2-7b pp4-stage0 mb1 s4k", "llama2-7b", 1, 4096, micro_batches=4, pp=4),
    Config("mistral-7b pp2-stage0 mb2 s2k full", "mistral-7b", 2, 2048, "full", micro_batches=2, pp=2),
    Config("moe-1.2b-8e mb8 s2k", MOE_1B, 8, 2048),
    Config("moe-1.2b-8e mb4 s4k full", MOE_1B, 4, 4096, "full"),
    Config("moe-1.3b-64e mb4 s2k", MOE_64E, 4, 2048),
    Config("moe-1.3b-64e mb8 s2k full", MOE_64E, 8, 2048, "full"),
)


# =========================================================================== model pieces
def config_spec(cfg: Config) -> ModelSpec:
    return load_model_spec(cfg.model)


def shard_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """The spec of what one rank of a Megatron TP=tp plan computes: q/k/v and MLP up/gate columns, o and
    down rows, vocabulary rows of the embedding and the head are split tp-way; norms stay whole."""
    if tp == 1:
        return spec
    for what, n in (("heads", spec.num_heads), ("kv heads", spec.num_kv_heads), ("MLP width", spec.intermediate_size),
                    ("vocabulary", spec.vocab_size)):
        if n % tp:
            raise ValueError(f"{spec.name}: tp={tp} does not divide the {what} ({n})")
    if spec.is_moe:
        raise ValueError("tensor-parallel shards of MoE models are not emulated")
    return dataclasses.replace(spec, name=f"{spec.name}-tp{tp}", num_heads=spec.num_heads // tp,
                               num_kv_heads=spec.num_kv_heads // tp, intermediate_size=spec.intermediate_size // tp,
                               vocab_size=spec.vocab_size // tp)


def first_stage_layers(num_layers: int, pp: int) -> int:
    """Blocks of stage 0 under the cost model's balanced split (cost_models.estimate.balanced_stages)."""
    return num_layers // pp + (1 if num_layers % pp else 0)


def build_piece(cfg: Config, device: torch.device) -> tuple[nn.Module, ModelSpec]:
    """The module one rank runs (whole model, TP shard or first pipeline stage), bf16 on `device`."""
    spec = shard_spec(config_spec(cfg), cfg.tp)
    with torch.device("meta"):
        model = build_model(spec)
    if cfg.pp > 1:
        keep = first_stage_layers(spec.num_layers, cfg.pp)
        for key in list(model.layers.keys()):
            if int(key) >= keep:
                del model.layers[key]
        model.norm = None
        model.lm_head = None
    model = model.to(torch.bfloat16).to_empty(device=device)
    model.init_weights(seed=0)
    if cfg.recompute == "full":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for key in list(model.layers.keys()):
            model.layers[key] = checkpoint_wrapper(model.layers[key])
    elif cfg.recompute == "selective":
        if spec.attn_impl != "eager":
            raise ValueError("selective recompute is measured on eager attention (with SDPA the cost model's "
                             "selective recompute is a no-op)")
        # the model's own switch (what the trainer sets): the seq x seq core under torch.utils.checkpoint,
        # selective recompute as Korthikanti et al. (and the cost model) define it
        for block in model.layers.values():
            block.attn.recompute_core = True
    model.train()
    return model, spec


# =========================================================================== the training loop
class MixedPrecisionLoop:
    """bf16 parameters, persistent fp32 gradient buffers, fp32 master parameters + fused AdamW (see the
    module docstring). `step(batches)` runs forward/backward per micro-batch, then the optimizer."""

    def __init__(self, model: nn.Module, loss: str, lr: float = 1e-4) -> None:
        self.model = model
        self.loss = loss  # "lm": cross entropy over the logits; "stage": backward from a given gradient
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().to(torch.float32, copy=True) for p in self.params]
        self.grads = [torch.zeros_like(m) for m in self.master]
        for m, g in zip(self.master, self.grads):
            m.grad = g  # the optimizer reads the persistent fp32 buffer directly
        fused = self.params[0].device.type == "cuda"
        self.opt = torch.optim.AdamW(self.master, lr=lr, fused=fused or None)
        for p, g in zip(self.params, self.grads):
            p.register_post_accumulate_grad_hook(partial(_accumulate, g))
        self.probe: dict[str, float] = {}

    def step(self, batches: list[torch.Tensor], grad_out: torch.Tensor | None, events: dict | None = None) -> None:
        # SDPA runs the flash kernels (what the tracer costs), never a silent fallback to the math path
        with _flash_only(batches[0].device):
            self._fwd_bwd(batches, grad_out, events is not None)
        if events is not None:
            events["fwd_bwd_end"].record()
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)  # fp32 master -> bf16 working copy
            torch._foreach_zero_(self.grads)

    def accumulate_seconds(self, reps: int = 5) -> float:
        """Device time of one pass of the gradient hooks' work over all parameters (bf16 into fp32)."""
        from autoparallel.calibrate import time_call

        def once() -> None:
            with torch.no_grad():
                for g, p in zip(self.grads, self.params):
                    g.add_(p)  # what _accumulate does per parameter: read bf16 + fp32, write fp32
        t = time_call(once, self.params[0].device, reps=reps, warmup=1)
        with torch.no_grad():
            torch._foreach_zero_(self.grads)
        return t

    def _fwd_bwd(self, batches: list[torch.Tensor], grad_out: torch.Tensor | None, probe: bool) -> None:
        dev = batches[0].device
        if self.loss == "lm":
            for i, tokens in enumerate(batches):
                before = _allocated(dev)
                logits = self.model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, -2).float(), tokens[:, 1:].flatten())
                del logits  # the bf16 logits are not saved for backward (the fp32 log-probs are)
                if probe and i == 0:
                    self.probe["forward_bytes"] = _allocated(dev) - before  # what backward will consume
                (loss / len(batches)).backward()
        else:  # pipeline stage 0: all forwards in flight, then all backwards (1F1B holds P at its peak)
            outs = []
            before = _allocated(dev)
            for tokens in batches:
                outs.append(self.model(tokens[:, :-1]))
            if probe:
                self.probe["forward_bytes"] = _allocated(dev) - before
            for out in outs:
                out.backward(grad_out)
            del outs


def _flash_only(device: torch.device):
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if device.type == "cuda" else nullcontext()


def _accumulate(buf: torch.Tensor, p: torch.Tensor) -> None:
    buf.add_(p.grad)
    p.grad = None


def _allocated(dev: torch.device) -> float:
    return float(torch.cuda.memory_allocated(dev)) if dev.type == "cuda" else 0.0


# =========================================================================== measuring
def _profile_step(loop: MixedPrecisionLoop, batches: list, grad_out: torch.Tensor | None) -> dict[str, Any]:
    """Device time per kernel class over one step (torch.profiler), for diagnosing time errors."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loop.step(batches, grad_out)
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if t > 0:
            kernels[e.key[:120]] = kernels.get(e.key[:120], 0.0) + t * 1e-6
    classes: dict[str, float] = {}
    for name, t in kernels.items():
        classes[_kernel_class(name)] = classes.get(_kernel_class(name), 0.0) + t
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:30]
    return {"classes_s": classes, "total_kernel_s": sum(kernels.values()), "top_kernels_s": dict(top),
            "kernel_count": len(kernels)}


def _host_profile_step(loop: MixedPrecisionLoop, batches: list, grad_out: torch.Tensor | None) -> dict[str, Any]:
    """Host time by op over one step (torch.profiler, CPU activity): where a host-bound step spends it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.step(batches, grad_out)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    rows = [(e.key, e.self_cpu_time_total * 1e-6, e.count) for e in prof.key_averages()]
    rows.sort(key=lambda r: -r[1])
    return {"self_cpu_s_total": sum(r[1] for r in rows),
            "top_self_cpu": [{"op": k[:100], "s": t, "count": c} for k, t, c in rows[:30]],
            "aten_op_calls": sum(c for k, _, c in rows if k.startswith("aten::"))}


def _kernel_class(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    if any(k in n for k in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "sm90_", "sm80_", "cublas")):
        return "gemm"
    if "nccl" in n:
        return "comm"
    return "other"


def measure_config(cfg: Config, device: torch.device, steps: int, warmup: int, profile_step: bool,
                   host_profile: bool = False) -> dict[str, Any]:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = _allocated(device)
    model, spec = build_piece(cfg, device)
    params = sum(p.numel() for p in model.parameters())
    loop = MixedPrecisionLoop(model, "stage" if cfg.pp > 1 else "lm")
    states = _allocated(device) - base
    gen = torch.Generator(device="cpu").manual_seed(0)
    batches = [torch.randint(0, spec.vocab_size, (cfg.micro_batch, cfg.seq_len + 1), generator=gen).to(device)
               for _ in range(cfg.micro_batches)]
    grad_out = (torch.randn(cfg.micro_batch, cfg.seq_len, spec.hidden_size, generator=gen).to(device, torch.bfloat16)
                if cfg.pp > 1 else None)
    for _ in range(warmup):  # the first step allocates the Adam moments; the second settles the allocator
        loop.step(batches, grad_out)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    persistent = _allocated(device) - base   # params, gradient buffers, master weights, Adam moments
    times, fwd_bwd = [], []
    for _ in range(steps):
        if cuda:
            ev = {k: torch.cuda.Event(enable_timing=True) for k in ("start", "fwd_bwd_end", "end")}
            ev["start"].record()
            loop.step(batches, grad_out, ev)
            ev["end"].record()
            ev["end"].synchronize()
            times.append(ev["start"].elapsed_time(ev["end"]) * 1e-3)
            fwd_bwd.append(ev["start"].elapsed_time(ev["fwd_bwd_end"]) * 1e-3)
        else:
            t0 = time.perf_counter()
            loop.step(batches, grad_out, None)
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(device) - base) if cuda else 0.0
    peak_reserved = torch.cuda.max_memory_reserved(device) if cuda else 0.0
    row: dict[str, Any] = {
        "name": cfg.name, "config": dataclasses.asdict(cfg), "model_name": spec.name, "params": params,
        "states_bytes": states, "persistent_bytes": persistent, "forward_bytes": loop.probe.get("forward_bytes", 0.0),
        "peak_allocated_bytes": peak, "peak_reserved_bytes": peak_reserved, "baseline_bytes": base,
        "step_times_s": times, "step_time_s": statistics.median(times),
        "fwd_bwd_time_s": statistics.median(fwd_bwd) if fwd_bwd else None,
    }
    if cuda and profile_step:
        row["profile"] = _profile_step(loop, batches, grad_out)
        row["accumulate_pass_s"] = loop.accumulate_seconds()
    if cuda and host_profile:
        row["host_profile"] = _host_profile_step(loop, batches, grad_out)
    del loop, model, batches, grad_out
    gc.collect()
    return row


def _smoke_config(cfg: Config) -> Config:
    """The same code path on CPU in seconds: tiny widths, 2 or 4 layers, short sequences."""
    spec = config_spec(cfg)
    heads = 8
    kv = heads if spec.num_kv_heads == spec.num_heads else 4
    tiny: dict[str, Any] = {"name": spec.name + "-smoke", "vocab_size": 256, "max_position_embeddings": 256}
    if spec.family == "gpt":
        tiny.update(model_type="gpt2", n_embd=64, n_layer=4, n_head=heads, n_positions=256,
                    attn_impl=spec.attn_impl, resid_pdrop=spec.dropout)
    else:
        tiny.update(model_type="qwen2_moe" if spec.is_moe else "llama", hidden_size=64, intermediate_size=128,
                    num_hidden_layers=4, num_attention_heads=heads, num_key_value_heads=kv)
        if spec.is_moe:
            tiny.update(moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
                        num_experts_per_tok=2)
    return dataclasses.replace(cfg, model=tiny, micro_batch=min(cfg.micro_batch, 2), seq_len=32,
                               micro_batches=cfg.micro_batches if cfg.pp > 1 else min(cfg.micro_batches, 2))


def cmd_measure(args: argparse.Namespace) -> int:
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("measure: no CUDA device (use --smoke to run the code path on the CPU)", file=sys.stderr)
        return 2
    configs = [c for c in CONFIGS if not args.only or c.name in args.only.split(",")]
    if args.smoke:
        configs = [_smoke_config(c) for c in configs]
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           "torch": str(torch.__version__), "steps": args.steps, "warmup": args.warmup, "rows": []}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        # the cuBLAS workspace is allocated by the first GEMM and kept: take it before any baseline
        torch.ones(64, 64, device=device, dtype=torch.bfloat16) @ torch.ones(64, 64, device=device, dtype=torch.bfloat16)
        torch.cuda.synchronize()
    path = Path(args.out)
    for cfg in configs:
        t0 = time.perf_counter()
        try:
            row = measure_config(cfg, device, args.steps, args.warmup, not args.no_profile,
                                 cfg.name in args.host_profile.split(","))
        except Exception as e:  # an OOM or a kernel missing for one config must not lose the others
            row = {"name": cfg.name, "config": dataclasses.asdict(cfg), "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-3000:]}
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        row["wall_s"] = time.perf_counter() - t0
        out["rows"].append(row)
        path.write_text(json.dumps(out, indent=1) + "\n")  # after every config: a crash keeps the rest
        msg = row.get("error") or (f"step {row['step_time_s'] * 1e3:8.1f} ms  peak "
                                   f"{row['peak_allocated_bytes'] / GIB:7.2f} GiB")
        print(f"{cfg.name:40s} {msg}  ({row['wall_s']:.1f} s)", flush=True)
    return 0


# =========================================================================== predicting and reporting
def plan_for(cfg: Config, ctx: Any) -> Any:
    from autoparallel.plan import Plan

    n = len(ctx.graph.blocks)
    gpus = cfg.tp * cfg.pp
    plan = Plan(model=ctx.model_name, hardware=ctx.cluster.profile.name, gpus=gpus,
                gpus_per_node=ctx.cluster.devices_per_node, global_batch=cfg.micro_batch * cfg.micro_batches,
                seq_len=cfg.seq_len, dp=1, tp=cfg.tp, pp=cfg.pp, micro_batch=cfg.micro_batch,
                recompute=(cfg.recompute,) * n, param_dtype="bf16", grad_reduce_dtype="fp32")
    return dataclasses.replace(plan, placements=ctx.cost_model.placements_for(plan))


def predict(cfg: Config, profile: Any) -> dict[str, Any]:
    """Predicted step time [s] and peak memory [bytes] of what the measured run executes (one rank)."""
    from autoparallel.api import context

    spec = config_spec(cfg)
    ctx = context(spec, profile, cfg.tp * cfg.pp, cfg.seq_len)
    cm = ctx.cost_model
    plan = plan_for(cfg, ctx)
    est = cm.estimate(plan)
    stages = cm.stage_costs(plan)
    s0 = stages[0]
    mem = dict(s0["memory"])
    if cfg.pp > 1:  # stage 0 alone: its micro-batches' compute and its own optimizer, no P2P, no bubble
        _, _, opt = cm._data_parallel_time(plan, [s0])
        time_s = plan.num_micro_batches * (s0["time"] - s0["p2p"]) + opt
        parts = {"compute_s": plan.num_micro_batches * (s0["time"] - s0["p2p"]), "optimizer_s": opt}
    else:  # tp shards: the per-rank step without the TP collectives the shard does not run
        time_s = est.step_time_s - est.breakdown["tp_comm_s"]
        parts = dict(est.breakdown)
    allocated = sum(v for k, v in mem.items() if k != "allocator")
    return {"time_s": time_s, "memory_allocated_bytes": allocated, "memory_with_reserve_bytes": sum(mem.values()),
            "memory_parts_bytes": mem, "time_parts_s": parts,
            "plan": {k: v for k, v in plan.to_dict().items() if k not in ("placements", "recompute")},
            "model_flops_per_step": s0["flops_model"] * plan.num_micro_batches}


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two rankings (ties counted as neither concordant nor discordant)."""
    n = len(a)
    conc = disc = ties_a = ties_b = 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            if x == 0 and y == 0:
                continue
            if x == 0:
                ties_a += 1
            elif y == 0:
                ties_b += 1
            elif (x > 0) == (y > 0):
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + ties_a) * (conc + disc + ties_b))
    return (conc - disc) / denom if denom else 0.0


@dataclass
class Summary:
    memory_errors: list[float] = field(default_factory=list)
    time_errors: list[float] = field(default_factory=list)


def planner_pick(group: list[dict], profile: Any) -> dict[str, Any]:
    """Run the planner (gpus=1) on the group's job and find its plan among the measured rows."""
    from autoparallel.api import plan_result

    cfg = Config(**group[0]["config"])
    spec = config_spec(cfg)
    gb = cfg.micro_batch * cfg.micro_batches
    result, _ = plan_result(spec, hardware=profile, gpus=1, global_batch=gb, seq_len=cfg.seq_len)
    plan = result.plan
    if plan is None:
        return {"planner": None, "why": result.explanation}
    modes = set(plan.recompute)
    match = [r for r in group if r["config"]["micro_batch"] == plan.micro_batch and len(modes) == 1
             and r["config"]["recompute"] == next(iter(modes))]
    # SDPA models: the cost model's selective recompute equals none (no seq x seq activations)
    if not match and modes == {"selective"}:
        match = [r for r in group if r["config"]["micro_batch"] == plan.micro_batch
                 and r["config"]["recompute"] == "none"]
    return {"planner_plan": {"micro_batch": plan.micro_batch, "recompute": sorted(modes),
                             "predicted_step_s": result.estimate.step_time_s if result.estimate else None},
            "measured_row": match[0]["name"] if match else None}


def cmd_report(args: argparse.Namespace) -> int:
    from hardware_profiles import load_profile

    profile = load_profile(args.profile)
    raw = json.loads(Path(args.raw).read_text())
    repeats: dict[str, list[float]] = {}
    for path in args.repeat:  # the same configurations measured in other sessions: run-to-run spread
        data = json.loads(Path(path).read_text())
        for session in data.get("sessions", [data]):
            for row in session["rows"]:
                if "step_time_s" in row:
                    repeats.setdefault(row["name"], []).append(row["step_time_s"])
    pairs = []
    for row in raw["rows"]:
        cfg = Config(**row["config"])
        pred = predict(cfg, profile)
        # the raw file keeps the profiles' kernel lists; the pairs keep the per-class sums
        measured = {k: v for k, v in row.items() if k not in ("name", "config", "host_profile")}
        if "profile" in measured:
            measured["profile"] = {k: v for k, v in measured["profile"].items() if k != "top_kernels_s"}
        entry = {"name": row["name"], "config": row["config"], "measured": measured,
                 "predicted": pred, "other_sessions_step_time_s": repeats.get(row["name"], [])}
        if "error" not in row:
            m_mem, p_mem = row["peak_allocated_bytes"], pred["memory_allocated_bytes"]
            entry["memory_error"] = (p_mem - m_mem) / m_mem if m_mem else None
            entry["time_error"] = (pred["time_s"] - row["step_time_s"]) / row["step_time_s"]
        pairs.append(entry)
        print(f"{row['name']:40s} mem {entry.get('memory_error', float('nan')):+.3f}  time "
              f"{entry.get('time_error', float('nan')):+.3f}", flush=True)
    ok = [p for p in pairs if p.get("time_error") is not None]
    mem_err = [abs(p["memory_error"]) for p in ok if p.get("memory_error") is not None]
    time_err = [abs(p["time_error"]) for p in ok]
    tau_all = kendall_tau([p["predicted"]["time_s"] for p in ok], [p["measured"]["step_time_s"] for p in ok])
    group = [p for p in ok if p["config"]["group"]]
    tau_group = kendall_tau([p["predicted"]["time_s"] for p in group], [p["measured"]["step_time_s"] for p in group])
    fastest = min(group, key=lambda p: p["measured"]["step_time_s"]) if group else None
    cm_pick = min(group, key=lambda p: p["predicted"]["time_s"]) if group else None
    pick = planner_pick([{"name": p["name"], "config": p["config"]} for p in group], profile) if group else {}
    chosen = next((p for p in group if p["name"] == pick.get("measured_row")), cm_pick)
    summary = {
        "profile": _relative(args.profile), "device": raw.get("device"), "torch": raw.get("torch"),
        "configs": len(pairs), "measured": len(ok),
        "memory_mae": statistics.mean(mem_err) if mem_err else None, "memory_max_abs_error": max(mem_err, default=None),
        "memory_within_10pct": sum(e <= 0.10 for e in mem_err),
        "time_mean_abs_error": statistics.mean(time_err) if time_err else None,
        "time_max_abs_error": max(time_err, default=None), "time_within_15pct": sum(e <= 0.15 for e in time_err),
        "kendall_tau_all": tau_all, "kendall_tau_group": tau_group, "group": JOB,
        "group_fastest_measured": fastest["name"] if fastest else None,
        "group_cost_model_pick": cm_pick["name"] if cm_pick else None,
        "planner": pick,
        "pick_vs_fastest": (chosen["measured"]["step_time_s"] / fastest["measured"]["step_time_s"] - 1)
        if fastest and chosen else None,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"summary": summary, "pairs": pairs}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if args.tables:
        Path(args.tables).write_text(markdown_tables(pairs))
    return 0


def _relative(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def markdown_tables(pairs: list[dict]) -> str:
    """The memory and time tables of docs/benchmarks_h200.md."""
    def shape(c: dict) -> str:
        extra = f", {c['micro_batches']} micro-batches" if c["micro_batches"] > 1 else ""
        return f"mb {c['micro_batch']} x seq {c['seq_len']}{extra}, recompute {c['recompute']}"

    lines = ["| configuration | shape | predicted GiB | measured GiB | error | predicted + 3% reserve | measured reserved |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for p in pairs:
        m, pr = p["measured"], p["predicted"]
        lines.append(f"| {p['name']} | {shape(p['config'])} | {pr['memory_allocated_bytes'] / GIB:.2f} | "
                     f"{m['peak_allocated_bytes'] / GIB:.2f} | {p['memory_error']:+.1%} | "
                     f"{pr['memory_with_reserve_bytes'] / GIB:.2f} | {m['peak_reserved_bytes'] / GIB:.2f} |")
    lines += ["", "| configuration | predicted ms | measured ms | error | other sessions ms | GPU kernels ms |",
              "|---|---:|---:|---:|---|---:|"]
    for p in pairs:
        m, pr = p["measured"], p["predicted"]
        others = ", ".join(f"{t * 1e3:.0f}" for t in p["other_sessions_step_time_s"]) or "-"
        kern = m.get("profile", {}).get("total_kernel_s")
        lines.append(f"| {p['name']} | {pr['time_s'] * 1e3:.1f} | {m['step_time_s'] * 1e3:.1f} | "
                     f"{p['time_error']:+.1%} | {others} | {kern * 1e3:.0f} |" if kern else "")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--only", default="")
    m.add_argument("--steps", type=int, default=4)
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--smoke", action="store_true", help="tiny models on the CPU: exercise the code path")
    m.add_argument("--no-profile", action="store_true")
    m.add_argument("--host-profile", default="", help="configs (comma-separated names) to profile on the host too")
    r = sub.add_parser("report")
    r.add_argument("--raw", required=True)
    r.add_argument("--profile", default=str(ROOT / "hardware_profiles" / "h200.yaml"))
    r.add_argument("--repeat", action="append", default=[], help="raw JSON of the same configs from another session")
    r.add_argument("--tables", default="", help="also write the markdown tables to this file")
    args = ap.parse_args(argv)
    return cmd_measure(args) if args.cmd == "measure" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
