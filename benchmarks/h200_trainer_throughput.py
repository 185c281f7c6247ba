"""AutoParallelTrainer vs a plain hand-written bf16 training loop on one GPU (issue 7 c).

    # on the GPU machine (no planner needed: the plan is given explicitly)
    python benchmarks/h200_trainer_throughput.py measure --out raw.json [--smoke]
    # anywhere: MFU from the traced FLOPs, ratios, benchmarks/results/h200_trainer_throughput.json
    python benchmarks/h200_trainer_throughput.py report --raw raw.json

Same model (a ~1.3B llama: hidden 2048, 26 layers, 16 heads of 128, 4 key/value heads, SwiGLU 5632,
vocabulary 32000), same batch (8 x 2048 tokens), same attention (SDPA), same optimizer (fused AdamW),
same data. Variants, each timed over interleaved blocks of steps (wall clock per step; every variant
reads its loss back with .item() each step, as trainer.step() does):

  plain      the PyTorch AMP recipe: fp32 parameters, torch.autocast(bf16), loss.backward(),
             opt.step(), opt.zero_grad()
  trainer    AutoParallelTrainer with an explicit Plan(gpus=1, micro_batch=8, bf16) in local mode
             (one process, no process group): what `python train.py` runs on one GPU
  trainer_dist
             the same trainer inside a one-rank NCCL process group (its torchrun path: FSDP2
             `replicate` with MixedPrecisionPolicy(bf16, fp32 reduce))
  plain_compiled / trainer_compiled
             the same two with torch.compile (the whole model; the trainer's per-block compile)
  trainer_default
             AutoParallelTrainer planning for itself (h200 profile): what a user gets by default
  megatron_layout
             the loop of benchmarks/h200_memory_time.py (bf16 parameters, fp32 gradient buffers and
             master weights): the layout the cost model accounts for

MFU = model FLOPs per step / (step time x 989 TFLOP/s), model FLOPs as torch.utils.flop_counter counts
one forward + backward (the tracer's count; causal attention counted as full, as PaLM's formula does).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from autoparallel.models import build_model  # noqa: E402
from autoparallel.specs import load_model_spec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "h200_trainer_throughput.json"
H200_BF16_PEAK = 989e12
LLAMA_1_3B = {"name": "llama-1.3b", "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
              "intermediate_size": 5632, "num_hidden_layers": 26, "num_attention_heads": 16,
              "num_key_value_heads": 4, "max_position_embeddings": 4096}
BATCH, SEQ, LR = 8, 2048, 3e-4


def _spec(smoke: bool):
    if smoke:
        return load_model_spec({"name": "llama-smoke", "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
                                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "max_position_embeddings": 256})
    return load_model_spec(LLAMA_1_3B)


def _fused() -> bool | None:
    return True if torch.cuda.is_available() else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(spec, device: torch.device, batch: int, seq: int, compiled: bool = False
               ) -> Callable[[torch.Tensor], float]:
    model = build_model(spec)  # fp32
    model.init_weights(seed=0)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=_fused())
    forward = torch.compile(model) if compiled else model  # the plain compiled recipe: the whole model

    def step(tokens: torch.Tensor) -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, -2).float(), tokens[:, 1:].flatten())
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def trainer_loop(spec, device: torch.device, batch: int, seq: int, compiled: bool = False,
                 planned: bool = False) -> Callable[[torch.Tensor], float]:
    """The trainer with an explicit plan (micro-batch = batch, no recompute; blocks compiled when
    `compiled`), or with `planned` the trainer planning for itself (its default execution: the planner
    decides compile, recompute and micro-batching for the h200 profile)."""
    from autoparallel import AutoParallelTrainer
    from autoparallel.plan import Plan

    with torch.device("meta"):
        model = build_model(spec)
    opt = lambda ps: torch.optim.AdamW(ps, lr=LR, fused=_fused())  # noqa: E731
    if planned:
        trainer = AutoParallelTrainer(model, optimizer=opt, global_batch_size=batch, seq_len=seq, hardware="h200",
                                      max_memory_per_gpu="140GB", init_fn=lambda m: m.init_weights(seed=0))
        print(f"trainer_default plan:\n{trainer.plan}", flush=True)
    else:
        plan = Plan(model=spec.name, hardware="h200", gpus=1, gpus_per_node=1, global_batch=batch, seq_len=seq,
                    micro_batch=batch, recompute=("none",) * spec.num_layers, param_dtype="bf16",
                    grad_reduce_dtype="fp32", compile=compiled)
        trainer = AutoParallelTrainer(model, optimizer=opt, plan=plan, init_fn=lambda m: m.init_weights(seed=0))
    assert trainer.device.type == device.type, (trainer.device, device)
    return trainer.step


BUILDERS: dict[str, Callable[..., Callable[[torch.Tensor], float]]] = {
    "plain": plain_loop,
    "plain_compiled": lambda *a: plain_loop(*a, compiled=True),
    "trainer": trainer_loop,
    "trainer_compiled": lambda *a: trainer_loop(*a, compiled=True),
    "trainer_default": lambda *a: trainer_loop(*a, planned=True),
    "megatron_layout": lambda *a: megatron_layout_loop(*a),
}


def megatron_layout_loop(spec, device: torch.device, batch: int, seq: int) -> Callable[[torch.Tensor], float]:
    from h200_memory_time import MixedPrecisionLoop

    with torch.device("meta"):
        model = build_model(spec)
    model = model.to(torch.bfloat16).to_empty(device=device)
    model.init_weights(seed=0)
    model.train()
    loop = MixedPrecisionLoop(model, "lm", lr=LR)

    def step(tokens: torch.Tensor) -> float:
        loop.step([tokens], None)
        return 0.0  # the caller synchronizes after every step, as .item() does for the others

    return step


def model_flops(spec, device: torch.device, tokens: torch.Tensor) -> float:
    """FLOPs of one forward + backward as torch.utils.flop_counter counts them (bf16 model)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model(spec)
    model = model.to(torch.bfloat16).to_empty(device=device)
    model.init_weights(seed=0)
    with FlopCounterMode(display=False) as fc:
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, -2).float(), tokens[:, 1:].flatten()).backward()
    del model, logits
    return float(fc.get_total_flops())


def _time_block(step: Callable[[torch.Tensor], float], tokens: torch.Tensor, steps: int,
                device: torch.device) -> tuple[list[float], float]:
    """Wall seconds per step (every step ends with a host read of the loss) and peak allocated bytes
    above the allocation at the block's start."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(tokens)
        _sync(device)
        out.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(device) - start) if device.type == "cuda" else 0.0
    return out, float(peak)


def cmd_measure(args: argparse.Namespace) -> int:
    device = torch.device("cpu" if args.smoke else "cuda")
    spec = _spec(args.smoke)
    seq = 32 if args.smoke else SEQ
    batch = 2 if args.smoke else BATCH
    tokens = torch.randint(0, spec.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0)).to(device)
    raw: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           "torch": str(torch.__version__), "model": spec.to_dict(), "batch": batch, "seq_len": seq,
                           "tokens_per_step": batch * seq, "variants": {}, "errors": {}}
    builders = {name: BUILDERS[name] for name in args.variants.split(",")}
    loops: dict[str, Callable] = {}
    for name, build in builders.items():
        try:
            before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            loops[name] = build(spec, device, batch, seq)
            for _ in range(args.warmup):
                loops[name](tokens)
            _sync(device)
            states = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else 0
            raw["variants"][name] = {"states_bytes": states, "step_times_s": [], "peak_above_start_bytes": 0.0}
            print(f"{name}: built and warmed up", flush=True)
        except Exception as e:  # report what could not run, honestly, and go on with the rest
            raw["errors"][name] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    for _ in range(args.rounds):  # interleaved blocks: clock or thermal drift hits every variant alike
        for name, step in loops.items():
            times, peak = _time_block(step, tokens, args.steps, device)
            v = raw["variants"][name]
            v["step_times_s"] += times
            v["peak_above_start_bytes"] = max(v["peak_above_start_bytes"], peak)
    for name, v in raw["variants"].items():
        if v["step_times_s"]:
            v["step_time_s"] = statistics.median(v["step_times_s"])
            v["tokens_per_s"] = raw["tokens_per_step"] / v["step_time_s"]
            print(f"{name:16s} {v['step_time_s'] * 1e3:8.1f} ms/step  {v['tokens_per_s']:10.0f} tokens/s", flush=True)
    loops.clear()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.smoke and not args.no_dist:
        raw["variants"]["trainer_dist"] = _dist_variant(spec, device, tokens, args, raw)
    try:
        raw["flop_counter_flops_per_step"] = model_flops(spec, device, tokens)
    except Exception as e:
        raw["errors"]["flops"] = f"{type(e).__name__}: {e}"[:1500]
    Path(args.out).write_text(json.dumps(raw, indent=1) + "\n")
    return 0


def _dist_variant(spec, device: torch.device, tokens: torch.Tensor, args: argparse.Namespace,
                  raw: dict) -> dict[str, Any]:
    """The trainer's torchrun path on a one-rank NCCL group (FSDP2 replicate, bf16 mixed precision)."""
    import torch.distributed as dist

    out: dict[str, Any] = {"step_times_s": []}
    try:
        index = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=index)
        step = trainer_loop(spec, device, raw['batch'], raw['seq_len'])
        for _ in range(args.warmup):
            step(tokens)
        for _ in range(args.rounds):
            times, peak = _time_block(step, tokens, args.steps, device)
            out["step_times_s"] += times
            out["peak_above_start_bytes"] = peak
        out["step_time_s"] = statistics.median(out["step_times_s"])
        out["tokens_per_s"] = raw["tokens_per_step"] / out["step_time_s"]
        print(f"trainer_dist     {out['step_time_s'] * 1e3:8.1f} ms/step  {out['tokens_per_s']:10.0f} tokens/s",
              flush=True)
    except Exception as e:
        raw["errors"]["trainer_dist"] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
        print(f"trainer_dist: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return out


def cmd_report(args: argparse.Namespace) -> int:
    from autoparallel.tracer import trace

    raw = json.loads(Path(args.raw).read_text())
    spec = load_model_spec(LLAMA_1_3B)
    graph = trace(spec, batch=raw["batch"], seq_len=raw["seq_len"])
    traced = sum(a.get("flops", 0.0) for _, a in graph.g.nodes(data=True))
    flops = raw.get("flop_counter_flops_per_step") or traced
    rows = {}
    for name, v in raw["variants"].items():
        if not v.get("step_time_s"):
            continue
        rows[name] = {"step_time_s": v["step_time_s"], "tokens_per_s": v["tokens_per_s"],
                      "mfu": flops / v["step_time_s"] / H200_BF16_PEAK,
                      "step_time_spread_s": [min(v["step_times_s"]), max(v["step_times_s"])]}
    plain = rows.get("plain")
    for r in rows.values():
        r["tokens_per_s_vs_plain"] = r["tokens_per_s"] / plain["tokens_per_s"] if plain else None
    compiled = rows.get("plain_compiled")
    for name in ("trainer_compiled", "trainer_default"):
        if compiled and name in rows:
            rows[name]["tokens_per_s_vs_plain_compiled"] = rows[name]["tokens_per_s"] / compiled["tokens_per_s"]
    out = {"model": raw["model"]["name"], "parameters": graph.parameters, "batch": raw["batch"],
           "seq_len": raw["seq_len"], "device": raw["device"], "torch": raw["torch"],
           "flops_per_step_flop_counter": raw.get("flop_counter_flops_per_step"), "flops_per_step_traced": traced,
           "rows": rows, "errors": {k: v.splitlines()[0] for k, v in raw.get("errors", {}).items()}}
    Path(args.results).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--steps", type=int, default=8)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--smoke", action="store_true")
    m.add_argument("--no-dist", action="store_true")
    m.add_argument("--variants", default="plain,trainer,megatron_layout",
                   help=f"comma-separated, of {','.join(BUILDERS)} (all alive at once: mind the memory)")
    r = sub.add_parser("report")
    r.add_argument("--raw", required=True)
    r.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args(argv)
    return cmd_measure(args) if args.cmd == "measure" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
