"""Every Hugging Face type benchmarks/hf_coverage.py finds `same`, trained by AutoParallelTrainer with dp1 x tp2 on
two gloo ranks (its tiny config, fp32, two SGD steps) against the model's own loop: a crash, a refusal, or the
largest relative loss difference, one JSON line per type in benchmarks/results/hf_tp_scan.jsonl (CPU; run by pytest,
whose fixtures spawn the ranks):

    python -m pytest -q benchmarks/hf_tp_scan.py -p no:cacheprovider        # all (~10 min on two cores)
    SCAN_TYPES=olmo,moshi SCAN_FIX='{"tp": 1, "dp": 2, "micro_batch": 2}' python -m pytest -q benchmarks/hf_tp_scan.py

The file's fp32 bound is tests/trainer_helpers.LOSS_RTOL (1e-5); a type above it under tp2 that matches under dp2
differs by tensor parallelism.
"""
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
OUT = ROOT / "benchmarks" / "results" / "hf_tp_scan.jsonl"
import hf_helpers as HF  # noqa: E402
import trainer_helpers as H  # noqa: E402


@dataclass(frozen=True)
class C:
    name: str


def _model(t):
    import hf_coverage as hc
    from transformers import AutoModelForCausalLM
    cfg = hc.tiny_config(t)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).float()


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 200, (4, 16), generator=g) for _ in range(2)]


def _train(cfg, out, rank):
    fix = json.loads(os.environ["SCAN_FIX"]) if os.environ.get("SCAN_FIX") else HF.TP2
    losses, tr = HF.sgd_trainer_losses(_model(cfg.name), _batches(), fix)
    return {"losses": losses, "colwise": sum(v == "colwise" for v in tr.plan.placements.values())}


def test_scan(tmp_path):
    """One line per type appended to OUT (see the module docstring)."""
    rows = json.loads((ROOT / "benchmarks" / "results" / "hf_coverage.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    types = [r["model_type"] for r in rows if r.get("result") == "same"]
    lo, hi = (int(x) for x in os.environ.get("SCAN", "0:200").split(":"))
    types = types[lo:hi]
    if os.environ.get("SCAN_TYPES"):
        types = os.environ["SCAN_TYPES"].split(",")
    H.run_spawned(2, [C(t) for t in types], tmp_path, timeout=3000, train=_train)
    for t in types:
        res = H.result(tmp_path, t)
        line = {"type": t}
        if "error" in res:
            line["error"] = res["error"][:300]
        else:
            try:
                ref = HF.sgd_losses(_model(t), _batches())
                line["rel"] = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], ref))
                line["colwise"] = res["colwise"]
            except Exception as e:
                line["ref_error"] = str(e)[:200]
        with OUT.open("a") as f:
            f.write(json.dumps(line) + "\n")
