"""Validate the cost model against published pre-training runs it was never fitted to (issue #12).

Reads benchmarks/data/published_runs.yaml. For every row: build the model spec, build the Plan the
run used (mesh, batch split, ZeRO stage, recompute per block), run `CostModel.estimate` with the
shipped hardware profile, and compare predicted with measured throughput (tokens/s/GPU, or TFLOP/s
per GPU converted with the source's own FLOP convention) and, where reported, peak memory.

No per-row settings: the only knobs are framework-wide runtime facts, all in FRAMEWORK_RUNTIME.
Rows the cost model cannot express (fp8, context parallelism before Plan had cp, torch.compile while the Plan has no
compile field, architectures outside the specs) are listed as skipped with the reason.

    PYTHONPATH=. python benchmarks/validate_published.py            # all rows; writes the doc + JSON
    PYTHONPATH=. python benchmarks/validate_published.py --rows tt-h100-8b-fsdp8,mpt-h100-7b-fsdp8-noac
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from anywhere without an install pointing elsewhere
    sys.path.insert(0, str(ROOT))

from autoparallel.errors import UserError  # noqa: E402
from autoparallel.plan import Plan  # noqa: E402
from autoparallel.specs import ModelSpec, load_model_spec, parameter_count  # noqa: E402
from cost_models.estimate import TRAINER, RuntimeVariant  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "published_runs.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "published_validation.json"
DOC = ROOT / "docs" / "validation_published.md"
DIAGNOSIS = ROOT / "docs" / "validation_published_diagnosis.md"  # hand-written; appended to DOC
COMMAND = "PYTHONPATH=. python benchmarks/validate_published.py"

REQUIRED = ("id", "source", "framework", "hardware", "gpus", "gpus_per_node", "model", "seq_len",
            "global_batch", "micro_batch", "tp", "pp", "vpp", "dp", "ep", "cp", "zero", "recompute",
            "precision", "compile", "measured", "metric")
RECOMPUTE_VOCAB = ("none", "selective", "full", "op_sac", "layer_sac_2")


@dataclass(frozen=True)
class Runtime:
    """What a framework does, the same for every run of it (never per row)."""
    family: str                 # torch-native | megatron | other: the grouping of the report
    overlap_grad_sync: bool     # DP gradient reduction overlapped with backward
    param_dtype: str            # dtype of the parameters compute reads (Plan.param_dtype)
    grad_reduce_dtype: str      # dtype of the DP gradient reduction (Plan.grad_reduce_dtype)
    sequence_parallel: bool     # SP whenever tp > 1
    variant: RuntimeVariant     # where the runtime differs from AutoParallelTrainer (op SAC, loss, attention, TP overlap)
    note: str
    # FSDP under a pipeline keeps ZeRO-3's per-forward resharding (the trainer's); False: its units stay gathered
    # for the whole step there (torchtitan's apply_fsdp: reshard_after_forward = not pp_enabled), which is the
    # trainer's pipelined ZeRO-1 (cost_models.comm.trainer_dp_schedule)
    fsdp_reshards_under_pp: bool = True

    @property
    def cost_runtime(self) -> str:
        """The cost model's runtime (CostModel(runtime=...)): Megatron's persistent gradient buffers and
        master-weight copies, or FSDP-style sharded fp32 parameters with gradients freed each step."""
        return "megatron" if self.family == "megatron" else "trainer"


# torchtitan's per-op SAC recomputes every second mm (compute.OP_SAC_POLICIES); until 2025 its train.py left the
# loss eager ("compiling loss function causes CUDA errors", 9dec370, 2024-12); components/loss.py compiles it
# with the model from 2025 (e7c0cae, 2025-06): two versions of the framework, told apart by the source's commit.
# Both ran SDPA's flash kernel (FlashAttention-2) on Hopper: torch's default until cuDNN's kernel took over (2.9
# with cuDNN >= 9.15), and torchtitan's own pick (models/attention.py at e7c0cae: cuDNN first on sm100 only).
# Both clip the gradients' global norm every step (config job_config.py: training.max_norm = 1.0 by default;
# train.py: dist_utils.clip_grad_norm_)
TORCHTITAN_2024 = RuntimeVariant(op_sac="torchtitan", compiles_loss=False, attention="flash", clip_grad_norm=True)
TORCHTITAN_2025 = RuntimeVariant(op_sac="torchtitan", compiles_loss=True, attention="flash", clip_grad_norm=True)
# MPT's attn_impl flash / triton: the flash-attn package's FlashAttention-2 (or its Triton port), 2023
FLASH_ATTENTION_2 = RuntimeVariant(attention="flash")
# Megatron-Core's published runs overlap the TP collectives with their GEMMs through Transformer Engine's
# userbuffers: the README's model table ("--tp-comm-overlap", Performance Benchmarking), NeMo 2's performance
# recipes (nemo/collections/llm/recipes/llama3_70b.py: MegatronCommOverlapCallback(tp_comm_overlap=True) with
# userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192) and Megatron-Bridge's (scripts/performance llama3 70B:
# userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192); TE requires sequence parallelism for it, which they run
MEGATRON_TP_OVERLAP = RuntimeVariant(tp_comm_overlap=True)
TORCHTITAN_NOTE = ("FSDP2 fully_shard, MixedPrecisionPolicy(param bf16, reduce fp32): sharded fp32 parameters, "
                   "bf16 all-gather/compute, fp32 reduce-scatter; prefetch overlaps the collectives; TP plans "
                   "shard norms on the sequence (SP); under PP the blocks stay gathered (reshard_after_forward = not "
                   "pp_enabled); per-op SAC recomputes every second mm")

FRAMEWORK_RUNTIME: dict[str, Runtime] = {
    "torchtitan": Runtime(
        "torch-native", True, "bf16", "fp32", True, TORCHTITAN_2024,
        TORCHTITAN_NOTE + "; the loss eager (2024: train.py)", fsdp_reshards_under_pp=False),
    "torchtitan-2025": Runtime(
        "torch-native", True, "bf16", "fp32", True, TORCHTITAN_2025,
        TORCHTITAN_NOTE + "; compiled runs compile the loss (2025: components/loss.py)",
        fsdp_reshards_under_pp=False),
    "llm-foundry": Runtime(
        "torch-native", True, "bf16", "bf16", False, FLASH_ATTENTION_2,
        "Composer FSDP1 FULL_SHARD with mixed_precision PURE: bf16 compute, bf16 gradient reduce, "
        "fp32 sharded master weights; backward prefetch overlaps the collectives"),
    "nemo-automodel": Runtime(
        "torch-native", True, "bf16", "fp32", False, TRAINER,
        "FSDP2 (+ EP over DeepEP), bf16 compute, fp32 reduce; TE kernels"),
    "megatron-bridge": Runtime(
        "megatron", True, "bf16", "fp32", True, MEGATRON_TP_OVERLAP,
        "Megatron-Core: bf16 params, fp32 main grads (bf16 implies accumulate_allreduce_grads_in_fp32), "
        "distributed optimizer, --overlap-grad-reduce/--overlap-param-gather in the perf recipes, SP with TP, "
        "TP collectives overlapped with the GEMMs (Transformer Engine userbuffers, --tp-comm-overlap)"),
    "megatron-core": Runtime(
        "megatron", True, "bf16", "fp32", True, MEGATRON_TP_OVERLAP, "as megatron-bridge"),
    "nemo": Runtime(
        "megatron", True, "bf16", "fp32", True, MEGATRON_TP_OVERLAP, "NeMo 2 = Megatron-Core; as megatron-bridge"),
    "meta-internal": Runtime(
        "other", True, "bf16", "fp32", True, TRAINER,
        "Llama 3 trainer (FSDP + TP + PP + CP); grad reduction dtype not published, fp32 assumed"),
}


def load_runs(path: Path = DATA) -> list[dict]:
    return yaml.safe_load(path.read_text())["runs"]


def check_row(row: dict) -> list[str]:
    """Problems with a row's fields (empty when it is complete)."""
    bad = [f"missing {k}" for k in REQUIRED if k not in row]
    if bad:
        return bad
    src = row["source"]
    if not (isinstance(src, dict) and str(src.get("url", "")).startswith("http") and src.get("title")
            and src.get("where")):
        bad.append("source needs title, url (http...) and where")
    if row["framework"] not in FRAMEWORK_RUNTIME:
        bad.append(f"framework {row['framework']!r} not in FRAMEWORK_RUNTIME")
    if row["recompute"] not in RECOMPUTE_VOCAB:
        bad.append(f"recompute {row['recompute']!r} not in {RECOMPUTE_VOCAB}")
    if row["precision"] not in ("bf16", "fp8"):
        bad.append(f"precision {row['precision']!r}")
    m = row["measured"]
    if row["metric"] not in m:
        bad.append(f"metric {row['metric']} not among the measured values")
    if row["metric"] == "tflops_per_gpu" and not (row.get("flop_convention") and
                                                  row.get("flop_formula") in ("palm", "megatron")):
        bad.append("a TFLOP/s metric needs flop_convention (text) and flop_formula (palm | megatron)")
    if not row.get("skip"):
        if row["tp"] * row["pp"] * row["dp"] * row["ep"] * row["cp"] != row["gpus"]:
            bad.append("tp*pp*dp*ep*cp != gpus")
        if row["global_batch"] % (row["dp"] * row["ep"] * row["micro_batch"]):
            bad.append("global_batch not divisible by dp*ep*micro_batch")
    return bad


def skip_reason(row: dict) -> str | None:
    """Why the cost model cannot express this run today (None when it can)."""
    if row.get("skip"):
        return row["skip"]
    plan_fields = {f.name for f in dataclasses.fields(Plan)}
    if row["precision"] == "fp8" and "fp8" not in plan_fields:
        return "fp8 compute: the cost model has bf16 only"
    if row["cp"] > 1 and "cp" not in plan_fields:
        return "context parallelism: no cp in Plan"
    if row["compile"] and "compile" not in plan_fields:
        return "torch.compile: no compile field in Plan (the cost model predicts eager)"
    return None


def model_spec(row: dict) -> ModelSpec:
    m = row["model"]
    if "catalog" in m:
        return load_model_spec(m["catalog"])
    if "hf" in m:
        return load_model_spec(dict(m["hf"]))
    raise UserError(f"{row['id']}: model {m} is neither a catalog name nor an HF config")


def recompute_per_block(row: dict, num_blocks: int) -> tuple[str, ...]:
    rc = row["recompute"]
    if rc == "layer_sac_2":  # torchtitan ac_freq 2: every second block checkpointed in full
        return tuple("full" if (i + 1) % 2 == 0 else "none" for i in range(num_blocks))
    # torchtitan's per-op SAC is the cost model's "op" mode under the framework's policy (Runtime.variant)
    return ("op" if rc == "op_sac" else rc,) * num_blocks


def build_plan(row: dict, spec: ModelSpec, placements: dict[str, str] | None = None) -> Plan:
    """The run's Plan (validated against the spec's block count); no trace, no solver."""
    rt = FRAMEWORK_RUNTIME[row["framework"]]
    plan = Plan(model=row["id"], hardware=row["hardware"], gpus=row["gpus"], gpus_per_node=row["gpus_per_node"],
                global_batch=row["global_batch"], seq_len=row["seq_len"], dp=row["dp"], tp=row["tp"],
                pp=row["pp"], ep=row["ep"], vpp=row["vpp"], cp=row["cp"], micro_batch=row["micro_batch"],
                zero=1 if row["zero"] == 3 and row["pp"] > 1 and not rt.fsdp_reshards_under_pp else row["zero"],
                sequence_parallel=rt.sequence_parallel and row["tp"] > 1,
                recompute=recompute_per_block(row, spec.num_layers),
                grad_reduce_dtype=rt.grad_reduce_dtype, param_dtype=rt.param_dtype,
                placements=dict(placements or {}), compile=bool(row["compile"]),
                # FP8 runs: torchtitan's Float8 and Megatron's FP8-CS (current scaling) both scale per tensor
                fp8=("tensorwise",) * spec.num_layers if row["precision"] == "fp8" else ())
    plan.validate(spec.num_layers)
    return plan


def flops_per_token(spec: ModelSpec, seq: int, formula: str = "palm") -> float:
    """Model FLOPs per token (forward + backward) by a source's convention.

    palm      6 N + 12 L h s (PaLM appendix B): N without the embedding and LM-head matrices.
    megatron  Megatron-LM's num_floating_point_operations (core_r0.8.0): 12 L h^2 ((1 + kv/heads + s/h)
              * q/h + ffn/h * topk * (3/2 if gated) + V / (2 L h)), full (non-causal) attention.
    """
    h, L = spec.hidden_size, spec.num_layers
    if formula == "megatron":
        q_ratio = spec.num_heads * spec.head_dim / h
        gated = 1.5 if spec.family != "gpt" else 1.0
        if spec.is_moe:
            ffn, k = spec.moe_intermediate_size, spec.num_experts_per_tok
        else:
            ffn, k = spec.intermediate_size, 1
        return 12 * L * h * h * ((1 + spec.num_kv_heads / spec.num_heads + seq / h) * q_ratio
                                 + ffn / h * k * gated + spec.vocab_size / (2 * L * h))
    if formula != "palm":
        raise UserError(f"unknown flop_formula {formula!r} (palm | megatron)")
    n = parameter_count(spec) - spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    return 6 * n + 12 * L * spec.num_heads * spec.head_dim * seq


def measured_tokens_per_gpu(row: dict, spec: ModelSpec) -> float:
    m = row["measured"]
    if row["metric"] == "tokens_per_s_per_gpu":
        return float(m["tokens_per_s_per_gpu"])
    return m["tflops_per_gpu"] * 1e12 / flops_per_token(spec, row["seq_len"], row["flop_formula"])


def evaluate(row: dict) -> dict:
    from autoparallel.api import context

    rt = FRAMEWORK_RUNTIME[row["framework"]]
    spec = model_spec(row)
    t0 = time.perf_counter()
    ctx = context(spec, row["hardware"], row["gpus"], row["seq_len"], gpus_per_node=row["gpus_per_node"],
                  overlap_grad_sync=rt.overlap_grad_sync, runtime=rt.cost_runtime, variant=rt.variant)
    plan = build_plan(row, spec)
    plan = replace(plan, placements=ctx.cost_model.placements_for(plan))
    est = ctx.cost_model.estimate(plan, ctx.budget_bytes)
    pred_tok = est.tokens_per_s / row["gpus"]
    meas_tok = measured_tokens_per_gpu(row, spec)
    rec: dict[str, Any] = {
        "id": row["id"], "framework": row["framework"], "family": rt.family, "hardware": row["hardware"],
        "gpus": row["gpus"], "model": row["model"].get("catalog") or row["model"].get("name") or
        f"{spec.family} h{spec.hidden_size} L{spec.num_layers}", "moe": spec.is_moe,
        "layout": layout(row), "metric": row["metric"],
        "measured_tokens_per_s_per_gpu": round(meas_tok, 1), "predicted_tokens_per_s_per_gpu": round(pred_tok, 1),
        "throughput_error_pct": round((pred_tok / meas_tok - 1) * 100, 2),
        "predicted_step_s": round(est.step_time_s, 4),
        "measured_step_s": round(row["global_batch"] * row["seq_len"] / (meas_tok * row["gpus"]), 4),
        "predicted_mfu": round(est.mfu, 4),
        "predicted_peak_gib": round(est.peak_memory_gib, 2), "fits_profile_memory": est.fits,
        "budget_gib": round(est.budget_gib, 1),
        "breakdown_s": {k: round(v, 4) for k, v in est.breakdown.items()},
        "memory_breakdown_gib": {k: round(v, 2) for k, v in
                                 max(est.memory_breakdown_gib, key=lambda d: sum(d.values())).items()},
        "recompute_modelled_as": sorted(set(plan.recompute)),
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    rec["compute_split_per_block"] = compute_split(ctx.cost_model, plan)
    b = est.breakdown
    rec["measured_step_over_predicted_compute"] = round(
        rec["measured_step_s"] / max(b["compute_s"] + b["recompute_s"], 1e-12), 3)
    if row["recompute"] == "op_sac":
        rec["op_sac_alternatives"] = {}
        for name, modes in (("selective", ("selective",)), ("layer_sac_2", None), ("full", ("full",))):
            rc = modes * spec.num_layers if modes else recompute_per_block({**row, "recompute": "layer_sac_2"},
                                                                         spec.num_layers)
            alt = ctx.cost_model.estimate(replace(plan, recompute=rc), ctx.budget_bytes)
            rec["op_sac_alternatives"][name] = {
                "tokens_per_s_per_gpu": round(alt.tokens_per_s / row["gpus"], 1),
                "throughput_error_pct": round((alt.tokens_per_s / row["gpus"] / meas_tok - 1) * 100, 2),
                "peak_gib": round(alt.peak_memory_gib, 2)}
    if row["hardware"] in GEMM_WHAT_IF:
        rec["gemm_max_what_if"] = gemm_what_if(row, spec, ctx, plan, meas_tok)
    if row["hardware"] in PEAK_WHAT_IF:
        rec["peak_what_if"] = peak_what_if(row, spec, ctx, plan, meas_tok)
    if row["metric"] == "tflops_per_gpu":
        f = flops_per_token(spec, row["seq_len"], row["flop_formula"])
        rec["measured_tflops_per_gpu"] = row["measured"]["tflops_per_gpu"]
        rec["predicted_tflops_per_gpu"] = round(pred_tok * f / 1e12, 1)
    if "mfu" in row["measured"]:
        rec["measured_mfu"] = row["measured"]["mfu"]
    peak = row["measured"].get("peak_memory_gib")
    if peak:
        rec["measured_peak_gib"] = peak
        rec["memory_error_pct"] = round((est.peak_memory_gib / peak - 1) * 100, 2)
    return rec


# Diagnosis only (not part of the validation): the H100 rows re-estimated with the profile's GEMM
# ceiling set to the H200 profile's calibrated value and to a sustained-training value, same graph.
GEMM_WHAT_IF = {"h100-sxm": (0.738, 0.55)}
# Diagnosis only: rows on a profile whose peak is assumed within a sourced range, re-estimated at the range's
# ends (bf16 TFLOP/s; the other peaks scale alike). h100-sxm-96gb-500w: "between SXM and NVL" (torchtitan).
PEAK_WHAT_IF = {"h100-sxm-96gb-500w": (835.0, 989.0)}


def _what_if(row: dict, spec: ModelSpec, ctx: Any, plan: Plan, meas_tok: float,
             profiles: dict[str, Any]) -> dict[str, float]:
    """The row's throughput error [%] under each of `profiles` (label -> HardwareProfile), same graph and plan."""
    from autoparallel.api import context

    rt = FRAMEWORK_RUNTIME[row["framework"]]
    out = {}
    for label, prof in profiles.items():
        alt = context(spec, prof, row["gpus"], row["seq_len"], gpus_per_node=row["gpus_per_node"],
                      graph=ctx.graph, overlap_grad_sync=rt.overlap_grad_sync, runtime=rt.cost_runtime,
                      variant=rt.variant)
        est = alt.cost_model.estimate(plan, alt.budget_bytes)
        out[label] = round((est.tokens_per_s / row["gpus"] / meas_tok - 1) * 100, 2)
    return out


def gemm_what_if(row: dict, spec: ModelSpec, ctx: Any, plan: Plan, meas_tok: float) -> dict[str, float]:
    from hardware_profiles import load_profile

    base = load_profile(row["hardware"])
    return _what_if(row, spec, ctx, plan, meas_tok, {
        f"{g}": replace(base, efficiency=replace(base.efficiency, gemm_max=g)) for g in GEMM_WHAT_IF[row["hardware"]]})


def peak_what_if(row: dict, spec: ModelSpec, ctx: Any, plan: Plan, meas_tok: float) -> dict[str, float]:
    from hardware_profiles import load_profile

    base = load_profile(row["hardware"])
    scaled = {f"{t:g}": t * 1e12 / base.peak("bf16") for t in PEAK_WHAT_IF[row["hardware"]]}
    return _what_if(row, spec, ctx, plan, meas_tok, {
        label: replace(base, peak_flops={k: v * f for k, v in base.peak_flops.items()}) for label, f in scaled.items()})


GEMM_CLASSES = ("gemm", "gemm_unaligned", "gemm_align2", "gemm_grouped")


def compute_split(cm: Any, plan: Plan) -> dict[str, float]:
    """Forward + backward time of the first transformer block for one micro-batch on one device,
    split into GEMMs, attention kernels and the rest (memory-bound ops), with the GEMMs' effective
    TFLOP/s. Reads the cost model's per-op times (diagnosis only; empty if its internals moved)."""
    try:
        from cost_models.compute import CLASS_CODE
        sp = plan.sequence_parallel and plan.tp > 1
        seg = cm.segments(plan.placements, sp)[cm.block_rep(0)]
        out = {"gemm_s": 0.0, "attention_s": 0.0, "other_s": 0.0, "gemm_flops": 0.0}
        gemm = [CLASS_CODE[c] for c in GEMM_CLASSES if c in CLASS_CODE]
        for phase in ("fwd", "bwd"):
            ops = getattr(seg, phase)
            t, flops, *_ = cm._phase_times(ops, phase, plan.tp, plan.ep, sp, float(plan.micro_batch))
            is_gemm = ops.matmul & ([c in gemm for c in ops.op_class] if len(ops.op_class) else ops.matmul)
            is_attn = (ops.op_class == CLASS_CODE["attention_fwd"]) | (ops.op_class == CLASS_CODE["attention_bwd"])
            out["gemm_s"] += float(t[is_gemm].sum())
            out["attention_s"] += float(t[is_attn & ~is_gemm].sum())
            out["other_s"] += float(t[~is_gemm & ~is_attn].sum())
            out["gemm_flops"] += float(flops[is_gemm].sum())
    except Exception as e:  # noqa: BLE001  (diagnosis must not break the validation)
        return {"error": f"{type(e).__name__}: {e}"}
    total = out["gemm_s"] + out["attention_s"] + out["other_s"]
    return {"gemm_s": round(out["gemm_s"], 5), "attention_s": round(out["attention_s"], 5),
            "other_s": round(out["other_s"], 5),
            "other_share": round(out["other_s"] / total, 3) if total else 0.0,
            "gemm_tflops": round(out["gemm_flops"] / out["gemm_s"] / 1e12, 1) if out["gemm_s"] else 0.0}


def layout(row: dict) -> str:
    parts = [f"{k}{row[k]}" for k in ("dp", "tp", "pp", "ep", "cp") if row[k] > 1 or k == "dp"]
    if row["vpp"] > 1:
        parts.append(f"vpp{row['vpp']}")
    parts.append(f"zero{row['zero']}")
    parts.append(f"mb{row['micro_batch']}")
    parts.append(row["recompute"])
    return " ".join(parts)


def summarize(evaluated: list[dict]) -> dict:
    def mean_abs(xs: list[float]) -> float | None:
        return round(sum(abs(x) for x in xs) / len(xs), 2) if xs else None

    out: dict[str, Any] = {"all": {"rows": len(evaluated),
                                   "throughput_mae_pct": mean_abs([r["throughput_error_pct"] for r in evaluated]),
                                   "memory_mae_pct": mean_abs([r["memory_error_pct"] for r in evaluated
                                                               if "memory_error_pct" in r])}}
    for fam in sorted({r["family"] for r in evaluated}):
        rs = [r for r in evaluated if r["family"] == fam]
        out[fam] = {"rows": len(rs), "throughput_mae_pct": mean_abs([r["throughput_error_pct"] for r in rs]),
                    "memory_mae_pct": mean_abs([r["memory_error_pct"] for r in rs if "memory_error_pct" in r])}
    for kind, flag in (("dense", False), ("moe", True)):
        rs = [r for r in evaluated if r["moe"] == flag]
        if rs:
            out[kind] = {"rows": len(rs), "throughput_mae_pct": mean_abs([r["throughput_error_pct"] for r in rs])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=None, help="comma-separated row ids (default: all; a subset writes nothing)")
    args = ap.parse_args()
    runs = load_runs()
    for r in runs:
        problems = check_row(r)
        if problems:
            raise SystemExit(f"{r.get('id')}: {'; '.join(problems)}")
    if args.rows:
        want = args.rows.split(",")
        unknown = set(want) - {r["id"] for r in runs}
        if unknown:
            raise SystemExit(f"unknown row ids: {', '.join(sorted(unknown))}")
        runs = [r for r in runs if r["id"] in want]
    evaluated, skipped = [], []
    t0 = time.perf_counter()
    for row in runs:
        reason = skip_reason(row)
        if reason is None:
            try:
                rec = evaluate(row)
            except UserError as e:
                reason = f"cost model refused the plan: {e}"
            else:
                evaluated.append(rec)
                print(json.dumps({k: rec[k] for k in ("id", "measured_tokens_per_s_per_gpu",
                                                      "predicted_tokens_per_s_per_gpu", "throughput_error_pct",
                                                      "predicted_peak_gib", "wall_s")}), flush=True)
        if reason is not None:
            skipped.append({"id": row["id"], "framework": row["framework"], "reason": reason,
                            "measured": row["measured"], "where": row["source"]["where"]})
            print(json.dumps({"id": row["id"], "skipped": reason}), flush=True)
    summary = summarize(evaluated)
    print(json.dumps(summary), flush=True)
    print(f"total {time.perf_counter() - t0:.1f} s", flush=True)
    if args.rows:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"command": COMMAND, "framework_runtime": {k: dataclasses.asdict(v) for k, v in
                                                                             FRAMEWORK_RUNTIME.items()},
                                   "summary": summary, "evaluated": evaluated, "skipped": skipped},
                                  indent=1) + "\n")
    write_doc(load_runs(), evaluated, skipped, summary)


def frozen_at() -> str:
    """Last commit touching the profiles and the cost model (what the numbers are frozen against)."""
    import subprocess
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", "hardware_profiles", "cost_models"],
                             cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _fmt_err(x: float | None) -> str:
    return "" if x is None else f"{x:+.1f}%"


def diagnosis_tables(evaluated: list[dict]) -> list[str]:
    """Generated numbers the diagnosis cites (time terms, compute split, memory terms)."""
    lines = ["", "## Diagnosis data (generated)", "",
             "Per step, from `Estimate.breakdown` (seconds; dp = data-parallel collectives, total and the part "
             "not hidden behind backward). `meas/pred compute` = measured step / predicted compute+recompute "
             "time. `GEMM TFLOP/s` = the rate the cost model gives the block's GEMMs; `non-GEMM` = share of "
             "the block's predicted fwd+bwd time in memory-bound ops. MFU as the cost model counts it "
             "(measured: the source's).", "",
             "| run | hardware | measured step | predicted step | compute | recompute | tp comm | ep comm | "
             "bubble | dp total | dp exposed | meas/pred compute | GEMM TFLOP/s | non-GEMM | predicted MFU | "
             "measured MFU | fits |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in evaluated:
        b, c = r["breakdown_s"], r["compute_split_per_block"]
        mfu = r.get("measured_mfu")
        lines.append(
            f"| {r['id']} | {r['hardware']} | {r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | "
            f"{b['compute_s']:.3f} | {b['recompute_s']:.3f} | {b['tp_comm_s']:.3f} | {b['ep_comm_s']:.3f} | "
            f"{b['pipeline_bubble_s']:.3f} | {b['dp_comm_total_s']:.3f} | {b['dp_comm_exposed_s']:.3f} | "
            f"{r['measured_step_over_predicted_compute']:.2f} | {c.get('gemm_tflops', '')} | "
            f"{c.get('other_share', '')} | {r['predicted_mfu']:.3f} | {'' if mfu is None else mfu} | "
            f"{'yes' if r['fits_profile_memory'] else 'NO'} |")
    what_if = [r for r in evaluated if "gemm_max_what_if" in r]
    if what_if:
        keys = list(what_if[0]["gemm_max_what_if"])
        lines += ["", "Diagnosis only: throughput error of the same rows with the profile's `gemm_max` replaced "
                  f"(shipped h100-sxm: 0.80; {keys[0]} = the H200 profile's calibrated value; the last = a "
                  "sustained-training value). Not used in the validation above.", "",
                  "| run | shipped | " + " | ".join(f"gemm_max {k}" for k in keys) + " |",
                  "|---|---:|" + "---:|" * len(keys)]
        for r in what_if:
            lines.append(f"| {r['id']} | {r['throughput_error_pct']:+.1f}% | " +
                         " | ".join(f"{r['gemm_max_what_if'][k]:+.1f}%" for k in keys) + " |")
    lines += ["", "Predicted memory of the fullest stage (GiB) and, for torchtitan's per-op SAC, the other "
              "recompute modes the cost model has (throughput error / peak GiB):", "",
              "| run | measured peak | predicted | params | grads | optimizer | activations | working | buffers | "
              "allocator | op-SAC as selective | as every-2nd-block full | as full |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in evaluated:
        m = r["memory_breakdown_gib"]
        cells = {k: f"{a['throughput_error_pct']:+.1f}% / {a['peak_gib']:.1f}"
                 for k, a in r.get("op_sac_alternatives", {}).items()}
        lines.append(f"| {r['id']} | {r.get('measured_peak_gib', '')} | {r['predicted_peak_gib']:.1f} | "
                     f"{m['params']:.1f} | {m['grads']:.1f} | {m['optimizer']:.1f} | {m['activations']:.1f} | "
                     f"{m['working']:.1f} | {m['buffers']:.1f} | {m['allocator']:.1f} | {cells.get('selective', '')} | "
                     f"{cells.get('layer_sac_2', '')} | {cells.get('full', '')} |")
    return lines


def write_doc(runs: list[dict], evaluated: list[dict], skipped: list[dict], summary: dict) -> None:
    by_id = {r["id"]: r for r in runs}
    s = summary
    lines = [
        "# Cost-model validation on published runs (held out from every fit)", "",
        f"Command: `{COMMAND}` (about 1.5 minutes on 2 CPU cores). Data: `benchmarks/data/published_runs.yaml` "
        "(every number with its source; unstated values listed per row as `inferred`). Raw pairs and "
        "breakdowns: `benchmarks/results/published_validation.json`.", "",
        "Profiles as shipped, no per-row settings: framework-wide runtime facts come from one table, "
        "`FRAMEWORK_RUNTIME` in the script (overlap of the gradient reduction, parameter and reduction "
        "dtypes, sequence parallelism with TP, whether FSDP reshards its blocks under a pipeline, and the "
        "framework's RuntimeVariant: its per-op checkpointing's saved set, whether it compiles the loss, which "
        "SDPA kernel its torch ran, whether its TP collectives run beside the GEMMs). Throughput is compared in tokens/s per GPU; rows that publish only TFLOP/s "
        "are converted with the source's FLOP convention (stated per row). Error = predicted / measured - 1 "
        "(positive: the model predicts faster than measured, or more memory than measured). Profiles and "
        f"cost model as of commit {frozen_at()} (last change to hardware_profiles/ or cost_models/).", "",
        f"**Throughput: mean absolute error {s['all']['throughput_mae_pct']}% over {s['all']['rows']} rows** "
        f"(target <= 15%). **Peak memory: mean absolute error {s['all']['memory_mae_pct']}%** over the "
        f"{sum('memory_error_pct' in r for r in evaluated)} rows that report it (target: each within +-15%).", "",
        "| group | rows | throughput MAE | memory MAE |", "|---|---:|---:|---:|"]
    for key in [k for k in s if k != "all"]:
        g = s[key]
        mem = g.get("memory_mae_pct")
        lines.append(f"| {key} | {g['rows']} | {g['throughput_mae_pct']}% | {'' if mem is None else f'{mem}%'} |")
    lines += ["", "## Per run", "",
              "| run | framework | hardware | GPUs | model | layout | measured tok/s/GPU | predicted | error | "
              "measured peak GiB | predicted peak GiB | mem error | source |",
              "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in evaluated:
        src = by_id[r["id"]]["source"]
        meas = f"{r['measured_tokens_per_s_per_gpu']:,.0f}"
        if r["metric"] == "tflops_per_gpu":
            meas += f" ({r['measured_tflops_per_gpu']} TFLOP/s)"
        pred = f"{r['predicted_tokens_per_s_per_gpu']:,.0f}"
        if "predicted_tflops_per_gpu" in r:
            pred += f" ({r['predicted_tflops_per_gpu']} TFLOP/s)"
        lines.append(
            f"| {r['id']} | {r['framework']} | {r['hardware']} | {r['gpus']} | {r['model']} | {r['layout']} | "
            f"{meas} | {pred} | {r['throughput_error_pct']:+.1f}% | {r.get('measured_peak_gib', '')} | "
            f"{r['predicted_peak_gib']:.1f}{'' if r['fits_profile_memory'] else ' (no fit)'} | "
            f"{_fmt_err(r.get('memory_error_pct'))} | [{src['where']}]({src['url']}) |")
    lines += ["", "## Skipped (collected, not expressible yet)", "",
              "| run | framework | reason | measured | source |", "|---|---|---|---|---|"]
    for r in skipped:
        src = by_id[r["id"]]["source"]
        meas = ", ".join(f"{k} {v}" for k, v in r["measured"].items())
        lines.append(f"| {r['id']} | {r['framework']} | {r['reason']} | {meas} | [{src['where']}]({src['url']}) |")
    lines += ["", "## Framework runtime table (the only non-row inputs)", "",
              "| framework | family | overlap grad sync | params | grad reduce | SP with TP | per-op SAC policy | "
              "loss compiled | attention kernel | TP overlapped | FSDP reshards under PP | what it stands for |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, v in FRAMEWORK_RUNTIME.items():
        lines.append(f"| {k} | {v.family} | {v.overlap_grad_sync} | {v.param_dtype} | {v.grad_reduce_dtype} | "
                     f"{v.sequence_parallel} | {v.variant.op_sac} | {v.variant.compiles_loss} | {v.variant.attention} | "
                     f"{v.variant.tp_comm_overlap} | {v.fsdp_reshards_under_pp} | {v.note} |")
    lines += diagnosis_tables(evaluated)
    if DIAGNOSIS.exists():
        lines += ["", DIAGNOSIS.read_text().rstrip()]
    DOC.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
