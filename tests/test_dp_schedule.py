"""The data-parallel collectives the cost model charges are the ones AutoParallelTrainer issues.

comm.trainer_dp_schedule says how many parameter all-gathers and gradient reduce-scatters each FSDP2 unit
runs in one step, with and without a pipeline; estimate.dp_sync_time (the time on the wire),
CostModel.fsdp_collective_time (the ranks' meetings) and compute.fsdp_update_time (the copies around them)
all read it, and CostModel.held_zero's memory follows from it (a unit reduced once a step holds its
gradients unsharded until then). Here four gloo ranks run the trainer's second step with every all-gather
and reduce-scatter counted, per ZeRO mode, micro-batch count and pipeline layout, against the schedule
times this rank's FSDP2 units.

The model is the tiny GPT: its embedding and head are tied, so every unit is a block or the root, and all
of them reshard after the forward exactly when the plan is ZeRO-3 (trainer.data_parallel; the untied
head's own unit stays gathered instead).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import trainer_helpers as H
from trainer_helpers import Config

from cost_models.comm import trainer_dp_schedule

WORLD = 4
# name -> make_plan arguments; 8 rows a step over dp 2 or 4: micro_batch sets the micro-batch count
LAYOUTS = {
    "dp4-zero1-m2": {"dp": 4, "zero": 1, "micro_batch": 1},
    "dp4-zero2-m2": {"dp": 4, "zero": 2, "micro_batch": 1},
    "dp4-zero3-m2": {"dp": 4, "zero": 3, "micro_batch": 1},
    "pp2dp2-zero1-m4": {"pp": 2, "dp": 2, "zero": 1, "micro_batch": 1},
    "pp2dp2-zero2-m4": {"pp": 2, "dp": 2, "zero": 2, "micro_batch": 1},
    "pp2dp2-zero3-m4": {"pp": 2, "dp": 2, "zero": 3, "micro_batch": 1},
    "pp2dp2-zero3-m2": {"pp": 2, "dp": 2, "zero": 3, "micro_batch": 2},
    "pp2vpp2dp2-zero3-m4": {"pp": 2, "vpp": 2, "dp": 2, "zero": 3, "micro_batch": 1},
}
# torch 2.13's FSDP2 issues all_gather_single / reduce_scatter_single, older releases the *_tensor forms
COUNTED = {"all_gather_single": "gathers", "all_gather_into_tensor": "gathers",
           "reduce_scatter_single": "reductions", "reduce_scatter_tensor": "reductions"}


def _units(model: torch.nn.Module) -> int:
    """FSDP2 units of this rank that manage parameters: the parameters of an FSDPModule's subtree outside the
    FSDPModules nested in it."""
    from torch.distributed.fsdp import FSDPModule

    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
    count = 0
    for unit in fsdp:
        nested = {id(p) for m in fsdp if m is not unit and any(m is x for x in unit.modules())
                  for p in m.parameters()}
        count += any(id(p) not in nested for p in unit.parameters())
    return count


def _count_step(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    """Trains one step, then counts the second's collectives (the first also initializes lazily)."""
    import torch.distributed as dist

    from autoparallel.trainer import AutoParallelTrainer

    model = H.build(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS)
    trainer = AutoParallelTrainer(model, opt, plan=H.make_plan(model, **cfg.plan))
    first, second = H.batches(cfg.model, 2)
    trainer.step(first)
    counts = {"gathers": 0, "reductions": 0}
    originals = {name: getattr(dist, name) for name in COUNTED if hasattr(dist, name)}

    def counted(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[COUNTED[name]] += 1
            return originals[name](*args, **kwargs)
        return call

    for name in originals:
        setattr(dist, name, counted(name))
    try:
        trainer.step(second)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return {"losses": [], **counts, "units": sum(_units(p) for _, p in trainer._parts),
            "micro_batches": trainer.plan.num_micro_batches}


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dp_schedule")
    H.run_spawned(WORLD, [Config(name, "tiny-gpt", plan) for name, plan in LAYOUTS.items()], out, train=_count_step)
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_unit_gathers_and_reduces_as_the_schedule_says(counted: Path, name: str) -> None:
    plan = LAYOUTS[name]
    sched = trainer_dp_schedule(plan["zero"], H.GLOBAL_BATCH // plan["dp"] // plan["micro_batch"],
                                plan.get("pp", 1) > 1)
    for rank in range(WORLD):
        res = json.loads((counted / f"{name}.rank{rank}.json").read_text())
        assert "error" not in res, res.get("traceback", res.get("error"))
        units = res["units"]
        assert units >= 2, res
        assert res["gathers"] == units * sched.unshards, (rank, res, sched)
        assert res["reductions"] == units * sched.reductions, (rank, res, sched)


def test_a_pipelined_step_holds_its_units_gathered_with_unsharded_gradients() -> None:
    """What the counts above imply for memory (CostModel.held_zero): a pipelined unit reduced once a step, after
    the last micro-batch, holds its gradients unsharded until then (fp32: the bf16 gradients accumulate in the
    reduce dtype) and stays gathered from its first backward, so ZeRO 2 and 3 hold ZeRO-1's model states at
    the peak: per local parameter 2 B of bf16 copy + 4 B of gradient whole + 12 B of fp32 master and Adam
    state over dp. One micro-batch is reduced at once, so ZeRO-3 keeps its sharded layout there; without a
    pipeline nothing changes; Megatron's layout is its own."""
    from dataclasses import replace

    from autoparallel.api import context
    from autoparallel.plan import Plan

    ctx = context("tiny-llama", "h200", 4, 128)
    cm = ctx.cost_model
    pp = Plan(model="tiny-llama", hardware="h200", gpus=4, gpus_per_node=4, global_batch=8, seq_len=128, dp=2, pp=2,
              micro_batch=1, zero=3, grad_reduce_dtype="fp32", param_dtype="bf16")
    assert pp.num_micro_batches == 4
    n = 1e6
    for zero in (1, 2, 3):
        assert cm.held_zero(replace(pp, zero=zero)) == 1
        assert cm.model_states(replace(pp, zero=zero), n, 0.0) == pytest.approx((2 * n, 4 * n, 12 * n / 2))
    one = replace(pp, micro_batch=4)
    assert cm.held_zero(one) == 3 and cm.model_states(one, n, 0.0) == pytest.approx((0.0, 0.0, 12 * n / 2))
    flat = replace(pp, pp=1, dp=4, gpus=4, micro_batch=1)
    assert cm.held_zero(flat) == 3 and cm.model_states(flat, n, 0.0) == pytest.approx((0.0, 4 * n / 4, 12 * n / 4))
    megatron = context("tiny-llama", "h200", 4, 128, runtime="megatron").cost_model
    assert megatron.held_zero(replace(pp, zero=2)) == 2
    # the estimate's per-stage breakdown reads the same states
    est = cm.estimate(pp)
    stage0 = est.memory_breakdown_gib[0]
    assert stage0["grads"] == pytest.approx(2 * stage0["params"]) and stage0["grads"] > 0
