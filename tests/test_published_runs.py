"""The held-out published-runs set (benchmarks/data/published_runs.yaml) and its harness: the YAML
loads, every row names its source and has the fields the harness needs, and the harness builds a
valid Plan for every row it does not skip (spec + Plan only: no trace, no solver)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _harness():
    spec = importlib.util.spec_from_file_location("validate_published", ROOT / "benchmarks" / "validate_published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


H = _harness()
RUNS = H.load_runs()


def test_the_set_is_big_and_mixed():
    ids = [r["id"] for r in RUNS]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    assert len(RUNS) >= 15
    usable = [r for r in RUNS if H.skip_reason(r) is None]
    assert len(usable) >= 15, "at least 15 rows the cost model can express"
    families = {H.FRAMEWORK_RUNTIME[r["framework"]].family for r in RUNS}
    assert {"torch-native", "megatron"} <= families
    moe = [r["id"] for r in usable if H.model_spec(r).is_moe]
    assert moe and len(moe) < len(usable), "dense and MoE rows both present"
    assert not any("sc21" in r["source"]["url"].lower() or "2104.04473" in r["source"]["url"] for r in RUNS), \
        "SC'21 (the fitting set) must stay out"


@pytest.mark.parametrize("row", RUNS, ids=[r["id"] for r in RUNS])
def test_row_fields_and_source(row):
    assert H.check_row(row) == []
    assert row["source"]["url"].startswith("https://")
    for v in row["measured"].values():
        assert isinstance(v, (int, float)) and v > 0


@pytest.mark.parametrize("row", [r for r in RUNS if H.skip_reason(r) is None],
                         ids=[r["id"] for r in RUNS if H.skip_reason(r) is None])
def test_plan_builds_for_every_usable_row(row):
    spec = H.model_spec(row)
    plan = H.build_plan(row, spec)
    assert plan.gpus == row["gpus"] and plan.dp * plan.tp * plan.pp * plan.ep * plan.cp == row["gpus"]
    assert len(plan.recompute) == spec.num_layers
    assert plan.num_micro_batches * plan.dp * plan.ep * plan.micro_batch == row["global_batch"]
    assert H.measured_tokens_per_gpu(row, spec) > 0
    # what the run executed is in its plan: torch.compile, FP8 linears (tensorwise, every block)
    assert plan.compile == bool(row["compile"])
    assert plan.fp8 == (("tensorwise",) * spec.num_layers if row["precision"] == "fp8" else ())


def test_framework_runtime_is_per_framework_only():
    # the only non-row inputs; each framework named by a row has exactly one entry
    assert {r["framework"] for r in RUNS} <= set(H.FRAMEWORK_RUNTIME)
    for rt in H.FRAMEWORK_RUNTIME.values():
        assert rt.param_dtype in ("bf16", "fp16", "fp32") and rt.grad_reduce_dtype in ("bf16", "fp32")
