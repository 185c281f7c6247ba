"""A profiled trainer step's device time per aten op against the cost model's per-op kernel times for the same
plan (CPU; diagnosis, no fit).

    python benchmarks/op_times.py --raw benchmarks/results/raw/trainer_sweep_families23a_s65.jsonl \
        --only 1g-moonlight-eager [--ops index_put,_index_put_impl_] [--top 30]

`measure --profile` records one step's `profile.ops` (aten op -> [calls, self device s, self host s]); this script
prices the configuration's plan op by op (`CostModel._phase_times` on each segment, every micro-batch and block
of a class) and lists both per op name, aten's overload suffix dropped. The names do not always pair: the
profiler files an out-of-place op's kernel under the in-place op it calls (`index_put` under `_index_put_impl_`,
`_to_copy` under `copy_`), and FSDP2's copies appear as `copy_` and `_chunk_cat`, which the model prices in its
update and unshard terms, not per op. The model's times here are the kernels' and the stream's gaps, without the
host floor's stretch. Run with transformers 5.17 on the path for Hugging Face rows (as the device ran them).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trainer_sweep as ts  # noqa: E402


def _name(op: str) -> str:
    """'aten.mm.default' / 'aten::mm' -> 'mm'; other names (the profiler's FSDP ranges) as they are."""
    if op.startswith("aten."):
        return op.removeprefix("aten.").rsplit(".", 1)[0]
    return op.removeprefix("aten::")


def model_op_times(name: str, profile: str = ts.PROFILE) -> dict[str, tuple[int, float]]:
    """op name -> (calls, seconds) the cost model prices for one step of configuration `name`'s plan."""
    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    from cost_models.segments import phase_node_ids, segment_of
    from hardware_profiles import load_profile
    cfg = next(c for c in ts.CONFIGS if c.name == name)
    plan = ts._plan(cfg.plan_file, cfg.plan_file.stat().st_mtime_ns)
    graph, cache = ts._graph(cfg.model, cfg.seq, cfg.padded)
    cm = cost_model(graph, make_cluster(load_profile(profile), cfg.gpus, cfg.gpus), segment_cache=cache)
    seg_of = segment_of(graph)
    blocks_of = collections.Counter(graph.block_class[b] for b in graph.blocks)
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for seg_name, seg in cm.segments(plan.placements, plan.sequence_parallel).items():
        copies = blocks_of[graph.block_class[seg_name]] if seg_name in graph.block_class else 1
        for phase in ("fwd", "bwd"):
            ops = getattr(seg, phase)
            if len(ops.flops) == 0:
                continue
            t = cm._phase_times(ops, phase, plan.tp, plan.ep, plan.sequence_parallel, plan.micro_batch,
                                plan.compile)[0]
            for n, seconds in zip(phase_node_ids(graph, seg_of, seg_name, phase), t, strict=True):
                entry = out[_name(graph.g.nodes[n].get("op", ""))]
                entry[0] += plan.num_micro_batches * copies
                entry[1] += float(seconds) * plan.num_micro_batches * copies
    return {k: (int(v[0]), v[1]) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", required=True, help="a `measure --profile` JSONL file")
    ap.add_argument("--only", required=True, help="the configuration")
    ap.add_argument("--ops", default=None, help="comma-separated op names to list (default: the largest)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    rec = ts._measured([args.raw]).get(args.only)
    if rec is None or "ops" not in rec.get("profile", {}):
        raise SystemExit(f"op_times: {args.raw} has no profiled record of {args.only} (measure --profile)")
    measured = {_name(k): (int(v[0]), float(v[1])) for k, v in rec["profile"]["ops"].items()}
    model = model_op_times(args.only)
    names = args.ops.split(",") if args.ops else sorted(
        set(measured) | set(model), key=lambda k: -max(model.get(k, (0, 0.0))[1], measured.get(k, (0, 0.0))[1]))
    print(f"{'op':40s} {'model calls':>11s} {'model ms':>9s} {'measured calls':>14s} {'measured ms':>11s}")
    for k in names[:args.top]:
        (mc, ms), (pc, ps) = model.get(k, (0, 0.0)), measured.get(k, (0, 0.0))
        print(f"{k:40s} {mc:11d} {ms * 1e3:9.1f} {pc:14d} {ps * 1e3:11.1f}")
    print(f"model kernels {sum(v[1] for v in model.values()) * 1e3:.1f} ms; measured kernels "
          f"{rec['profile'].get('kernel_s', 0.0) * 1e3:.1f} ms; measured step {rec['measured']['step_time_s'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
