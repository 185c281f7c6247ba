"""What does the host pay per block, model by model? The unit of the host floor (issue 12)

The cost model prices an eager phase's host time per traced aten op (`compute.host_floor`), at rates fitted
on the calibration probes (a llama, a GPT, a MoE of the catalog). Models whose op mix differs miss both ways:
Gemma 3's blocks (118 forward ops, 81 of them small fp32 elementwise ops of its six RMSNorms) were
predicted host-paced at 633 ms and ran GPU-paced at 485 ms; Hugging Face rows paced by the host under
recompute were predicted fast. This measures, for the sweep's model families at their widths on a few
layers, the host time AutoParallelTrainer takes for the forward and for the backward of the middle blocks
of a step at 32 tokens a row (so the GPU never paces the host), and `report` sets it against counts of
what the host does per block on the meta trace: aten ops, the kernels among them (views launch none),
Python-level torch calls (a TorchFunctionMode), module calls, and autograd nodes in the backward.

Timing: forward hooks give the host time from block 0's end to block k's end (blocks 1..k, each with its
FSDP2 hooks), gradient hooks on the same outputs the backward of blocks k..1, all in the first micro-batch
of each step after a device synchronization; the median over the steps.

    python benchmarks/host_mix.py measure --out $OUT/host_mix.jsonl [--compiled [--launches]] [--recompute op] [--only a,b]
    python benchmarks/host_mix.py report --raw benchmarks/results/raw/host_mix_s36.jsonl \
        --speed benchmarks/results/raw/trainer_speed_s36.jsonl
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

import trainer_sweep as ts  # noqa: E402

SEQ = 32
ROWS = 4          # four micro-batches of one row: the first one is timed
LAYERS = 6        # each model on this many layers (fewer where its spec has fewer)
TIMED = 4         # blocks 1..TIMED
# the sweep's families; Mixtral's layers (1.4B parameters each) are left out
MIX = ("llama-1.3b", "gpt-350m", "moe-1.2b-8e", "qwen3-1.7b", "qwen2.5-1.5b", "qwen3-30b-a3b-4l", "gpt2-xl",
       "phi3-mini-16l", "gemma-2b", "pythia-1.4b", "olmo2-1b", "granite-3-2b", "llama3.2-1b", "stablelm-2-1.6b",
       "gemma3-1b", "gptj-6b-8l", "deepseek-v2-lite-4l", "codegen-2b-12l", "phi2-16l", "qwen1.5-moe-a2.7b-4l")
COMPILED = ("llama-1.3b", "gpt-350m", "llama3.2-1b", "gemma3-1b", "pythia-1.4b", "phi2-16l")


def spec_of(model: str) -> dict[str, Any]:
    """MODELS[model] on min(LAYERS, its own) layers."""
    spec = dict(ts.MODELS[model])
    key = "n_layer" if "n_layer" in spec else "num_hidden_layers"
    spec[key] = min(LAYERS, spec[key])
    return spec


def plan_of(spec: dict[str, Any], compile_: bool, rows: int = ROWS, micro_batch: int = 1, seq: int = SEQ,
            recompute: str = "none") -> Any:
    """The planner's one-GPU plan of a MODELS entry with every field pinned (no parallelism)."""
    import torch

    from autoparallel.api import plan_result
    with torch.device("meta"):
        meta = ts.build_spec(spec)
    result, _ = plan_result(meta, hardware="h200", gpus=1, global_batch=rows, seq_len=seq, gpus_per_node=1,
                            fix={"micro_batch": micro_batch, "recompute": recompute, "compile": int(compile_), "tp": 1,
                                 "pp": 1, "ep": 1})
    return result.plan


class Windows:
    """Host seconds of blocks 1..k's forward and backward in the first micro-batch of an armed step."""

    def __init__(self, blocks: list[Any], k: int) -> None:
        self.armed = False
        self.k = k
        self.marks: dict[str, float] = {}
        blocks[0].register_forward_hook(self._out(0))
        blocks[k].register_forward_hook(self._out(k))

    def _out(self, i: int):
        def hook(_mod: Any, _args: Any, out: Any) -> None:
            import torch
            if not self.armed or f"f{i}" in self.marks:
                return
            self.marks[f"f{i}"] = time.perf_counter()
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._grad(i))
        return hook

    def _grad(self, i: int):
        def hook(_g: Any) -> None:
            self.marks.setdefault(f"b{i}", time.perf_counter())
        return hook

    def take(self) -> tuple[float, float]:
        m, self.marks = self.marks, {}
        return m["f" + str(self.k)] - m["f0"], m["b0"] - m["b" + str(self.k)]


def launches_of(trainer: Any, batch: Any) -> dict[str, dict[str, float]]:
    """One profiled step: per compiled region kind (a block's graph call, its CompiledFunctionBackward), the
    calls and per call the kernels it launched (profile_timeline.launch_regions). Counted apart from the timed
    steps: the profiler's own host work is not the step's."""
    from profile_timeline import regions_of_call
    return regions_of_call(lambda: trainer.step(batch))


def measure_one(model: str, compile_: bool, steps: int, recompute: str = "none",
                launches: bool = False, seq: int = SEQ) -> dict[str, Any]:
    import torch

    from autoparallel import AutoParallelTrainer
    from autoparallel.trainer.structure import find_layout, get_submodule
    spec = spec_of(model)
    plan = plan_of(spec, compile_, recompute=recompute, seq=seq)
    gc.collect()
    torch._dynamo.reset()
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        m = ts.build_spec(spec)
    if not spec.get("hf"):
        with torch.no_grad():
            m.init_weights(seed=0)
    trainer = AutoParallelTrainer(m, optimizer=None, plan=plan)
    del m
    part = trainer.model_parts[0]
    blocks = [get_submodule(part, p) for p in find_layout(part).block_paths]
    k = min(TIMED, len(blocks) - 1)
    win = Windows(blocks, k)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, spec["vocab_size"], (ROWS, seq + 1), generator=gen) for _ in range(2)]
    for i in range(5):
        trainer.step(batches[i % 2])
    fwd, bwd, step = [], [], []
    for i in range(steps):
        sync()
        win.armed = True
        t = time.perf_counter()
        trainer.step(batches[i % 2])
        sync()
        step.append(time.perf_counter() - t)
        win.armed = False
        f, b = win.take()
        fwd.append(f)
        bwd.append(b)
    regions = launches_of(trainer, batches[0]) if launches and cuda else None
    del trainer
    rec = {"name": model, "compile": int(compile_), "recompute": recompute, "seq": seq, "blocks": k, "layers": len(blocks),
           "plan": plan.to_dict(), "fwd_s": fwd, "bwd_s": bwd, "step_s": step}
    if regions is not None:
        rec["launch_regions"] = regions
    return rec


def cmd_measure(args: argparse.Namespace) -> int:
    models = args.only.split(",") if args.only else (COMPILED if args.compiled else MIX)
    for model in models:
        try:
            rec = measure_one(model, args.compiled, args.steps, args.recompute, args.launches, args.seq)
        except Exception as e:  # one family failing must not lose the others' numbers
            rec = {"name": model, "compile": int(args.compiled), "error": f"{type(e).__name__}: {e}"[:400]}
        with open(args.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if "error" in rec:
            print(f"{model}: {rec['error']}", flush=True)
        else:
            med = {k: statistics.median(rec[k]) * 1e3 for k in ("fwd_s", "bwd_s", "step_s")}
            print(f"{model} compile={rec['compile']} seq={rec['seq']}: {rec['blocks']} blocks fwd {med['fwd_s']:.2f} ms bwd "
                  f"{med['bwd_s']:.2f} ms; step {med['step_s']:.1f} ms", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--steps", type=int, default=12)
    m.add_argument("--compiled", action="store_true", help="the COMPILED models, compiled")
    m.add_argument("--only", default=None)
    m.add_argument("--seq", type=int, default=SEQ, help="tokens a row (one row a micro-batch)")
    m.add_argument("--launches", action="store_true",
                   help="also profile one step: the kernels each compiled region launches (launch_regions)")
    m.add_argument("--recompute", default="none", choices=("none", "op", "full"),
                   help="every block under this mode: the backward window then holds the blocks' recompute")
    r = sub.add_parser("report")
    r.add_argument("--raw", required=True, nargs="+")
    r.add_argument("--profile", default="h200", help="the profile whose predictions stand beside the measurements")
    r.add_argument("--speed", default=None, help="the run's speed probes (trainer_speed_sN.jsonl): the profile's "
                                                 "host terms rescaled to its VM")
    args = p.parse_args(argv)
    return cmd_measure(args) if args.cmd == "measure" else cmd_report(args)


COUNTS = ("fwd_ops", "fwd_kernels", "fwd_calls", "fwd_modules", "nodes", "bwd_ops", "bwd_kernels", "tensors")


def counts_of(model: str) -> dict[str, float]:
    """Per block (the mean over blocks 1..TIMED) of what the host does: the traced graph's aten ops and the
    kernels among them (an op that moves bytes or does FLOPs; views do neither), forward and backward; and
    from a meta forward, the Python-level torch calls that dispatch an aten op (a TorchFunctionMode sees
    only the outermost call: F.linear's t, mm and view are one), the module calls, and the autograd nodes
    the forward records (its backward runs one each)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoparallel.api import trace_model
    from autoparallel.trainer.structure import find_layout
    spec = spec_of(model)
    with torch.device("meta"):
        meta = ts.build_spec(spec).to(torch.bfloat16)  # the trainer computes in bf16 (grouped GEMMs need it)
    blocks = find_layout(meta).block_paths
    timed = blocks[1:1 + min(TIMED, len(blocks) - 1)]
    graph = trace_model(meta, seq_len=SEQ)
    out = dict.fromkeys(COUNTS, 0.0)
    for b in timed:
        for _, a in graph.nodes(block=graph.blocks[blocks.index(b)]):
            kernel = a["flops"] > 0 or a["bytes_read"] + a["bytes_written"] > 0
            out[f"{a['phase']}_ops"] += 1
            out[f"{a['phase']}_kernels"] += kernel
    out["tensors"] = sum(len(list(meta.get_submodule(b).parameters())) for b in timed)
    stack: list[str] = []
    state = {"dispatched": 0}

    class Dispatches(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            state["dispatched"] += 1
            return func(*args, **(kwargs or {}))

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            before = state["dispatched"]
            result = func(*args, **(kwargs or {}))
            if state["dispatched"] > before and stack and stack[-1] in timed:
                out["fwd_calls"] += 1
            return result

    def enter(path: str):
        def hook(*_: Any) -> None:
            if stack and stack[-1] in timed and path != stack[-1]:
                out["fwd_modules"] += 1
            stack.append(path if path in timed or not stack else stack[-1])
            if path in timed:
                state[path] = torch.autograd._get_sequence_nr()
        return hook

    def leave(path: str):
        def hook(*_: Any) -> None:
            stack.pop()
            if path in timed:
                out["nodes"] += torch.autograd._get_sequence_nr() - state[path]
        return hook

    for path, mod in meta.named_modules():
        mod.register_forward_pre_hook(enter(path))
        mod.register_forward_hook(leave(path), always_call=True)
    ids = torch.randint(0, spec["vocab_size"], (1, SEQ), device="meta")
    with Dispatches(), Calls():
        meta(ids)
    return {k: v / len(timed) for k, v in out.items()}


def _nnls(A: Any, b: Any) -> Any:
    """argmin |A x - b| over x >= 0 for a handful of columns: the best unconstrained fit over each subset of
    columns whose coefficients all come out non-negative (exact; scipy is no dependency of the project)."""
    import itertools

    import numpy as np
    best, best_res = np.zeros(A.shape[1]), float(np.sum(b * b))
    for k in range(1, A.shape[1] + 1):
        for cols in itertools.combinations(range(A.shape[1]), k):
            x = np.linalg.lstsq(A[:, cols], b, rcond=None)[0]
            res = float(np.sum((A[:, cols] @ x - b) ** 2))
            if (x >= 0).all() and res < best_res:
                best, best_res = np.zeros(A.shape[1]), res
                best[list(cols)] = x
    return best


def _loo(y: list[float], xs: list[list[float]]) -> tuple[list[float], list[float]]:
    """Non-negative least squares of relative errors (weights 1/y) of y on the columns xs: the
    coefficients on all rows, and each row's prediction with itself left out."""
    import numpy as np
    Y, X = np.array(y), np.array(xs)
    W = 1 / Y
    coef = _nnls(X * W[:, None], Y * W)
    loo = []
    for i in range(len(Y)):
        keep = np.arange(len(Y)) != i
        c = _nnls(X[keep] * W[keep, None], Y[keep] * W[keep])
        loo.append(float(X[i] @ c))
    return list(coef), loo


# each with FSDP2's parameter tensors of the block, which the cost model prices apart (host_us_per_fsdp_tensor)
UNITS = {"aten ops": ("ops",), "kernels + views": ("kernels", "views"), "torch calls": ("calls",),
         "torch calls + modules": ("calls", "modules"), "calls + kernels": ("calls", "kernels"),
         "calls + views": ("calls", "views"), "calls + modules + kernels": ("calls", "modules", "kernels"),
         "autograd nodes": ("nodes",), "nodes + kernels": ("nodes", "kernels"), "nodes + views": ("nodes", "views"),
         "kernels": ("kernels",)}


def _feature(c: dict[str, float], phase: str, name: str) -> float:
    if name == "views":
        return c[f"{phase}_ops"] - c[f"{phase}_kernels"]
    if name in ("calls", "modules"):
        return c[f"fwd_{name}"]
    return c[name] if name in ("nodes", "tensors") else c[f"{phase}_{name}"]


def profile_of(name: str, speed: str | None) -> Any:
    """Profile `name`, its host terms rescaled to the VM whose speed probes `speed` holds (`calibrate
    --trainer --rescale`'s factor)."""
    from autoparallel.calibrate_trainer import fit_host_speed, load_records, rescaled
    from hardware_profiles import load_profile
    base = load_profile(name)
    return rescaled(base, fit_host_speed(load_records([speed]), base).factor) if speed else base


def model_block_times(rec: dict[str, Any], profile: Any) -> tuple[float, float]:
    """The cost model's forward and backward seconds of one timed block (the mean over blocks 1..k) of the
    record's plan and recompute mode: at 32 tokens a row its kernels are microseconds, so these are its host
    floors."""
    import torch

    from autoparallel.api import context, make_cluster
    from autoparallel.plan import Plan
    plan = Plan.from_dict(rec["plan"])
    with torch.device("meta"):
        meta = ts.build_spec(spec_of(rec["name"]))
    cm = context(meta, make_cluster(profile, 1, 1), 1, SEQ).cost_model
    key = cm.segments_key(cm.placements_for(plan), False)
    span = plan.mesh_span()
    mode = rec.get("recompute", "none")
    costs = [cm.segment_cost(key, b, 1, 1, False, 1, mode, span["tp"], span["ep"], bool(rec["compile"]))
             for b in (cm.block_rep(i) for i in range(1, 1 + rec["blocks"]))]
    # the backward window holds the blocks' recompute (it runs inside their backward)
    return (statistics.mean(c.fwd_s for c in costs), statistics.mean(c.bwd_s + c.recompute_s for c in costs))


def cmd_report(args: argparse.Namespace) -> int:
    recs = [json.loads(line) for raw in args.raw for line in Path(raw).read_text().splitlines() if line.strip()]
    ok = [r for r in recs if "error" not in r]
    profile = profile_of(args.profile, args.speed)
    counts = {r["name"]: counts_of(r["name"]) for r in ok}
    print(f"Host per block (us; median over the steps), the prediction of profile {args.profile} (rescaled by "
          f"{args.speed or 'nothing'}), and what the host does per block on the meta trace.\n")
    print("| model | compiled | fwd | model | bwd | model | " + " | ".join(COUNTS) + " |")
    print("|---|---|---:|---:|---:|---:|" + "---:|" * len(COUNTS))
    y = {}
    err: dict[tuple[int, str], list[float]] = {}
    for r in ok:
        f = statistics.median(r["fwd_s"]) / r["blocks"] * 1e6
        b = statistics.median(r["bwd_s"]) / r["blocks"] * 1e6
        mf, mb = (x * 1e6 for x in model_block_times(r, profile))
        for phase, meas, pred in (("fwd", f, mf), ("bwd", b, mb), ("sum", f + b, mf + mb)):
            err.setdefault((r["compile"], phase), []).append(pred / meas - 1)
        if not r["compile"]:
            y[r["name"]] = (f, b)
        c = counts[r["name"]]
        print(f"| {r['name']} | {'yes' if r['compile'] else 'no'} | {f:.0f} | {mf:.0f} ({mf / f - 1:+.0%}) | {b:.0f} | "
              f"{mb:.0f} ({mb / b - 1:+.0%}) | " + " | ".join(f"{c[k]:.0f}" for k in COUNTS) + " |")
    print("\nThe model's error per block (mean of |error|, and the mean signed error):\n")
    print("| blocks | phase | mean abs | mean signed | n |\n|---|---|---:|---:|---:|")
    for (comp, phase), e in sorted(err.items()):
        print(f"| {'compiled' if comp else 'eager'} | {phase} | {statistics.mean(abs(x) for x in e):.1%} | "
              f"{statistics.mean(e):+.1%} | {len(e)} |")
    names = list(y)
    for phase, col in (("fwd", 0), ("bwd", 1)) if len(names) > 2 else ():
        print(f"\nEager {phase}: host per block against each unit, least squares of the relative error (coefficients "
              "in us; the error of each model left out of its own fit)\n")
        print("| unit | coefficients | mean abs error | max | within 10% |\n|---|---|---:|---:|---:|")
        for unit, cols in UNITS.items():
            if phase == "bwd" and cols in (("calls",), ("calls", "modules")):
                continue
            target = [y[n][col] for n in names]
            cols = (*cols, "tensors")
            coef, loo = _loo(target, [[_feature(counts[n], phase, k) for k in cols] for n in names])
            e = [abs(p / t - 1) for p, t in zip(loo, target)]
            print(f"| {unit} | " + ", ".join(f"{k} {c:.2f}" for k, c in zip(cols, coef)) +
                  f" | {statistics.mean(e):.1%} | {max(e):.1%} | {sum(x <= 0.1 for x in e)} of {len(e)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
