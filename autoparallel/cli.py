"""`autoparallel` command line: trace, estimate, plan, compare, profiles, calibrate.

Every bad input surfaces as one `error: ...` line on stderr and exit code 2 (UserError); output
that is data (`--json`) goes to stdout alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from autoparallel.errors import UserError
from autoparallel.limits import MAX_TOKENS, check_number, check_output_path
from autoparallel.plan import RECOMPUTE_MODES

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # noqa: D401
        raise UserError(f"{self.prog}: {message} (see --help)")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="catalog name (llama3-8b), HF config.json / YAML path, or package.module:callable")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048; estimate "
                   "--plan: the plan's)")


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", required=True, help="profile name (see `autoparallel profiles list`) or YAML path")
    p.add_argument("--gpus", type=int, required=True, help="number of devices")
    p.add_argument("--gpus-per-node", type=int, default=None, help="override the profile's devices per node")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--max-memory-per-gpu", default=None, help="memory budget, e.g. 80GB (default: the device's usable)")


def _add_run_flags(p: argparse.ArgumentParser, cache: bool = True) -> None:
    """--quiet, and --no-cache for commands that trace."""
    p.add_argument("--quiet", action="store_true", help="no progress on stderr (--json is quiet too)")
    if cache:
        p.add_argument("--no-cache", action="store_true",
                       help="trace again instead of reading the trace cache ($AUTOPARALLEL_CACHE_DIR, "
                            "default ~/.cache/autoparallel)")


def _add_padded(p: argparse.ArgumentParser) -> None:
    p.add_argument("--padded", action="store_true",
                   help="batches with padding (an attention mask): a Hugging Face model's attention then runs a "
                        "masked kernel, which computes every score; price that")


def _add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", default=None, choices=["bf16", "fp8", "fp8-tensorwise", "fp8-rowwise"],
                   help="linear layers of the blocks in bf16 (default) or FP8 (torchao float8 training; fp8 = "
                        "tensorwise scaling): FP8 only when asked")


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clip-grad-norm", action="store_true",
                   help="the trainer clips the gradients' global norm (AutoParallelTrainer(max_grad_norm=...), "
                        "torchtitan's default): price its pass over the gradients each step")


def _variant(args: argparse.Namespace) -> Any:
    from cost_models.estimate import RuntimeVariant
    return RuntimeVariant(clip_grad_norm=args.clip_grad_norm)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="autoparallel", description="Automatic parallel-strategy planner for PyTorch.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("trace", help="trace a model on the meta device: parameters, FLOPs, activations")
    _add_model_args(t)
    t.add_argument("--batch", type=int, default=None,
                   help="samples traced (default 2, what plan and estimate trace and cache)")
    t.add_argument("--json", action="store_true")
    _add_run_flags(t)

    e = sub.add_parser("estimate", help="predict step time, throughput and memory of one plan")
    _add_model_args(e)
    _add_cluster_args(e)
    e.add_argument("--plan", default=None, help="a plan file from `autoparallel plan --output`")
    e.add_argument("--tp", type=int, default=None)
    e.add_argument("--pp", type=int, default=None)
    e.add_argument("--ep", type=int, default=None)
    e.add_argument("--cp", type=int, default=None, help="context parallel ranks per sequence (ring attention)")
    e.add_argument("--vpp", type=int, default=None)
    e.add_argument("--micro-batch", type=int, default=None)
    e.add_argument("--recompute", default=None, choices=list(RECOMPUTE_MODES))
    e.add_argument("--zero", type=int, default=None, choices=[0, 1, 2, 3])
    e.add_argument("--sequence-parallel", action="store_true")
    e.add_argument("--grad-reduce-dtype", default=None, choices=["fp32", "bf16", "int8"],
                   help="gradient reduction dtype (int8: block-scaled, fp32 accumulation; needs --zero >= 1)")
    _add_precision(e)
    _add_padded(e)
    _add_runtime(e)
    e.add_argument("--compile", action="store_true", help="price torch.compile per block (the plan's compile)")
    e.add_argument("--schedule", default=None, choices=["1f1b", "zero_bubble"],
                   help="pipeline schedule (1f1b: 1F1B, interleaved with --vpp; zero_bubble: torch's "
                        "ScheduleInterleavedZeroBubble, eager)")
    e.add_argument("--json", action="store_true")
    e.add_argument("--no-cache", action="store_true", help="trace again instead of reading the trace cache")

    p = sub.add_parser("plan", help="find the fastest plan that fits (dry run)")
    _add_model_args(p)
    _add_cluster_args(p)
    p.add_argument("--fix", action="append", default=None,
                   help="pins, e.g. tp=8,pp=4,zero=1,recompute=full,compile=1,schedule=zero_bubble (repeatable)")
    p.add_argument("--top", type=int, default=3, help="runner-up plans to show")
    _add_precision(p)
    _add_padded(p)
    _add_runtime(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--output", default=None, help="write the plan to this file (.yaml or .json)")
    p.add_argument("--explain", default=None, metavar="OP_PATH", help="show the placement choices for one op")
    _add_run_flags(p)

    c = sub.add_parser("compare", help="plan one model on several hardware profiles")
    _add_model_args(c)
    c.add_argument("--hardware", required=True, help="comma-separated profile names or paths")
    c.add_argument("--gpus", type=int, required=True)
    c.add_argument("--gpus-per-node", type=int, default=None)
    c.add_argument("--global-batch", type=int, required=True)
    c.add_argument("--max-memory-per-gpu", default=None)
    c.add_argument("--fix", action="append", default=None, help="pins, as plan's (repeatable)")
    _add_precision(c)
    _add_padded(c)
    _add_runtime(c)
    c.add_argument("--tokens", type=float, default=None, help="tokens to train, for time-to-train")
    c.add_argument("--plot", default=None, help="write a step-time breakdown bar chart (PNG)")
    c.add_argument("--json", action="store_true")
    _add_run_flags(c)

    pr = sub.add_parser("profiles", help="hardware profiles: list | show NAME | validate FILE")
    prs = pr.add_subparsers(dest="action", required=True, parser_class=_Parser)
    prs.add_parser("list")
    s = prs.add_parser("show")
    s.add_argument("name")
    v = prs.add_parser("validate")
    v.add_argument("file")

    cal = sub.add_parser("calibrate", help="measure the local accelerator and write a calibrated profile")
    cal.add_argument("--base", default=None, help="profile to start from (default: detected)")
    cal.add_argument("--output", default="calibrated.yaml")
    cal.add_argument("--quick", action="store_true", help="fewer shapes, for a smoke test")
    cal.add_argument("--from-measurements", default=None, metavar="JSON",
                     help="refit a saved .measurements.json (no accelerator needed) instead of measuring")
    cal.add_argument("--trainer", action="store_true",
                     help="fit the trainer's host terms from AutoParallelTrainer's own steps on small probes "
                          "(with --raw: measure here; with --fit: fit measured probes into --output)")
    cal.add_argument("--raw", default=None, metavar="JSONL", help="--trainer: append the probes measured here")
    cal.add_argument("--fit", nargs="+", default=None, metavar="JSONL", help="--trainer: probe files to fit")
    cal.add_argument("--rescale", action="store_true",
                     help="--trainer: time three one-GPU probes here (under a minute) and scale --base's fitted "
                          "host terms by one factor to this machine's CPU, instead of refitting them all "
                          "(with --fit: from probes measured before)")
    return ap


# ---- commands -------------------------------------------------------------------------------------------
def _seq_len(args: argparse.Namespace) -> int:
    from autoparallel.api import DEFAULT_SEQ_LEN
    return DEFAULT_SEQ_LEN if args.seq_len is None else args.seq_len


# Progress goes to stderr once the cheap inputs (model reference, hardware, budget) are checked, so bad
# input stays one `error:` line; the stages load lazily (torch only when a trace is not cached).
def _progress(args: argparse.Namespace):
    from autoparallel.api import Progress
    return Progress(enabled=not (args.quiet or getattr(args, "json", False)))


def cmd_trace(args: argparse.Namespace) -> int:
    from autoparallel.api import trace_model
    graph = trace_model(args.model, batch=args.batch, seq_len=_seq_len(args), cache=not args.no_cache,
                        progress=_progress(args))
    if args.json:
        print(json.dumps(graph.summary(), indent=2))
    else:
        print(graph.format_table())
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from autoparallel.api import ESTIMATE_DEFAULTS, estimate_plan
    from autoparallel.report import format_estimate
    if args.plan is not None and not args.plan.strip():
        raise UserError("--plan: empty path; pass a file written by `autoparallel plan --output FILE`")
    options = {k: getattr(args, k) for k in ESTIMATE_DEFAULTS}
    est, plan = estimate_plan(
        args.model, hardware=args.hardware, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
        global_batch=args.global_batch, seq_len=args.seq_len, max_memory_per_gpu=args.max_memory_per_gpu,
        plan_file=args.plan, cache=not args.no_cache, padded=args.padded, variant=_variant(args), **options)
    if args.json:
        print(json.dumps({"plan": plan.to_dict(), "predicted": est.to_dict()}, indent=2))
    else:
        print(format_estimate(plan, est))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from autoparallel.api import plan_result
    from autoparallel.report import format_plan_result, plan_json
    if args.output is not None:  # checked before planning: a bad path must not cost the whole computation
        check_output_path(args.output, "--output", inputs=(args.model,))
    if args.explain is not None and not args.explain.strip():
        raise UserError("--explain: empty op name; pass a module path such as layers.0.attn.q_proj")
    result, ctx = plan_result(
        args.model, hardware=args.hardware, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
        global_batch=args.global_batch, seq_len=_seq_len(args), max_memory_per_gpu=args.max_memory_per_gpu,
        fix=_fix(args), top_k=args.top, progress=_progress(args), cache=not args.no_cache,
        precision=args.precision or "bf16", padded=args.padded, variant=_variant(args))
    if result.plan is None:
        raise UserError(f"INFEASIBLE: {result.explanation}")
    explained = None
    if args.explain:  # before anything is written or printed: an unknown op is one error, not half an output
        from autoparallel.report import explain_op
        explained = explain_op(ctx, result.plan, args.explain)
    if args.output is not None:
        result.plan.save(args.output)
    if args.json:  # one JSON document, the explanation a field of it
        print(json.dumps(plan_json(result, ctx) | ({"explain": explained} if explained is not None else {}), indent=2))
    else:
        print(format_plan_result(result, ctx))
        if (args.precision or "bf16") != "bf16" and not any(r != "none" for r in result.plan.fp8):
            print(f"note      --precision {args.precision}: no block runs faster in FP8 under this plan (the casts "
                  f"cost more than the GEMMs save{'; eager casts are unfused: try --fix compile=1' if not result.plan.compile else ''}), "
                  f"so it keeps bf16")
        if args.output is not None:
            print(f"plan written to {args.output}")
        if explained is not None:
            print(explained)
    return 0


def _fix(args: argparse.Namespace) -> str | None:
    """The --fix flags as one pin list: repeated flags add pins (`--fix tp=2 --fix pp=2`), and a pin given in two
    of them is the error parse_fix gives for one given twice, not a silent last-one-wins."""
    return ",".join(args.fix) if args.fix else None


def cmd_compare(args: argparse.Namespace) -> int:
    hardware = [h.strip() for h in args.hardware.split(",") if h.strip()]
    repeated = sorted({h for h in hardware if hardware.count(h) > 1})
    if repeated:  # one row per accelerator: a repeat would print the same row twice
        raise UserError(f"--hardware lists {', '.join(repeated)} more than once; name each accelerator once")
    from autoparallel.api import compare
    from autoparallel.report import PLOT_SUFFIXES, compare_json, format_compare, plot_compare, pyplot
    if args.tokens is not None:
        check_number(args.tokens, "--tokens", 0, MAX_TOKENS, "pass the tokens to train, e.g. 1e12")
    if args.plot is not None:
        check_output_path(args.plot, "--plot", PLOT_SUFFIXES)
        pyplot()
    rows = compare(args.model, hardware=hardware,
                   gpus=args.gpus, gpus_per_node=args.gpus_per_node, global_batch=args.global_batch,
                   seq_len=_seq_len(args), max_memory_per_gpu=args.max_memory_per_gpu, fix=_fix(args),
                   cache=not args.no_cache, progress=_progress(args), precision=args.precision or "bf16",
                   padded=args.padded, variant=_variant(args))
    if args.json:
        print(json.dumps(compare_json(rows, args.tokens), indent=2))
    else:
        print(format_compare(rows, args.tokens, args.precision or "bf16"))
    if args.plot is not None:
        plot_compare(rows, args.plot)
        if not args.json:
            print(f"chart written to {args.plot}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from hardware_profiles import format_profile, list_profiles, load_profile, validate_profile_file
    if args.action == "list":
        for name in list_profiles():
            p = load_profile(name)
            print(f"{name:24s} {p.vendor:14s} {p.model:32s} bf16 {p.peak('bf16') / 1e12:7.0f} TFLOPS  "
                  f"{p.memory_bytes / 1e9:5.0f} GB  confidence {p.confidence}")
    elif args.action == "show":
        print(format_profile(load_profile(args.name)))
    else:
        p = validate_profile_file(args.file)
        print(f"{args.file}: valid profile {p.name} ({p.vendor} {p.model})")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.trainer or args.raw or args.fit or args.rescale:
        if not args.trainer:
            raise UserError("calibrate: --raw, --fit and --rescale belong to --trainer; add --trainer")
        from autoparallel.calibrate_trainer import run_trainer_calibration
        if args.fit or args.rescale:
            check_output_path(args.output, "--output", inputs=(*(args.fit or ()), args.raw, args.base))
        if args.raw and not args.fit:
            check_output_path(args.raw, "--raw")
        return run_trainer_calibration(args.base, args.output, args.raw, args.fit, rescale=args.rescale)
    from autoparallel.calibrate import run_calibration
    check_output_path(args.output, "--output")  # before minutes of measuring
    run_calibration(base=args.base, output=args.output, quick=args.quick, measurements=args.from_measurements)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "trace": cmd_trace, "estimate": cmd_estimate, "plan": cmd_plan, "compare": cmd_compare,
    "profiles": cmd_profiles, "calibrate": cmd_calibrate,
}


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """A warning as one `warning:` line on stderr, without the source line Python echoes after it."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            return COMMANDS[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. piped into `head`): not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
