"""Human-readable and JSON views of estimates, plans and comparisons."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from autoparallel.errors import UserError
from autoparallel.plan import Plan
from cost_models.estimate import Estimate

BAR = 24


def _bar(used: float, total: float) -> str:
    fill = min(BAR, round(BAR * used / total)) if total > 0 else 0
    return "█" * fill + "░" * (BAR - fill) + (" !" if used > total else "")


def _mesh_line(plan: Plan) -> str:
    span = plan.mesh_span()
    where = {"intra": "inside node", "inter": "across nodes"}
    return "  ".join(f"{d}={plan.mesh_shape[d]} ({where[span[d]]})" for d in ("pp", "dp", "cp", "ep", "tp")
                     if plan.mesh_shape[d] > 1 or d == "dp")


def _recompute_line(plan: Plan) -> str:
    c = Counter(plan.recompute)
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items())) or "none"


def format_estimate(plan: Plan, est: Estimate) -> str:
    lines = [
        f"model     {plan.model}  on {plan.gpus} x {plan.hardware} ({plan.gpus_per_node} per node)",
        f"mesh      {_mesh_line(plan)}",
        f"batch     global {plan.global_batch} x seq {plan.seq_len}; micro-batch {plan.micro_batch} x "
        f"{plan.num_micro_batches} per rank; schedule {plan.schedule}"
        + (f" (vpp={plan.vpp})" if plan.vpp > 1 else ""),
        f"options   ZeRO-{plan.zero}, sequence parallel {'on' if plan.sequence_parallel else 'off'}, grads "
        f"{plan.grad_reduce_dtype}, recompute {_recompute_line(plan)}, {'compiled' if plan.compile else 'eager'}"
        + (f", fp8 {', '.join(f'{k} x{v}' for k, v in sorted(Counter(plan.fp8).items()))}"
           if any(r != "none" for r in plan.fp8) else ""),
    ]
    if plan.stage_layers and plan.pp > 1:
        lines.append(f"stages    blocks per virtual stage: {' '.join(map(str, plan.stage_layers))}")
    lines.append("memory per pipeline stage (GiB)")
    for i, (tot, parts) in enumerate(zip(est.memory_per_stage_gib, est.memory_breakdown_gib)):
        detail = ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if v >= 0.05)
        lines.append(f"  stage {i:<3d} {_bar(tot, est.budget_gib)} {tot:7.1f} / {est.budget_gib:.1f}  ({detail})")
    b = est.breakdown
    lines.append(f"step time {est.step_time_s:.4g} s  = " + " + ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.3g}" for k, v in b.items()
        if k != "dp_comm_total_s" and v > 0))
    lines.append(f"throughput {est.tokens_per_s:,.0f} tokens/s;  {est.model_tflops_per_gpu:.1f} model TFLOP/s per GPU "
                 f"({est.hardware_tflops_per_gpu:.1f} hardware, counting recompute);  MFU {est.mfu * 100:.1f}%")
    lines.append(f"fits      {'yes' if est.fits else 'NO'}: peak {est.peak_memory_gib:.1f} GiB of {est.budget_gib:.1f}")
    return "\n".join(lines)


def _undone(cost_model: Any, plan: Plan, budget_bytes: float | None = None) -> dict[str, Estimate]:
    """The plan with each of its execution choices undone (fp8 -> bf16 linears, int8 -> fp32 gradient reduction,
    torch.compile -> eager, context parallelism -> its ranks as data parallelism, each holding whole sequences,
    the zero-bubble pipeline schedule -> 1F1B / interleaved 1F1B), estimated; a choice whose undoing is no valid
    plan (the batch does not split over the wider dp) is left out. `budget_bytes`: the budget their `fits` read
    (default: the device's usable memory)."""
    undo = {"fp8": {"fp8": ()}, "int8 grads": {"grad_reduce_dtype": "fp32"}, "compile": {"compile": False},
            "cp": {"cp": 1, "dp": plan.dp * plan.cp}, "zero-bubble": {"pipeline_schedule": ""}}
    active = {"fp8": any(r != "none" for r in plan.fp8), "int8 grads": plan.grad_reduce_dtype == "int8",
              "compile": plan.compile, "cp": plan.cp > 1,
              "zero-bubble": getattr(plan, "pipeline_schedule", "") == "zero_bubble"}
    out: dict[str, Estimate] = {}
    for name, kw in undo.items():
        if active[name]:
            try:
                out[name] = cost_model.estimate(replace(plan, **kw), budget_bytes)
            except UserError:
                continue
    return out


def choice_gains(cost_model: Any, plan: Plan, est: Estimate,
                 undone: dict[str, Estimate] | None = None) -> dict[str, float]:
    """What each execution choice of the plan bought: the relative step-time change against the same
    plan with that choice undone (`_undone`, or `undone` where the caller has them), e.g. {"fp8": -0.22}. Empty for
    a plan without them."""
    out: dict[str, float] = {}
    for name, base in (_undone(cost_model, plan) if undone is None else undone).items():
        gain = est.step_time_s / base.step_time_s - 1.0
        if abs(gain) >= 0.005:  # a choice the profile cannot price (no compiled fraction) bought nothing to show
            out[name] = gain
    return out


def choices_to_fit(undone: dict[str, Estimate]) -> dict[str, float]:
    """The choices without which the plan would not fit its budget (`undone`: `_undone` under the plan's budget),
    with the undone plan's peak [GiB]: a choice that costs step time (context parallelism often does) was bought
    for its memory, which its gain alone hides."""
    return {name: base.peak_memory_gib for name, base in undone.items() if not base.fits}


def _gains_line(gains: dict[str, float], to_fit: dict[str, float] | None = None) -> str:
    to_fit = to_fit or {}
    return ", ".join(f"{k}: {v * 100:+.0f}% step time"
                     + (f" and fitting ({to_fit[k]:.1f} GiB without it)" if k in to_fit else "")
                     for k, v in gains.items())


def format_plan_result(result: Any, ctx: Any) -> str:
    s = result.solver
    head = [f"autoparallel plan: {ctx.model_name} on {ctx.cluster}, budget {ctx.budget_bytes / 2**30:.1f} GiB/device",
            f"solver    {s.status} in {s.wall_s:.2f} s ({s.configs_solved} of {s.configs_total} mesh configurations "
            f"solved, the rest pruned by bound); objective {s.objective:.4g} s, bound {s.bound:.4g} s", ""]
    body = format_estimate(result.plan, result.estimate)
    undone = _undone(ctx.cost_model, result.plan, ctx.budget_bytes)
    gains = choice_gains(ctx.cost_model, result.plan, result.estimate, undone)
    if gains:
        body += f"\nbought    {_gains_line(gains, choices_to_fit(undone))} (against the same plan without it)"
    tail = []
    if result.runners_up:
        tail = ["", "runners-up (why each lost)"]
        for i, c in enumerate(result.runners_up, 2):
            p = c.plan
            desc = f"dp{p.dp} tp{p.tp} pp{p.pp}" + (f" cp{p.cp}" if p.cp > 1 else "") + (f" ep{p.ep}" if p.ep > 1 else "") + \
                (f" vpp{p.vpp}" if p.vpp > 1 else "") + f" mb{p.micro_batch} zero{p.zero}" + \
                (" sp" if p.sequence_parallel else "") + f" recompute {_recompute_line(p)}"
            tail.append(f"  {i}. {desc:60s} {c.estimate.step_time_s:.4g} s  ({c.why})")
    # what the trace could not see (a module-level trace prices only the ops before the data-dependent one): the
    # numbers above rest on it, so the report carries it, whether the graph came from the trace or its cache
    notes = [f"warning   {w}" for w in ctx.graph.warnings]
    return "\n".join(head) + body + "\n".join(tail) + ("\n\n" + "\n".join(notes) if notes else "")


def plan_json(result: Any, ctx: Any) -> dict[str, Any]:
    """Same keys as `estimate --json` plus the solver record, runners-up and the trace's warnings."""
    return {
        "plan": result.plan.to_dict(),
        "predicted": result.estimate.to_dict(),
        "solver": result.solver.to_dict(),
        "runners_up": [{"plan": c.plan.to_dict(), "step_time_s": c.estimate.step_time_s, "why": c.why}
                       for c in result.runners_up],
        "warnings": list(ctx.graph.warnings),
    }


def explain_op(ctx: Any, plan: Plan, op_path: str) -> str:
    """What placement the plan gives one parametric op, and the block cost under each legal choice."""
    graph = ctx.graph
    if op_path not in graph.parametric_ops:
        import difflib
        close = difflib.get_close_matches(op_path, list(graph.parametric_ops), n=3)
        raise UserError(f"--explain {op_path!r}: not a parametric op of the model"
                        + (f"; did you mean {', '.join(close)}?" if close else ""))
    from autoparallel.sharding import explain_choices
    return explain_choices(ctx, plan, op_path)


# ---- compare ---------------------------------------------------------------------------------------------
def _row(r: Any, tokens: float | None) -> dict[str, Any]:
    res = r.result
    if res.plan is None:
        return {"hardware": r.hardware, "feasible": False, "explanation": res.explanation}
    e, p = res.estimate, res.plan
    out = {"hardware": r.hardware, "feasible": True,
           "plan": f"dp{p.dp} tp{p.tp} pp{p.pp}" + (f" ep{p.ep}" if p.ep > 1 else "") +
                   f" mb{p.micro_batch} zero{p.zero}",
           "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
           "peak_memory_gib": e.peak_memory_gib, "breakdown": e.breakdown}
    undone = _undone(r.context.cost_model, p, r.context.budget_bytes)
    gains = choice_gains(r.context.cost_model, p, e, undone)
    if gains:
        out["choice_gains"] = gains
        to_fit = choices_to_fit(undone)
        if to_fit:
            out["choices_to_fit"] = to_fit  # choice -> peak GiB of the plan without it
    out["precision"] = getattr(r, "precision", "bf16")
    if tokens:
        out["time_to_train_days"] = tokens / e.tokens_per_s / 86400
    return out


def compare_json(rows: list[Any], tokens: float | None) -> list[dict[str, Any]]:
    return [_row(r, tokens) for r in rows]


def format_compare(rows: list[Any], tokens: float | None, asked: str = "bf16") -> str:
    """One row per profile; `asked`: the --precision given (rows of devices without FP8 say they ran bf16)."""
    hdr = f"{'hardware':22s} {'plan':30s} {'step s':>9s} {'tokens/s':>12s} {'MFU':>6s} {'peak GiB':>9s}"
    hdr += f" {'days':>8s}" if tokens else ""
    lines = [hdr, "-" * len(hdr)]
    for d in compare_json(rows, tokens):
        if not d["feasible"]:
            lines.append(f"{d['hardware']:22s} INFEASIBLE: {d['explanation']}")
            continue
        line = (f"{d['hardware']:22s} {d['plan']:30s} {d['step_time_s']:9.4g} {d['tokens_per_s']:12,.0f} "
                f"{d['mfu'] * 100:5.1f}% {d['peak_memory_gib']:9.1f}")
        if tokens:
            line += f" {d['time_to_train_days']:8.2f}"
        notes = [_gains_line(d["choice_gains"], d.get("choices_to_fit"))] if d.get("choice_gains") else []
        if asked != "bf16" and d["precision"] == "bf16":
            notes.append("no fp8 peak: bf16")
        if notes:
            line += f"  ({'; '.join(notes)})"
        lines.append(line)
    return "\n".join(lines)


PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # formats matplotlib writes without extra backends


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a UserError saying how to install it (checked before
    planning by `compare --plot`)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'autoparallel[plot]'") from None
    return plt


def plot_compare(rows: list[Any], path: str) -> None:
    """Stacked bar chart of the step-time breakdown per profile (matplotlib, optional extra)."""
    plt = pyplot()
    data = [d for d in compare_json(rows, None) if d["feasible"]]
    keys = [k for k in (data[0]["breakdown"] if data else {}) if k != "dp_comm_total_s"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(data) + 2), 4.5))
    bottom = [0.0] * len(data)
    for k in keys:
        vals = [d["breakdown"][k] for d in data]
        ax.bar([d["hardware"] for d in data], vals, bottom=bottom, label=k.removesuffix("_s").replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds per step")
    ax.set_title("Step-time breakdown of each profile's best plan")
    ax.legend(fontsize=7)
    plt.xticks(rotation=30, ha="right")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise UserError(f"--plot {path}: cannot write ({e.strerror})") from None
    plt.close(fig)
