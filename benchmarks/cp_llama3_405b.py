"""Context parallelism at Llama 3 scale (issue 16 acceptance): plan llama3-405b on 16,384 H100s (profile
h100-sxm) at 131,072 tokens per sequence, and predict the layout the Llama 3 paper reports for that stage.

    PYTHONPATH=. python benchmarks/cp_llama3_405b.py      # writes benchmarks/results/cp_llama3_405b.json

The paper ("The Llama 3 Herd of Models", arXiv 2407.21783, Table 4): 16,384 GPUs, TP 8, CP 16, PP 16, DP 8,
seq 131,072, 16M tokens per batch (128 sequences), 380 TFLOP/s per GPU, 38% BF16 MFU. The paper's MFU
counts 6 N + 12 L h s FLOPs per token (PaLM's convention: causal attention counted as full); the
predicted MFU here converts the predicted tokens/s with that same formula (benchmarks/validate_published.py
flops_per_token) and divides by the profile's bf16 peak (989 TFLOP/s), as the paper divides by the H100's.
The same row is part of validate_published (id llama3-paper-405b-16k-gpus-cp16).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from validate_published import build_plan, flops_per_token, load_runs  # noqa: E402

from autoparallel import api  # noqa: E402
from autoparallel.specs import load_model_spec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cp_llama3_405b.json"
ROW = "llama3-paper-405b-16k-gpus-cp16"
PAPER_MFU = 0.38
GPUS, SEQ, BATCH, BUDGET = 16384, 131072, 128, "80GB"


def main() -> None:
    spec = load_model_spec("llama3-405b")
    t0 = time.perf_counter()
    result, ctx = api.plan_result("llama3-405b", hardware="h100-sxm", gpus=GPUS, global_batch=BATCH, seq_len=SEQ,
                                  max_memory_per_gpu=BUDGET)
    plan_s = time.perf_counter() - t0
    est = result.estimate
    palm = flops_per_token(spec, SEQ, "palm")
    peak = ctx.cluster.profile.peak("bf16")
    planned = {"plan": {k: getattr(result.plan, k) for k in ("dp", "tp", "pp", "cp", "vpp", "micro_batch", "zero",
                                                             "sequence_parallel")},
               "recompute": dict(sorted({m: result.plan.recompute.count(m) for m in set(result.plan.recompute)}.items())),
               "solver": result.solver.to_dict(), "plan_wall_s": round(plan_s, 2),
               "step_s": est.step_time_s, "peak_gib": est.peak_memory_gib, "budget_gib": est.budget_gib,
               "fits": est.fits, "tokens_per_s_per_gpu": est.tokens_per_s / GPUS,
               "mfu_palm": est.tokens_per_s / GPUS * palm / peak, "breakdown_s": est.breakdown}
    row = next(r for r in load_runs() if r["id"] == ROW)
    paper_plan = build_plan(row, spec)
    paper_plan = dataclasses.replace(paper_plan, placements=ctx.cost_model.placements_for(paper_plan))
    pe = ctx.cost_model.estimate(paper_plan, ctx.budget_bytes)
    mfu = pe.tokens_per_s / GPUS * palm / peak
    paper = {"layout": "tp8 cp16 pp16 dp8, mb1, 128 x 131072 tokens, ZeRO-2 (as validate_published)",
             "predicted_tokens_per_s_per_gpu": pe.tokens_per_s / GPUS, "predicted_mfu_palm": mfu,
             "paper_mfu": PAPER_MFU, "mfu_error_pct": (mfu / PAPER_MFU - 1) * 100,
             "predicted_peak_gib": pe.peak_memory_gib, "step_s": pe.step_time_s, "breakdown_s": pe.breakdown}
    out = {"command": "PYTHONPATH=. python benchmarks/cp_llama3_405b.py", "planned": planned, "paper_layout": paper}
    RESULTS.write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
