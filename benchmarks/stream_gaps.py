"""The GPU's idle time between consecutive kernels of a GPU-paced trainer step, per kernel (issue 12).

`autoparallel calibrate` times kernels replayed from CUDA graphs, where one kernel follows the last about 1 us
later (the profile's kernel_overhead_us, which `compute.op_times` charges every kernel). In AutoParallelTrainer's
steps the kernels are issued one by one from the host, eager or from Inductor's launchers, and even while the
host runs far ahead the compute stream idles a few microseconds between kernels. This reads every one-GPU
timeline summary `profile_timeline.py` stored (benchmarks/results/raw/timeline_*.jsonl), keeps the GPU-paced
steps (idle in gaps of 50 us or more under 5% of the kernel time: the host never held the stream), and per
step takes (compute-stream span - kernel time - those long gaps) / kernels: the short gaps' mean. The medians,
eager and compiled, less kernel_overhead_us, are the profile's `stream_gap_us` pair:

    python benchmarks/stream_gaps.py [--profile h200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # trainer_sweep: the configurations' plan files

RAW = ROOT / "benchmarks" / "results" / "raw"
GPU_PACED = 0.05  # long gaps (>= 50 us) under this share of the kernel time


def _compiled(name: str) -> bool:
    """Whether the sweep configuration `name` ran compiled blocks: its plan file's `compile`."""
    import trainer_sweep as ts

    cfg = next(c for c in ts.CONFIGS if c.name == name)
    return bool(ts._plan(cfg.plan_file, cfg.plan_file.stat().st_mtime_ns).compile)


def gaps(raw: Path = RAW) -> list[tuple[str, str, bool, float]]:
    """(file, configuration, compiled, short-gap us per kernel) of each GPU-paced one-GPU step."""
    out = []
    for f in sorted(raw.glob("timeline_*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("gpus", 1) != 1 or not r.get("kernel_count") or "compute_span_ms" not in r:
                continue
            busy = r["stream_busy_ms"][r["compute_stream"]]
            if r["compute_idle_ms"] >= GPU_PACED * busy:
                continue
            short = (r["compute_span_ms"] - busy - r["compute_idle_ms"]) * 1e3 / r["kernel_count"]
            out.append((f.name, r["name"], _compiled(r["name"]), short))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="h200")
    args = ap.parse_args()
    from hardware_profiles import load_profile
    overhead = load_profile(args.profile).efficiency.kernel_overhead_s * 1e6
    rows = gaps()
    print("| timeline | configuration | compiled | short gaps, us per kernel |\n|---|---|---|---:|")
    for f, name, compiled, g in rows:
        print(f"| {f} | {name} | {'yes' if compiled else 'no'} | {g:.2f} |")
    pair = []
    for compiled in (False, True):
        xs = [g for _, _, c, g in rows if c == compiled]
        med = statistics.median(xs)
        pair.append(round(med - overhead, 2))
        print(f"\n{'compiled' if compiled else 'eager'}: {len(xs)} steps, median {med:.2f} us a kernel "
              f"(range {min(xs):.2f}-{max(xs):.2f}); less kernel_overhead_us {overhead:.3f}: {pair[-1]}")
    print(f"\nstream_gap_us: {pair}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
