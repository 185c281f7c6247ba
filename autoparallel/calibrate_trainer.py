"""`autoparallel calibrate --trainer`: fit the trainer's host terms from AutoParallelTrainer's own steps.

The kernel fits of `autoparallel calibrate` say how fast the GPU runs each op. What the trainer adds on
the host (cost_models/host.py: FSDP2 hooks, checkpoint regions, per-op checkpointing and DTensor
dispatch, pipeline bookkeeping, expert-parallel count read-backs, per-step work) and the per-op dispatch
rate itself are fitted here from steps of the trainer, not of a proxy loop. The probes are small models
whose kernels take less time than the host needs to issue them, so each step's time is the host work
the cost model counts; every probe pins its whole plan (`PROBES`). The set is measured in `PASSES`
passes and the fit takes each probe's median: host-bound steps drift on a lent VM.

    autoparallel calibrate --trainer --raw probes.jsonl                       # 1-GPU probes
    torchrun --nproc-per-node 2 $(which autoparallel) calibrate --trainer --raw probes.jsonl  # 2-GPU ones
    autoparallel calibrate --trainer --fit probes.jsonl --base h200 --output h200-trainer.yaml

The fit (`fit_host_terms`) minimizes sum_i ((t_model_i - t_i) / t_i)^2 over the probes with
t_model = CostModel.estimate of the probe's plan under the candidate terms: projected Gauss-Newton
with non-negative terms, the Jacobian by finite differences of `estimate` itself, so the fitted
numbers mean exactly what the cost model does with them. The per-op rates keep the profile's
forward/backward (and MoE) ratios and are scaled by one factor. Each term is reported with its standard
error from the probes' scatter (`HostFit.spread`), or as unmeasured where no probe of the set moves it
(the two-GPU terms, from one-GPU probes alone).

A fitted profile moves to another machine of the same accelerator without the full set: `--rescale`
times three one-GPU probes there (`SPEED_PROBES`) and scales every host term by one factor, their step
times' ratio to the ones the profile was fitted at (`fit_host_speed`):

    autoparallel calibrate --trainer --rescale --base h200 --output h200-here.yaml
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autoparallel.errors import UserError
from cost_models.host import HELD_TERMS, HOST_TERMS

TINY_LLAMA = {"name": "tiny-llama", "model_type": "llama", "vocab_size": 512, "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256}
TINY_MOE = {"name": "tiny-moe", "model_type": "qwen2_moe", "vocab_size": 512, "hidden_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "intermediate_size": 512, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256, "shared_expert_intermediate_size": 0, "norm_topk_prob": True}
# hidden size and vocabulary of the 1.3B llama on two layers: still host-bound at micro-batch 1 x 128 tokens,
# it shows whether the per-op host rate of the tiny probes holds at real widths
WIDE_LLAMA = {"name": "wide-llama", "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
              "intermediate_size": 5632, "num_hidden_layers": 2, "num_attention_heads": 16,
              "num_key_value_heads": 4, "max_position_embeddings": 256}
# a GPT block holds 16 parameter tensors (biases, LayerNorm biases) to the llama's 9 at fewer ops: FSDP2's per-
# tensor work (host_us_per_fsdp_tensor) moves apart from the per-op rates and the per-step term
TINY_GPT = {"name": "tiny-gpt", "model_type": "gpt2", "vocab_size": 512, "n_positions": 256, "n_embd": 256,
            "n_layer": 8, "n_head": 4}
# the tiny llama with a bias on every projection: 16 parameter tensors a block to its 9 at the same GEMMs (a
# linear's bias rides in its addmm; the backward adds a sum per bias), so the pair tells FSDP2's per-tensor
# work from the per-op rates directly
TINY_LLAMA_BIAS = {**TINY_LLAMA, "name": "tiny-llama-bias", "attention_bias": True, "mlp_bias": True}
MODELS = {m["name"]: m for m in (TINY_LLAMA, TINY_MOE, WIDE_LLAMA, TINY_GPT, TINY_LLAMA_BIAS)}
SEQ = 128
# the per-op rate keys the fit scales by one factor (their ratios stay the base profile's)
RATE_KEYS = ("host_us_per_op", "host_us_per_op_fwd_bwd", "host_us_per_op_moe", "host_us_per_op_moe_fwd_bwd")
UNKNOWNS = ("host_op_scale",) + HOST_TERMS
NOMINAL_HOST_US_PER_OP = 10.0  # what the scale multiplies for a base profile without per-op rates


@dataclass(frozen=True)
class Probe:
    """One small trainer configuration; `fix` pins its whole plan."""
    name: str
    model: str
    gpus: int
    rows: int                      # sequences per step
    fix: dict[str, Any] = field(default_factory=dict)


def _p(name: str, model: str, gpus: int, rows: int, **fix: Any) -> Probe:
    base = {"micro_batch": 1, "recompute": "none", "compile": 0, "tp": 1, "pp": 1, "ep": 1}
    return Probe(name, model, gpus, rows, {**base, **fix})


# each term has probes that move it apart from the others: micro-batch counts (per-step vs per-micro-
# batch work), recompute modes (checkpoint regions, per-op checkpointing), compiled blocks, tp, pp and ep
PROBES = (
    _p("llama-m1", "tiny-llama", 1, 1),
    _p("llama-m4", "tiny-llama", 1, 4),
    _p("llama-m4-full", "tiny-llama", 1, 4, recompute="full"),
    _p("llama-m4-selective", "tiny-llama", 1, 4, recompute="selective"),
    _p("llama-m4-op", "tiny-llama", 1, 4, recompute="op"),
    _p("llama-m4-compiled", "tiny-llama", 1, 4, compile=1),
    _p("wide-m4", "wide-llama", 1, 4),
    _p("gpt-m1", "tiny-gpt", 1, 1),
    _p("llama-bias-m1", "tiny-llama-bias", 1, 1),
    _p("llama-bias-m4", "tiny-llama-bias", 1, 4),
    _p("gpt-m4-compiled", "tiny-gpt", 1, 4, compile=1),
    _p("moe-m2", "tiny-moe", 1, 2),
    _p("llama-dp2-m2", "tiny-llama", 2, 4, dp=2, zero=2),
    _p("llama-dp2-zero3-m2", "tiny-llama", 2, 4, dp=2, zero=3),
    _p("llama-tp2-m2", "tiny-llama", 2, 2, tp=2, dp=1),
    _p("llama-tp2sp-m2", "tiny-llama", 2, 2, tp=2, dp=1, sp=1),
    _p("llama-pp2-m4", "tiny-llama", 2, 4, pp=2, dp=1, vpp=1),
    _p("llama-pp2-vpp2-m4", "tiny-llama", 2, 4, pp=2, dp=1, vpp=2),
    _p("moe-ep2-m2", "tiny-moe", 2, 4, ep=2, dp=1),
)


def meta_model(spec: dict[str, Any]):
    import torch

    from autoparallel.models import build_model, load_model_spec
    with torch.device("meta"):
        return build_model(load_model_spec(spec))


def probe_plan(probe: Probe, profile: Any):
    """The probe's plan (every field pinned) from the planner, so placements are the solver's. At these
    widths the solver splits nothing by itself and the planner falls back to Megatron's layout without
    sequence parallelism; a sequence-parallel probe takes that layout with its norms sequence-sharded,
    as the planner's SP plans of wider models have them."""
    from autoparallel.api import plan_result
    sp = bool(probe.fix.get("sp"))
    fix = {k: v for k, v in probe.fix.items() if k != "sp"}
    result, _ = plan_result(meta_model(MODELS[probe.model]), hardware=profile, gpus=probe.gpus,
                            global_batch=probe.rows, seq_len=SEQ, gpus_per_node=probe.gpus, fix=fix)
    if result.plan is None:
        raise UserError(f"calibrate --trainer: probe {probe.name} has no plan ({result.explanation})")
    if not sp:
        return result.plan
    seq = {k: "sequence" if v == "replicate" else v for k, v in result.plan.placements.items()}
    return dataclasses.replace(result.plan, sequence_parallel=True, placements=seq)


# ------------------------------------------------------------------------------------------- measure (GPU)
@dataclass
class StepTiming:
    step_time_s: float              # median of the timed steps
    step_times_s: list[float]
    peak_memory_gib: float          # max allocated over the timed steps, above what was allocated before
    losses: list[float]


def time_trainer_steps(trainer: Any, batches: Sequence[Any], warmup: int, steps: int, base_bytes: int = 0,
                       between: Callable[[], Any] | None = None) -> StepTiming:
    """Time trainer.step between device synchronizations after `warmup` steps (shared with
    benchmarks/trainer_sweep.py, which times the large configurations the same way). `between`: called before
    each timed step, outside its timing (trainer_sweep's host probes interleaved with a configuration's steps)."""
    import torch
    losses = [trainer.step(batches[i % len(batches)]) for i in range(warmup)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        if between is not None:
            between()
        t = time.perf_counter()
        losses.append(trainer.step(batches[i % len(batches)]))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return StepTiming(statistics.median(times), times, (torch.cuda.max_memory_allocated() - base_bytes) / 2**30,
                      losses)


# Passes over the whole probe set, each building every probe's trainer afresh. Host-bound steps drift on a
# lent VM: two identical probes (llama-m4 and llama-m4-selective: the tiny llama's attention is SDPA, which
# selective recompute leaves alone) measured 182 and 142 ms one after the other on one VM, 100.6 and 93.7 on
# another (benchmarks/results/raw/trainer_probes_s8.jsonl, _s10.jsonl). The fit takes each probe's median
# over the passes (load_records), so one slow phase of the VM moves one pass's number, not the fit.
PASSES = 3


def probe_trainer(probe: Probe, plan: Any) -> tuple[Any, list[Any]]:
    """AutoParallelTrainer running `plan` on the probe's model, and the two token batches its steps alternate
    (seeded: every machine times the same tokens)."""
    import torch

    from autoparallel import AutoParallelTrainer
    trainer = AutoParallelTrainer(meta_model(MODELS[probe.model]), optimizer=None, plan=plan,
                                  compile=bool(plan.compile))
    gen = torch.Generator().manual_seed(0)
    vocab = MODELS[probe.model]["vocab_size"]
    return trainer, [torch.randint(0, vocab, (probe.rows, SEQ + 1), generator=gen) for _ in range(2)]


def measure_probes(raw: Path, profile: str, warmup: int = 5, steps: int = 20,
                   say: Callable[[str], None] = print, passes: int = PASSES,
                   names: Sequence[str] | None = None) -> int:
    """Run every probe for this world size (of `names`, when given) with AutoParallelTrainer, `passes`
    times over the set; rank 0 appends one JSON line per probe and pass (its plan, the measured step time)
    to `raw`. Returns the number of probe runs."""
    import os

    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    probes = [p for p in PROBES if p.gpus == world and (names is None or p.name in names)]
    plans = {p.name: probe_plan(p, profile) for p in probes}  # planned once: every pass runs the same plan
    run = 0
    for n_pass, probe in ((k, p) for k in range(passes) for p in probes):
        plan = plans[probe.name]
        gc.collect()
        torch.cuda.empty_cache()
        try:
            torch._dynamo.reset()  # a compiled probe compiles afresh, within the recompile limit
            trainer, batches = probe_trainer(probe, plan)
            timing = time_trainer_steps(trainer, batches, warmup, steps)
            del trainer
        except Exception as e:  # noqa: BLE001  (one probe's failure must not lose the others; the fit skips it)
            say(f"{probe.name}: failed ({e!r})"[:400])
            continue
        run += 1
        if rank == 0:
            rec = {"probe": probe.name, "pass": n_pass, "gpus": world, "plan": plan.to_dict(),
                   "measured": {"step_time_s": timing.step_time_s, "step_times_s": timing.step_times_s},
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__}
            with raw.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            say(f"{probe.name} (pass {n_pass + 1} of {passes}): {timing.step_time_s * 1e3:.2f} ms")
    return run


# ----------------------------------------------------------------------------------------------- fit (CPU)
@dataclass(frozen=True)
class ProbeRecord:
    probe: Probe
    plan: Any                      # autoparallel.plan.Plan
    measured_s: float


@dataclass(frozen=True)
class HostFit:
    terms: dict[str, float]        # calibration entries: the HOST_TERMS [us] and the scaled per-op rates
    scale: float                   # the per-op rate factor against the base profile
    residuals: dict[str, float]    # probe -> (model - measured) / measured at the fitted terms
    # HOST_TERMS key -> one standard error [us] (None: no probe of the set moves the term, kept at the base's value
    # times the fitted scale, as HELD_TERMS are; nan:
    # the probes leave too few degrees of freedom to say), from the probes' own scatter (`_standard_errors`)
    spread: dict[str, float | None] = dataclasses.field(default_factory=dict)


def load_records(paths: Sequence[str]) -> list[ProbeRecord]:
    """The probe records of `paths`, one per probe: its median step time over the passes (records) found."""
    from autoparallel.plan import Plan
    by_name = {p.name: p for p in PROBES}
    out: dict[str, ProbeRecord] = {}
    times: dict[str, list[float]] = {}
    for path in paths:
        text = Path(path).read_text() if Path(path).is_file() else None
        if text is None:
            raise UserError(f"calibrate --trainer --fit: {path} is not a file; pass the --raw file(s) the "
                            f"measuring runs wrote")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                probe = by_name[rec["probe"]]
                times.setdefault(probe.name, []).append(float(rec["measured"]["step_time_s"]))
                out[probe.name] = ProbeRecord(probe, Plan.from_dict(rec["plan"]),
                                              statistics.median(times[probe.name]))
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"calibrate --trainer --fit: {path}:{n} is not a probe record ({e!r}); "
                                f"pass the files `calibrate --trainer --raw` wrote") from None
    if not out:
        raise UserError("calibrate --trainer --fit: no probe records in " + ", ".join(paths))
    return [out[p.name] for p in PROBES if p.name in out]


def calibration_for(base: Any, x: np.ndarray) -> dict[str, Any]:
    """Calibration entries of the unknowns x = (op-rate scale, HOST_TERMS in us) over `base`; the base's
    HELD_TERMS (measured per block, which no probe separates) move with the per-op rates' scale."""
    cal = dict(base.calibration or {})
    if not any(k in cal for k in RATE_KEYS):  # an uncalibrated base: the scale multiplies a nominal rate
        cal["host_us_per_op"] = NOMINAL_HOST_US_PER_OP
    entries: dict[str, Any] = {}
    for key in RATE_KEYS:
        v = cal.get(key)
        if isinstance(v, (int, float)):
            entries[key] = round(float(v * x[0]), 3)
        elif isinstance(v, list):
            entries[key] = [round(float(u * x[0]), 3) for u in v]
    for key, value in zip(HOST_TERMS, x[1:], strict=True):
        entries[key] = round(float(value), 3)
    for key in HELD_TERMS:
        if isinstance(cal.get(key), (int, float)):
            entries[key] = round(float(cal[key] * x[0]), 3)
    return entries


def _predictor(records: Sequence[ProbeRecord], base: Any) -> Callable[[np.ndarray], np.ndarray]:
    from autoparallel.api import make_cluster, trace_model
    from autoparallel.sharding import cost_model
    from cost_models.segments import SegmentCache
    graphs = {r.probe.model: trace_model(meta_model(MODELS[r.probe.model]), seq_len=SEQ) for r in records}
    # every trial profile prices the same plans of the same graphs: one segment analysis each
    caches = {name: SegmentCache(graph) for name, graph in graphs.items()}

    def predict(x: np.ndarray) -> np.ndarray:
        prof = dataclasses.replace(base, calibration={**(base.calibration or {}), **calibration_for(base, x)})
        return np.array([cost_model(graphs[r.probe.model], make_cluster(prof, r.probe.gpus, r.probe.gpus),
                                    segment_cache=caches[r.probe.model]).estimate(r.plan).step_time_s
                         for r in records])
    return predict


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0, by active sets (Lawson-Hanson); a few unknowns only."""
    n = a.shape[1]
    free = np.ones(n, dtype=bool)
    for _ in range(4 * n):
        x = np.zeros(n)
        if free.any():
            x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        if (x >= 0).all():
            return x
        free &= x > 0
    return np.maximum(x, 0.0)


def _standard_errors(jac: np.ndarray, rel_residuals: np.ndarray, x: np.ndarray) -> list[float | None]:
    """One standard error per unknown of the linearized fit: sigma^2 (J^T J)^-1 over the unknowns the fit
    uses (nonzero), J the Jacobian of the relative errors, sigma^2 the residuals' sum of squares over the
    degrees of freedom left. An unknown that no probe moves gets None; one held at its bound (0) gets the
    error of a one-sided estimate on the same scale (its column alone). Probe sets that pin a term loosely
    (no probe with more tensors per op, say) show up as a large error, not as a confident wrong value."""
    moved = np.linalg.norm(jac, axis=0) > 1e-12
    free = moved & (x > 0)
    dof = len(rel_residuals) - int(free.sum())
    sigma2 = float(rel_residuals @ rel_residuals) / dof if dof > 0 else float("nan")
    out: list[float | None] = [None] * len(x)
    if free.any():
        cov = sigma2 * np.linalg.pinv(jac[:, free].T @ jac[:, free])
        for k, v in zip(np.flatnonzero(free), np.sqrt(np.abs(np.diag(cov))), strict=True):
            out[k] = float(v)
    for k in np.flatnonzero(moved & ~free):
        out[k] = float(np.sqrt(sigma2 / float(jac[:, k] @ jac[:, k])))
    return out


def fit_host_terms(records: Sequence[ProbeRecord], base: Any, iterations: int = 6) -> HostFit:
    """Projected Gauss-Newton on relative errors (module docstring); terms in us, scale unitless."""
    predict = _predictor(records, base)
    t = np.array([r.measured_s for r in records])
    x = np.array([1.0] + [0.0] * len(HOST_TERMS))
    steps = np.array([0.05] + [5.0] * len(HOST_TERMS))  # finite-difference steps: 5% of the rate, 5 us

    def jacobian(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.column_stack([(predict(x + np.eye(len(x))[k] * steps[k]) - y) / steps[k] for k in range(len(x))])
    for _ in range(iterations):
        y = predict(x)
        jac = jacobian(x, y)
        # linearized: y + J (x' - x) ~ t, weighted by 1/t (relative errors), x' >= 0
        w = 1.0 / t
        x_new = _nnls(jac * w[:, None], (t - y + jac @ x) * w)
        if np.allclose(x_new, x, rtol=1e-3, atol=1e-3):
            x = x_new
            break
        x = x_new
    y = predict(x)
    errors = _standard_errors(jacobian(x, y) / t[:, None], (y - t) / t, x)
    # a term no probe of the set moves (one-GPU probes and the tensor-parallel collective) keeps the base's value
    # at this host's speed: the fit has no say on it, and 0 would price that work as free (it wrote 0 for h200's
    # measured 1058 us)
    base_cal = base.calibration or {}
    for k, (key, e) in enumerate(zip(HOST_TERMS, errors[1:], strict=True), start=1):
        if e is None and isinstance(base_cal.get(key), (int, float)):
            x[k] = float(base_cal[key]) * x[0]
    return HostFit(calibration_for(base, x), float(x[0]),
                   {r.probe.name: float((yi - r.measured_s) / r.measured_s) for r, yi in zip(records, y, strict=True)},
                   {key: (None if e is None else round(e, 3)) for key, e in zip(HOST_TERMS, errors[1:], strict=True)})


def describe_terms(fit: HostFit) -> str:
    """The fitted host terms with their standard errors, for the fit's report line."""
    def one(key: str) -> str:
        e = fit.spread.get(key, float("nan"))
        return f"{key} {fit.terms[key]}" + (" (no probe measures it: the base's)" if e is None else f" (+-{e:.3g})")
    return ", ".join(one(k) for k in HOST_TERMS)


# ------------------------------------------------------------------------------------ host speed (CPU)
# The host terms describe one machine's CPU. Lent H200 VMs differed by up to 2x on the same probes (llama-m4:
# 101 ms on one, 194 ms on another), and most of that is one factor on every host term: one VM's fitted
# terms scaled by this factor to ten other VMs predicted their trainer sweeps within 7.9% mean, against
# 12.9% unscaled (benchmarks/host_transfer.py, docs/host_transfer_s4.md). Three eager one-GPU probes, all
# host-bound, dense and MoE, one and four micro-batches.
SPEED_PROBES = ("llama-m1", "llama-m4", "moe-m2")
REFERENCE_KEY = "host_probe_ms"  # calibration entry: the SPEED_PROBES' step times where the host terms were fitted


@dataclass(frozen=True)
class HostSpeed:
    factor: float                  # every host_us_* entry of the base profile is multiplied by it
    ratios: dict[str, float]       # probe -> its step time here / on the machine the base was fitted on


def scale_host_terms(calibration: dict[str, Any], factor: float) -> dict[str, Any]:
    """The host entries (every `host_us_*` key: HOST_TERMS, the per-op rates, the GEMM-shape costs) of
    `calibration` multiplied by `factor`; the other entries are not host time and stay out."""
    return {k: ([round(float(u) * factor, 3) for u in v] if isinstance(v, list) else round(float(v) * factor, 3))
            for k, v in calibration.items() if k.startswith("host_us_")}


def rescaled(profile: Any, factor: float) -> Any:
    """`profile` with its host terms multiplied by `factor` (scale_host_terms), in memory."""
    cal = dict(profile.calibration or {})
    return dataclasses.replace(profile, calibration={**cal, **scale_host_terms(cal, factor)})


def reference_times(records: Sequence[ProbeRecord]) -> dict[str, float]:
    """The REFERENCE_KEY entry a fit writes: the records' SPEED_PROBES step times in ms."""
    return {r.probe.name: round(r.measured_s * 1e3, 3) for r in records if r.probe.name in SPEED_PROBES}


def _speed_ratios(records: Sequence[ProbeRecord], reference_ms: dict[str, float]) -> dict[str, float]:
    """probe -> its step time in `records` over its reference time, for the SPEED_PROBES in both."""
    return {r.probe.name: r.measured_s * 1e3 / float(reference_ms[r.probe.name]) for r in records
            if r.probe.name in SPEED_PROBES and r.probe.name in reference_ms}


def fit_host_speed(records: Sequence[ProbeRecord], base: Any) -> HostSpeed:
    """The geometric mean, over the SPEED_PROBES measured here and on the base's machine, of the ratio of
    their step times. The probes are host-bound, so their times scale with the host terms; a ratio of
    measured times also cancels whatever the base's fit left in their residuals (a cost-model fit of the
    factor would carry those over: the shipped h200 terms predict its own VM's three probes 8% fast)."""
    cal = dict(base.calibration or {})
    ref = cal.get(REFERENCE_KEY)
    if not isinstance(ref, dict) or not any(k.startswith("host_us_") and cal[k] for k in cal):
        raise UserError(f"calibrate --trainer --rescale: profile {base.name} has no fitted host terms with the "
                        f"probe times they were fitted at ({REFERENCE_KEY}); fit them with the full "
                        f"`calibrate --trainer` (--raw, then --fit), which records both")
    ratios = _speed_ratios(records, ref)
    if not ratios:
        raise UserError(f"calibrate --trainer --rescale: the records hold none of the probes "
                        f"{', '.join(sorted(ref))} that {base.name}'s {REFERENCE_KEY} has; measure them with "
                        f"`calibrate --trainer --rescale`")
    return HostSpeed(statistics.geometric_mean(ratios.values()), ratios)


def pool_machines(machines: Sequence[Sequence[ProbeRecord]]) -> tuple[list[ProbeRecord], dict[str, float]]:
    """Several machines' probe records as one machine's, for a fit that no one VM's drift or missing probes
    decide: the reference speed is each SPEED_PROBE's geometric mean over the machines, each machine's times
    are divided by its factor against it (`fit_host_speed`'s ratio), then each probe takes its median over
    the machines that measured it. Returns the pooled records and the reference times (ms) they are at."""
    if not machines:
        raise UserError("pool_machines: no machines")
    for n, records in enumerate(machines):
        missing = set(SPEED_PROBES) - {r.probe.name for r in records}
        if missing:
            raise UserError(f"pool_machines: machine {n} lacks the speed probes {sorted(missing)}; its host speed "
                            f"against the others is unknown")
    ref = {p: statistics.geometric_mean(next(r.measured_s for r in m if r.probe.name == p) for m in machines) * 1e3
           for p in SPEED_PROBES}
    times: dict[str, list[float]] = {}
    plans: dict[str, ProbeRecord] = {}
    for records in machines:
        factor = statistics.geometric_mean(_speed_ratios(records, ref).values())
        for r in records:
            if r.probe.name in plans and plans[r.probe.name].plan != r.plan:
                raise UserError(f"pool_machines: probe {r.probe.name} ran different plans on different machines; "
                                f"pool records of one planner version")
            times.setdefault(r.probe.name, []).append(r.measured_s / factor)
            plans[r.probe.name] = r
    pooled = [dataclasses.replace(plans[p.name], measured_s=statistics.median(times[p.name]))
              for p in PROBES if p.name in plans]
    return pooled, {p: round(v, 3) for p, v in ref.items()}


def _write_rescaled(profile: Any, records: Sequence[ProbeRecord], output: str, say: Callable[[str], None]) -> None:
    from hardware_profiles import profile_to_yaml
    speed = fit_host_speed(records, profile)
    note = f"{profile.name}'s host terms x {speed.factor:.3f} (the geometric mean of {REFERENCE_KEY}'s ratios)"
    Path(output).write_text(profile_to_yaml(rescaled(profile, speed.factor), extra={"calibration": {
        REFERENCE_KEY: reference_times(records), "host_speed": note}}))
    for name, r in speed.ratios.items():
        say(f"  {name}: {r:.3f} x the base machine's")
    say(f"host terms x {speed.factor:.3f} of {profile.name}'s; wrote {output}")


def run_trainer_calibration(base: str | None, output: str, raw: str | None, fit: Sequence[str] | None,
                            say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
                            rescale: bool = False) -> int:
    """The CLI's `calibrate --trainer`: measure into `raw`, or fit the `fit` files into a profile at `output`;
    `rescale`: only the base profile's host speed, from the SPEED_PROBES of `fit` or measured here."""
    from hardware_profiles import load_profile, profile_to_yaml
    if rescale:
        profile = load_profile(base or "h200")
        if fit:
            _write_rescaled(profile, load_records(fit), output, say)
            return 0
        import os
        import tempfile

        import torch
        if raw and Path(raw).is_file() and Path(raw).stat().st_size:
            raise UserError(f"calibrate --trainer --rescale: --raw {raw} already holds records, which would mix "
                            f"with this machine's; give a new file")
        if not torch.cuda.is_available():
            raise UserError("calibrate --trainer --rescale: no CUDA device here; run it on the machine that "
                            "will train, or pass --fit FILE with probes measured there")
        if int(os.environ.get("WORLD_SIZE", "1")) != 1:
            raise UserError("calibrate --trainer --rescale: its probes run on one GPU; run it without torchrun")
        path = Path(raw) if raw else Path(tempfile.mkdtemp()) / "speed_probes.jsonl"
        measure_probes(path, base or "h200", say=say, names=SPEED_PROBES)
        _write_rescaled(profile, load_records([str(path)]), output, say)
        return 0
    if fit:
        profile = load_profile(base or "h200")
        records = load_records(fit)
        hf = fit_host_terms(records, profile)
        Path(output).write_text(profile_to_yaml(profile, extra={"calibration": {
            **hf.terms, REFERENCE_KEY: reference_times(records)}}))
        for name, r in hf.residuals.items():
            say(f"  {name}: model {r:+.1%}")
        say(f"fitted {describe_terms(hf)}; per-op rate x{hf.scale:.3f}; wrote {output}")
        return 0
    if raw is None:
        raise UserError("calibrate --trainer: give --raw FILE (measure the probes here) or --fit FILE... "
                        "(fit measured probes into a profile)")
    import torch
    if not torch.cuda.is_available():
        raise UserError("calibrate --trainer: no CUDA device here; run the measuring step on the machine "
                        "that will train (the fit runs anywhere)")
    n = measure_probes(Path(raw), base or "h200", say=say)
    say(f"measured {n} probes into {raw}")
    return 0
