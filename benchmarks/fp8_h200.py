"""FP8 vs bf16 training of the ~1.3B llama through AutoParallelTrainer on one GPU, against the cost model.

    # on one H200 (torch 2.11 there, no torchao: pass a directory holding the torchao wheel)
    pip download torchao==0.18.0 --no-deps -d wheels/      # on a machine with the registry
    python benchmarks/fp8_h200.py --out fp8.json --torchao-wheels wheels/ [--steps 200] [--eager]
    python benchmarks/fp8_h200.py --model llama3-8b-8l --recompute none,op --out fp8_8b.json --torchao-wheels wheels/
    # anywhere, in seconds: a tiny model on CPU, FP8 variants skipped where torchao cannot run them
    python benchmarks/fp8_h200.py --smoke --out /tmp/fp8_smoke.json

torchao version: 0.18.0 (its prebuilt wheels are built for torch >= 2.11, the device's torch; the float8
training code is pure Python over torch._scaled_mm, so the wheel is imported straight from the .whl
file, a zip archive, without installing; its CUDA extensions are not needed and not loaded).

Model and batch as benchmarks/h200_trainer_throughput.py: LLAMA_1_3B (hidden 2048, 26 layers, SwiGLU
5632, vocabulary 32000), 8 x 2048 tokens per step, fused AdamW (lr 3e-4); or with --model llama3-8b-8l,
Llama 3 8B's widths on 8 of its layers (trainer_sweep.LLAMA3_8B_8L), 2 x 8192 tokens per step, the local
batch of torchtitan's Llama 3.1 8B runs. --recompute runs each variant under each listed mode (plan.recompute
in every block; `op` saves the FP8 GEMMs' outputs as it saves mm's). Every variant runs in a
one-rank NCCL process group (the trainer's torchrun path: FSDP2 with bf16 parameters and fp32
reduction, the runtime the cost model prices) from the same initial weights (seed 0) on the same data:
a pool of 16 random batches, cycled, so the loss falls as the model memorizes them.

Variants (each --steps steps, default 200, after --warmup steps that include torch.compile):
  bf16             blocks compiled (Plan.compile), linears in bf16
  fp8-tensorwise   blocks compiled, linears in FP8 (torchao Float8LinearConfig "tensorwise")
  fp8-rowwise      blocks compiled, FP8 "rowwise"
  with --eager: the same three uncompiled (torchao's casts then run unfused)

For each variant the JSON holds the measured median step time, the loss curve (every 10th step and
the last), peak memory, and the cost model's predicted step time for the same plan (h200 profile);
`speedup_vs_bf16` compares measured and predicted speedups of each FP8 variant against bf16 of the
same compile mode, and `final_loss_rel_diff` the final losses (the acceptance: loss within 1%,
measured speedup within +-10% of the predicted one).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

LLAMA_1_3B = {"name": "llama-1.3b", "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
              "intermediate_size": 5632, "num_hidden_layers": 26, "num_attention_heads": 16,
              "num_key_value_heads": 4, "max_position_embeddings": 4096}   # h200_trainer_throughput.LLAMA_1_3B
SMOKE = {"name": "llama-smoke", "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256}
from trainer_sweep import LLAMA3_8B_8L  # noqa: E402  (the sweep's s21 rows ran the same widths)

MODELS = {"llama-1.3b": (LLAMA_1_3B, 8, 2048), "llama3-8b-8l": (LLAMA3_8B_8L, 2, 8192)}  # spec, batch, seq
LR, POOL = 3e-4, 16
RECIPES = ("none", "tensorwise", "rowwise")


def import_torchao(wheels: str | None) -> str | None:
    """Put the torchao wheel found in `wheels` first on sys.path (a wheel is a zip archive: its pure-Python
    float8 package imports from it); returns torchao's version, or None when it cannot be imported."""
    if wheels:
        found = sorted(Path(wheels).glob("torchao-*.whl"))
        if not found:
            raise SystemExit(f"--torchao-wheels {wheels}: no torchao-*.whl there")
        sys.path.insert(0, str(found[-1]))
    try:
        import torchao
        from torchao.float8 import convert_to_float8_training  # noqa: F401
        return str(torchao.__version__)
    except Exception as e:  # noqa: BLE001 - report and run bf16 only
        print(f"torchao unavailable ({type(e).__name__}: {e}); FP8 variants skipped", flush=True)
        return None


def fp8_runs_here(device: torch.device) -> str | None:
    """None when torch._scaled_mm runs on this device, else why not."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        lin = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(device)
        convert_to_float8_training(lin, config=Float8LinearConfig.from_recipe_name("tensorwise"))
        lin(torch.randn(16, 32, device=device)).sum().backward()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:300]}"


def make_plan(spec, recipe: str, compiled: bool, batch: int, seq: int, recompute: str = "none"):
    from autoparallel.plan import Plan
    n = spec.num_layers
    return Plan(model=spec.name, hardware="h200", gpus=1, gpus_per_node=1, global_batch=batch, seq_len=seq,
                micro_batch=batch, recompute=(recompute,) * n, param_dtype="bf16", grad_reduce_dtype="fp32",
                compile=compiled, fp8=(recipe,) * n if recipe != "none" else ())


def predicted(spec, plan, batch: int, seq: int, sdpa: str = "default") -> float:
    """The cost model's step time of `plan` on one H200 [s], its attention priced as the `sdpa` kernel
    (cost_models.estimate.RuntimeVariant.attention)."""
    from autoparallel.api import context
    from cost_models.estimate import RuntimeVariant
    ctx = context(spec, "h200", 1, seq, variant=RuntimeVariant(attention=sdpa))
    return ctx.cost_model.estimate(dataclasses.replace(plan, global_batch=batch, micro_batch=batch)).step_time_s


def run_variant(spec, plan, device: torch.device, data: list[torch.Tensor], steps: int, warmup: int) -> dict[str, Any]:
    from autoparallel import AutoParallelTrainer
    from autoparallel.models import build_model
    with torch.device("meta"):
        model = build_model(spec)
    fused = True if device.type == "cuda" else None
    trainer = AutoParallelTrainer(model, optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, fused=fused),
                                  plan=plan, init_fn=lambda m: m.init_weights(seed=0),
                                  compile=None)
    losses, times = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_warm = time.perf_counter()
    for i in range(warmup + steps):
        if i == warmup:
            t_warm = time.perf_counter() - t_warm
        t0 = time.perf_counter()
        loss = trainer.step(data[i % len(data)])   # returns a float: the step is synchronized
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss)
    out = {"step_time_s": statistics.median(times), "step_time_p10_p90_s": _p10_p90(times),
           "warmup_s": t_warm, "final_loss": statistics.mean(losses[-10:]), "first_loss": losses[0],
           "loss_every_10": losses[::10] + [losses[-1]], "fp8_modules": len(trainer.fp8_modules)}
    if device.type == "cuda":
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    del trainer, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def pinned_sdpa(kernel: str):
    """The SDPA backend context of `kernel`: flash pinned, or torch's own pick."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if kernel == "flash" else nullcontext()


def _p10_p90(xs: list[float]) -> list[float]:
    s = sorted(xs)
    return [s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per variant (default 200; smoke 4)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 10; smoke 1)")
    ap.add_argument("--eager", action="store_true", help="also run the three variants without torch.compile")
    ap.add_argument("--only", default=None, help="comma-separated variant names to run (e.g. bf16,fp8-tensorwise)")
    ap.add_argument("--torchao-wheels", default=None, help="directory with a torchao wheel to import from")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (gloo), a few steps")
    ap.add_argument("--model", default="llama-1.3b", choices=sorted(MODELS), help="model and batch (default llama-1.3b)")
    ap.add_argument("--recompute", default="none", help="comma-separated recompute modes to run each variant under")
    ap.add_argument("--sdpa", default="default", choices=("default", "flash"),
                    help="flash: every step under sdpa_kernel(FLASH_ATTENTION) (FlashAttention-2, what torch ran on "
                         "Hopper before 2.9), priced with the profile's attention_flash terms")
    args = ap.parse_args(argv)
    import torch.distributed as dist

    from autoparallel.specs import load_model_spec
    smoke = args.smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    config, batch, seq = MODELS[args.model]
    spec = load_model_spec(SMOKE if smoke else config)
    batch, seq = (2, 32) if smoke else (batch, seq)
    modes_rc = args.recompute.split(",")
    steps = args.steps or (4 if smoke else 200)
    warmup = args.warmup if args.warmup is not None else (1 if smoke else 10)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, spec.vocab_size, (batch, seq + 1), generator=g) for _ in range(POOL)]
    ao = import_torchao(args.torchao_wheels)
    raw: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           "torch": str(torch.__version__), "torchao": ao, "model": spec.to_dict(), "batch": batch,
                           "seq_len": seq, "steps": steps, "warmup": warmup, "variants": {}, "errors": {}}
    if device.type == "cuda":
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    why_not = fp8_runs_here(device) if ao else "torchao unavailable"
    if why_not:
        raw["errors"]["fp8"] = why_not
    modes = [True] + ([False] if args.eager else [])
    # compile is a CUDA path in the trainer (CPU runs eager), so the smoke run prices eager plans
    modes = [False] if smoke else modes
    wanted = set(args.only.split(",")) if args.only else None
    for compiled, rc, recipe in [(c, r, x) for c in modes for r in modes_rc for x in RECIPES]:
        name = (("bf16" if recipe == "none" else f"fp8-{recipe}") + ("" if rc == "none" else f"-{rc}")
                + ("" if compiled else "-eager") + ("" if args.sdpa == "default" else f"-{args.sdpa}"))
        if (wanted and name not in wanted) or (recipe != "none" and why_not):
            continue
        plan = make_plan(spec, recipe, compiled, batch, seq, rc)
        try:
            with pinned_sdpa(args.sdpa):
                v = run_variant(spec, plan, device, data, steps, warmup)
            v["predicted_step_time_s"] = predicted(spec, plan, batch, seq, args.sdpa)
            raw["variants"][name] = v
            print(f"{name:22s} {v['step_time_s'] * 1e3:8.1f} ms/step (predicted {v['predicted_step_time_s'] * 1e3:7.1f})"
                  f"  loss {v['first_loss']:.4f} -> {v['final_loss']:.4f}", flush=True)
        except Exception as e:  # noqa: BLE001 - report what could not run and go on
            raw["errors"][name] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    dist.destroy_process_group()
    raw["speedup_vs_bf16"] = {}
    for name, v in raw["variants"].items():
        suffix = name.split("-", 2)[2] if name.count("-") >= 2 else ""  # fp8-tensorwise-op-eager: op-eager
        base = raw["variants"].get("bf16" + ("-" + suffix if suffix else ""))
        if name.startswith("fp8") and base:
            measured = base["step_time_s"] / v["step_time_s"]
            pred = base["predicted_step_time_s"] / v["predicted_step_time_s"]
            raw["speedup_vs_bf16"][name] = {
                "measured": measured, "predicted": pred, "predicted_rel_error": pred / measured - 1.0,
                "final_loss_rel_diff": v["final_loss"] / base["final_loss"] - 1.0}
    Path(args.out).write_text(json.dumps(raw, indent=1) + "\n")
    for name, s in raw["speedup_vs_bf16"].items():
        print(f"{name:22s} speedup measured {s['measured']:.3f}x, predicted {s['predicted']:.3f}x "
              f"({s['predicted_rel_error'] * 100:+.1f}%); final loss {s['final_loss_rel_diff'] * 100:+.2f}% vs bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
