"""How fast does a bf16 GEMM run when a dimension is not a multiple of 8 elements? (docs/trainer_sweep_notes.md,
"Sixteenth session")

cuBLAS / CUTLASS pick kernels by the alignment of the operands' leading dimensions: 16 bytes (8 bf16 elements)
for the fastest, then 8, 4 and 2 bytes (align4, align2, align1 kernels). The cost model prices a GEMM with a
dim not a multiple of 8 at `gemm_unaligned_max`, fitted on GPT-2's 50257 vocabulary (odd: align1). OLMo 3's
100278 is even (align2). This times the three GEMMs of an LM head, forward (x W^T), input gradient (g W) and
weight gradient (g^T x), for vocabularies of each alignment at two widths and two token counts, and reports the
fraction of the profile's peak each reaches.

    python benchmarks/gemm_alignment.py --out $OUT/gemm_alignment.jsonl            # one GPU
    python benchmarks/gemm_alignment.py --report benchmarks/results/raw/gemm_alignment_s44.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# vocabularies by the largest power of two (up to 8) dividing them; the aligned ones for reference
VOCABS = {1: (50257, 49155, 100277), 2: (100278, 32002, 151646), 4: (100276, 50260, 32004),
          8: (100280, 50304, 32000)}
WIDTHS = (2048, 4096)
TOKENS = (8192, 16384)


def alignment(n: int) -> int:
    return next(a for a in (8, 4, 2, 1) if n % a == 0)


def measure(args: argparse.Namespace) -> int:
    import torch

    from hardware_profiles import load_profile
    peak = load_profile(args.profile).peak("bf16")
    dev = torch.device(args.device)
    for vocabs in VOCABS.values():
        for v in vocabs:
            for h in WIDTHS:
                for t in TOKENS:
                    x = torch.randn(t // args.shrink, h, device=dev, dtype=torch.bfloat16)
                    w = torch.randn(v // args.shrink, h, device=dev, dtype=torch.bfloat16)
                    g = torch.randn(t // args.shrink, v // args.shrink, device=dev, dtype=torch.bfloat16)
                    for name, (a, b) in (("fwd", (x, w.t())), ("dgrad", (g, w)), ("wgrad", (g.t(), x))):
                        times = []
                        for i in range(args.reps + 3):
                            if dev.type == "cuda":
                                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                                start.record()
                                a @ b
                                end.record()
                                torch.cuda.synchronize()
                                if i >= 3:
                                    times.append(start.elapsed_time(end) * 1e-3)
                            else:
                                import time
                                t0 = time.perf_counter()
                                a @ b
                                if i >= 3:
                                    times.append(time.perf_counter() - t0)
                        s = statistics.median(times)
                        flops = 2.0 * x.shape[0] * w.shape[0] * h
                        rec = {"vocab": v, "align": alignment(v), "hidden": h, "tokens": t, "gemm": name,
                               "seconds": s, "fraction": flops / s / peak}
                        with open(args.out, "a") as f:
                            f.write(json.dumps(rec) + "\n")
                    del x, w, g
    return 0


def report(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for path in args.report for line in Path(path).read_text().splitlines() if line.strip()]
    print("| alignment (elements) | GEMMs | fraction of peak: median | min | max |")
    print("|---:|---:|---:|---:|---:|")
    for a in (1, 2, 4, 8):
        fr = [r["fraction"] for r in rows if r["align"] == a]
        if fr:
            print(f"| {a} | {len(fr)} | {statistics.median(fr):.3f} | {min(fr):.3f} | {max(fr):.3f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", nargs="+", default=None)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shrink", type=int, default=1, help="divide the sizes (a smoke test on a CPU)")
    args = ap.parse_args(argv)
    return report(args) if args.report else measure(args)


if __name__ == "__main__":
    sys.exit(main())
