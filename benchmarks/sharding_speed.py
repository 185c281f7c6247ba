"""Sharding solver benchmark (issue 5): solve time on llama3-405b, and the solver's placements against
the fixed Megatron layout on every catalog model.

1. Speed. llama3-405b is traced once (outside the timed part; `autoparallel.api.trace_model` caches
   it); then a fresh ShardingSolver, with empty caches, solves every distinct block class plus the
   model's ends for tp in {1, 2, 4, 8}, with and without sequence parallelism. Timed: segment
   extraction from the graph, cost tables, building and solving each CP-SAT model. Target: < 2 s.
2. Quality. For every catalog model, at a fixed plan (gpus = tp, dp = pp = 1, one micro-batch of one
   sequence, no recompute) on h100-sxm, CostModel.estimate with the solver's placements against
   megatron_placements, for each tp in {2, 4, 8} the model's head counts allow, SP off and on.
   Target: solver <= Megatron everywhere.

    python benchmarks/sharding_speed.py                 # writes benchmarks/results/sharding_speed.json
                                                        # and docs/benchmarks_sharding.md
    python benchmarks/sharding_speed.py --no-catalog --no-write
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from autoparallel.api import context, make_cluster, trace_model
from autoparallel.placements import megatron_placements
from autoparallel.plan import Plan
from autoparallel.sharding import ENDS, ShardingSolver

ROOT = Path(__file__).resolve().parent.parent
TIME_LIMIT_S = 2.0
DEGREES = (1, 2, 4, 8)


def speed(model: str, seq_len: int, repeats: int) -> dict:
    t0 = time.perf_counter()
    graph = trace_model(model, seq_len=seq_len)
    trace_s = time.perf_counter() - t0
    cluster = make_cluster("h100-sxm", 8)
    runs, per_degree = [], {}
    for _ in range(repeats):
        solver = ShardingSolver(graph, cluster)          # fresh: nothing cached
        t0 = time.perf_counter()
        for tp in DEGREES:
            t1 = time.perf_counter()
            for sp in (False, True):
                solver.placements(tp, sp)
            per_degree.setdefault(tp, []).append(time.perf_counter() - t1)
        runs.append(time.perf_counter() - t0)
    solver = ShardingSolver(graph, cluster)
    layout = solver.placements(8, True)
    rep = solver.class_rep
    block = graph.blocks[0]
    return {
        "model": model, "seq_len": seq_len, "ops_traced": graph.g.number_of_nodes(), "blocks": len(graph.blocks),
        "block_classes": len(rep), "segments": len(rep) + 1, "trace_s": trace_s,
        "solve_s_runs": runs, "solve_s_median": statistics.median(runs), "solve_s_max": max(runs),
        "per_degree_s_median": {tp: statistics.median(v) for tp, v in per_degree.items()},
        "parametric_ops_per_block": sum(1 for op in graph.parametric_ops.values() if op.block == block),
        "placements_tp8_sp": {k[len(block) + 1:]: v for k, v in layout.items() if k.startswith(block + ".")},
        "within_target": max(runs) < TIME_LIMIT_S,
    }


def catalog_names() -> list[str]:
    path = ROOT / "autoparallel" / "catalog" / "models.yaml"
    return list(yaml.safe_load(path.read_text()))


def quality(names: list[str], seq_len: int) -> list[dict]:
    rows = []
    for name in names:
        graph = trace_model(name, seq_len=seq_len)
        for tp in (2, 4, 8):
            ctx = context(name, "h100-sxm", tp, seq_len, graph=graph)
            heads, kv = ctx.cost_model.heads, ctx.cost_model.kv_heads
            if (heads and heads % tp) or (kv and kv % tp):
                continue
            solver = ShardingSolver(graph, ctx.cluster)
            for sp in (False, True):
                plan = Plan(model=name, hardware="h100-sxm", gpus=tp, gpus_per_node=8, global_batch=1,
                            seq_len=seq_len, tp=tp, sequence_parallel=sp, recompute=("none",) * len(graph.blocks))
                ours_pl, meg_pl = solver.placements(tp, sp), megatron_placements(graph, sp)
                ours = ctx.cost_model.estimate(replace(plan, placements=ours_pl)).step_time_s
                meg = ctx.cost_model.estimate(replace(plan, placements=meg_pl)).step_time_s
                diff = sorted({_generic(k, graph): (ours_pl[k], meg_pl[k]) for k in ours_pl
                               if ours_pl[k] != meg_pl.get(k)}.items())
                rows.append({"model": name, "tp": tp, "sp": sp, "solver_step_s": ours, "megatron_step_s": meg,
                             "ratio": ours / meg, "ok": ours <= meg * (1 + 1e-9),
                             "differences": [f"{k}: {a} (Megatron rule: {b})" for k, (a, b) in diff]})
                print(f"{name:16s} tp{tp} sp{int(sp)}  solver {ours * 1e3:10.3f} ms  megatron {meg * 1e3:10.3f} ms"
                      f"  ratio {ours / meg:.4f}", file=sys.stderr, flush=True)
    return rows


def _generic(path: str, graph) -> str:
    """layers.7.mlp.up_proj -> layers.*.mlp.up_proj (blocks of a class share placements)."""
    op = graph.parametric_ops[path]
    if op.block is None:
        return path
    prefix = op.block.rsplit(".", 1)[0] if "." in op.block else op.block
    return f"{prefix}.*{path[len(op.block):]}"


def write_markdown(result: dict) -> str:
    s = result["speed"]
    lines = [
        "# Sharding solver benchmark",
        "",
        "Command: `python benchmarks/sharding_speed.py`",
        "",
        f"Machine: {result['machine']}.",
        "",
        "## Solve time (target: all distinct blocks of llama3-405b for tp in {1, 2, 4, 8} under 2 s)",
        "",
        f"{s['model']} at seq_len {s['seq_len']}: {s['ops_traced']:,} traced ops, {s['blocks']} blocks in "
        f"{s['block_classes']} class(es), so {s['segments']} placement problems per (tp, SP) setting (the block "
        f"class and the model's ends: embeddings, final norm, LM head), {s['parametric_ops_per_block']} "
        f"parametric ops per block.",
        "",
        f"The graph is traced once before timing (trace {s['trace_s']:.1f} s, cached by "
        "`autoparallel.api.trace_model`, not included). Each timed run starts from a fresh `ShardingSolver` "
        "(empty caches) and solves tp = 1, 2, 4, 8, each with sequence parallelism off and on: 16 problems, "
        "including extracting the segments from the graph, the per-op cost tables and the CP-SAT solves.",
        "",
        "| runs | median s | max s | tp=1 s | tp=2 s | tp=4 s | tp=8 s | under 2 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {len(s['solve_s_runs'])} | {s['solve_s_median']:.3f} | {s['solve_s_max']:.3f} | "
        + " | ".join(f"{s['per_degree_s_median'][tp]:.3f}" for tp in DEGREES)
        + f" | {'yes' if s['within_target'] else 'NO'} |",
        "",
        "Block layout found at tp=8 with sequence parallelism: "
        + ", ".join(f"`{k}` {v}" for k, v in s["placements_tp8_sp"].items()) + ".",
    ]
    rows = result.get("catalog")
    if rows:
        ok = all(r["ok"] for r in rows)
        lines += [
            "",
            "## Solver placements vs the fixed Megatron layout, every catalog model",
            "",
            f"Fixed plan per row: h100-sxm, gpus = tp, dp = pp = 1, one micro-batch of one sequence of "
            f"{result['catalog_seq_len']} tokens, no recompute; `CostModel.estimate` (the planner's objective) "
            "with `ShardingSolver.placements(tp, sp)` against `megatron_placements(graph, sp)`. tp values the "
            "model's (key/value) head counts do not divide are skipped (the CostModel rejects them). "
            f"Solver <= Megatron on every row: **{'yes' if ok else 'NO'}** ({len(rows)} rows).",
            "",
            "| model | tp | SP | solver step ms | Megatron step ms | ratio | where the layouts differ |",
            "|---|---:|---|---:|---:|---:|---|",
        ]
        for r in rows:
            lines.append(f"| {r['model']} | {r['tp']} | {'on' if r['sp'] else 'off'} | {r['solver_step_s'] * 1e3:.3f} | "
                         f"{r['megatron_step_s'] * 1e3:.3f} | {r['ratio']:.4f} | "
                         f"{'; '.join(r['differences']) or 'identical'} |")
        where: dict[str, set[str]] = {}
        for r in rows:
            for d in r["differences"]:
                where.setdefault(d, set()).add(r["model"])
        lines += ["", "Distinct differences from the Megatron rule over all rows (op: solver (rule): models):", ""]
        lines += [f"- `{d.split(':')[0]}`:{d.split(':', 1)[1]}: {', '.join(sorted(ms))}"
                  for d, ms in sorted(where.items())] or ["- none"]
        lines += ["", "Reading them: the Megatron rule makes a Linear colwise only when it feeds another Linear, so "
                  "it replicates q_proj/k_proj of qk-norm models (they feed a norm) while the solver shards them "
                  "by heads; at width 64 (tiny-*) an all-reduce's latency exceeds the GEMM time sharding saves, "
                  "so the solver keeps those models whole at every degree."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--catalog-seq-len", type=int, default=1024)
    ap.add_argument("--no-catalog", action="store_true", help="skip the catalog comparison (slow: traces 24 models)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--markdown-only", action="store_true",
                    help="rewrite docs/benchmarks_sharding.md from benchmarks/results/sharding_speed.json")
    args = ap.parse_args()
    if args.markdown_only:
        result = json.loads((ROOT / "benchmarks" / "results" / "sharding_speed.json").read_text())
        result["speed"]["per_degree_s_median"] = {int(k): v for k, v in result["speed"]["per_degree_s_median"].items()}
        (ROOT / "docs" / "benchmarks_sharding.md").write_text(write_markdown(result))
        return
    result = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} CPU threads, Python {platform.python_version()}, "
                   f"torch {torch.__version__}",
        "speed": speed(args.model, args.seq_len, args.repeats),
        "segment_name_of_ends": ENDS,
    }
    print(json.dumps(result["speed"], indent=2))
    if not args.no_catalog:
        result["catalog_seq_len"] = args.catalog_seq_len
        result["catalog"] = quality(catalog_names(), args.catalog_seq_len)
        bad = [r for r in result["catalog"] if not r["ok"]]
        print(f"catalog rows: {len(result['catalog'])}, solver slower than Megatron on {len(bad)}")
    if not args.no_write:
        (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
        (ROOT / "benchmarks" / "results" / "sharding_speed.json").write_text(json.dumps(result, indent=2) + "\n")
        (ROOT / "docs" / "benchmarks_sharding.md").write_text(write_markdown(result))


if __name__ == "__main__":
    main()
