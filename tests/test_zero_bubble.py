"""Zero-bubble pipeline schedule (plan.pipeline_schedule = "zero_bubble", torch's
ScheduleInterleavedZeroBubble): the trainer runs it to the single-process losses and parameters (the
tolerances of trainer_helpers, derived there: the zero-bubble schedule only reorders when each
micro-batch's input and weight gradients are computed, and accumulates the same fp32 terms), the plan
refuses what torch would, and the cost model's pipeline time matches a simulation of torch's own action
lists.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.errors import UserError
from autoparallel.plan import Plan

ZB = {"pipeline_schedule": "zero_bubble"}


def _train_zb(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    """trainer_helpers._train with the plan's pipeline_schedule set (make_plan has no such argument)."""
    from autoparallel.trainer import AutoParallelTrainer

    kw = dict(cfg.plan)
    schedule = kw.pop("pipeline_schedule", "")
    model = H.build(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS)
    plan = replace(H.make_plan(model, **kw), pipeline_schedule=schedule)
    trainer = AutoParallelTrainer(model, opt, plan=plan)
    assert type(trainer._schedule).__name__ == ("ScheduleInterleavedZeroBubble" if schedule else
                                                 type(trainer._schedule).__name__)
    losses = [trainer.step(tokens) for tokens in H.batches(cfg.model, cfg.steps)]
    torch.save(trainer.full_state_dict(), out / f"{cfg.name}.rank{rank}.pt")
    return {"losses": losses}


WORLD2: list[Config] = [
    *(Config(f"{short}-pp2-zb", model, {"pp": 2, "micro_batch": 2, **ZB})
      for short, model in (("gpt", "tiny-gpt"), ("llama", "tiny-llama"), ("moe", "tiny-moe"))),
    Config("llama-pp2-vpp2-zb", "tiny-llama", {"pp": 2, "vpp": 2, "micro_batch": 2, **ZB}),
    Config("gpt-pp2-zb-fullac", "tiny-gpt", {"pp": 2, "micro_batch": 2, "recompute": "full", **ZB}),
    Config("llama-pp2-zb-m2", "tiny-llama", {"pp": 2, "micro_batch": 4, **ZB}),  # m == pp: one round
]
WORLD4: list[Config] = [
    Config("llama-pp2xdp2-zb-zero1", "tiny-llama", {"pp": 2, "dp": 2, "zero": 1, "micro_batch": 1, **ZB}),
    Config("gpt-pp2xdp2-zb-zero3", "tiny-gpt", {"pp": 2, "dp": 2, "zero": 3, "micro_batch": 1, **ZB}),
]


@functools.cache
def reference(model: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    return H.reference(model)


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("zb2")
    H.run_spawned(2, WORLD2, out, train=_train_zb)
    return out


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("zb4")
    H.run_spawned(4, WORLD4, out, train=_train_zb)
    return out


def check_equivalent(out: Path, cfg: Config, world: int) -> None:
    res = H.result(out, cfg.name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    per_rank = [H.result_of_rank(out, cfg.name, r)["losses"] for r in range(world)]
    assert all(losses == per_rank[0] for losses in per_rank), f"ranks disagree on the loss: {per_rank}"
    ref_losses, ref_params = reference(cfg.model)
    for step, (a, b) in enumerate(zip(res["losses"], ref_losses, strict=True)):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b), f"step {step}: loss {a} != single-process {b}"
    params = H.gathered_params(out, cfg.name)
    assert set(params) == set(ref_params), sorted(set(params) ^ set(ref_params))
    for name, ref in ref_params.items():
        diff = (params[name] - ref).abs().max().item()
        # a gradient scaled twice (or not at all) by the micro-batch count moves Adam's first steps by
        # ~LR, a hundred times PARAM_ATOL
        assert diff <= H.PARAM_ATOL, f"{name}: max |param - single-process| = {diff:.2e}"


@pytest.mark.parametrize("cfg", WORLD2, ids=lambda c: c.name)
def test_zero_bubble_two_processes(cfg, world2):
    check_equivalent(world2, cfg, 2)


@pytest.mark.parametrize("cfg", WORLD4, ids=lambda c: c.name)
def test_zero_bubble_four_processes(cfg, world4):
    check_equivalent(world4, cfg, 4)


# ---- the plan field ---------------------------------------------------------------------------
def _plan(**kw: Any) -> Plan:
    base = dict(model="m", hardware="h", gpus=2, gpus_per_node=8, global_batch=8, seq_len=16, pp=2,
                micro_batch=1, stage_layers=(2, 2), pipeline_schedule="zero_bubble")
    return Plan(**{**base, **kw})


def test_plan_round_trips_the_schedule_and_old_files_load():
    plan = _plan()
    d = plan.to_dict()
    assert d["pipeline_schedule"] == "zero_bubble" and d["schedule"] == "InterleavedZeroBubble"
    assert Plan.from_dict(d) == plan
    default = _plan(pipeline_schedule="")
    assert "pipeline_schedule" not in default.to_dict()    # default plans keep the files they had
    assert Plan.from_dict(default.to_dict()) == default and default.schedule == "1F1B"


@pytest.mark.parametrize("kw,message", [
    ({"pipeline_schedule": "zbx"}, r"pipeline_schedule='zbx' must be"),
    ({"pp": 1, "dp": 2, "stage_layers": ()}, r"zero_bubble needs pp > 1"),
])
def test_plan_validation_refuses_bad_schedules(kw, message):
    with pytest.raises(UserError, match=message) as e:
        Plan.from_dict(_plan(pipeline_schedule="").to_dict() | kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,message", [
    ({"compile": True}, r"eager stages only"),
    ({"global_batch": 5, "micro_batch": 1}, r"micro-batch count \(5\) to be a multiple of its rounds"),
])
def test_check_runnable_refuses_what_torch_would(kw, message):
    plan = _plan(**kw)
    plan.validate()
    with pytest.raises(UserError, match=message) as e:
        plan.check_runnable()
    assert "\n" not in str(e.value)
