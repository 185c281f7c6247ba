"""AutoParallelTrainer.evaluate: the loss step() would report, without gradients or an update, under every
layout (CPU, gloo, fp32), interleaved with training steps that must then train exactly as without it.

Each run evaluates before its first step, between steps and after the last, and trains H.STEPS steps; the
single-process reference does the same with a plain model (eval mode, no_grad, then AdamW). The losses
compare at H.LOSS_RTOL and the final parameters at H.PARAM_ATOL, both derived in trainer_helpers: an
evaluation that left a gradient, a gathered parameter or a module in eval mode behind, or a forward that
computed something else, moves them by far more.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.trainer import AutoParallelTrainer

EVAL_AT = (0, 1, H.STEPS)   # evaluations before these steps (H.STEPS: after the last one)


def _data(name: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The training batches and a held-out one after them (the global batch's rows: a pipelined plan runs
    exactly those)."""
    *data, held = H.batches(name, H.STEPS + 1)
    return data, held


def _loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens[:, :-1]).flatten(0, -2).float(), tokens[:, 1:].flatten())


@functools.cache
def reference(name: str) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """(step losses, evaluation losses, final parameters) of plain single-process training."""
    torch.set_num_threads(1)
    model = H.build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS)
    data, held = _data(name)
    steps, evals = [], []
    for i in range(H.STEPS + 1):
        if i in EVAL_AT:
            model.eval()
            with torch.no_grad():
                evals.append(_loss(model, held).item())
            model.train()
        if i < H.STEPS:
            loss = _loss(model, data[i])
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps.append(loss.item())
    return steps, evals, {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def _run(cfg: Config, out: Path | None, rank: int) -> dict[str, Any]:
    model = H.build(cfg.model)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model, **cfg.plan))
    data, held = _data(cfg.model)
    steps, evals, gathered = [], [], 0
    for i in range(H.STEPS + 1):
        if i in EVAL_AT:
            evals.append(trainer.evaluate(held))
            gathered += _gathered(trainer)
        if i < H.STEPS:
            steps.append(trainer.step(data[i]))
    params = trainer.full_state_dict()
    if out is not None:
        torch.save(params, out / f"{cfg.name}.rank{rank}.pt")
    return {"losses": steps, "evals": evals, "steps": trainer.steps, "gathered": gathered,
            "params": params if out is None else None}


def _gathered(trainer: AutoParallelTrainer) -> int:
    """FSDP2 parameters left unsharded (ZeRO 2 and pipelined blocks keep them after a forward until the backward)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
    count = 0
    for part in trainer.model_parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                for group in m._get_fsdp_state()._fsdp_param_groups:
                    count += sum(p.sharded_state != ShardedState.SHARDED for p in group.fsdp_params)
    return count


def _check(steps: list[float], evals: list[float], params: dict[str, torch.Tensor], ref: tuple) -> None:
    ref_steps, ref_evals, ref_params = ref
    for what, got, want in (("step", steps, ref_steps), ("evaluate", evals, ref_evals)):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert abs(a - b) <= H.LOSS_RTOL * abs(b), f"{what} {i}: loss {a} != single-process {b}"
    assert set(params) == set(ref_params)
    for name, want in ref_params.items():
        diff = (params[name] - want).abs().max().item()
        assert diff <= H.PARAM_ATOL, f"{name}: max |param - single-process| = {diff:.2e}"


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe"])
def test_one_process_evaluates_without_touching_training(name):
    res = _run(Config(name, name, {"micro_batch": 2}), None, 0)
    assert res["steps"] == H.STEPS  # evaluations are not optimizer steps
    _check(res["losses"], res["evals"], res["params"], reference(name))


def test_evaluate_turns_dropout_off_and_restores_train_mode():
    """With dropout, a training forward is random; evaluate's is the deterministic eval-mode loss, and the
    modules train again afterwards."""
    model = H.build("mha")
    for block in model.blocks:
        block.mlp.add_module("drop", torch.nn.Dropout(0.5))
    trainer = AutoParallelTrainer(model, torch.optim.SGD(model.parameters(), lr=0.0), plan=H.make_plan(model))
    batch = H.batches("mha", 1)[0]
    first, second = trainer.evaluate(batch), trainer.evaluate(batch)
    assert first == second
    (part,) = trainer.model_parts
    assert all(m.training for m in part.modules())
    assert trainer.step(batch) != trainer.step(batch)  # lr 0: the same weights, two dropout draws
    model.eval()
    with torch.no_grad():
        assert abs(first - _loss(model, batch).item()) <= H.LOSS_RTOL * first


# ---- many processes ---------------------------------------------------------------------------------
WORLD2 = [
    Config("gpt-dp2", "tiny-gpt", {"dp": 2, "micro_batch": 2}),
    Config("llama-fsdp2-zero2", "tiny-llama", {"dp": 2, "zero": 2, "micro_batch": 2}),   # keeps blocks gathered
    Config("llama-fsdp2-zero3", "tiny-llama", {"dp": 2, "zero": 3, "micro_batch": 2}),
    Config("gpt-tp2-sp", "tiny-gpt", {"tp": 2, "sp": True, "micro_batch": 4}),
    Config("gpt-pp2", "tiny-gpt", {"pp": 2, "micro_batch": 4}),
    Config("llama-pp2-interleaved", "tiny-llama", {"pp": 2, "vpp": 2, "micro_batch": 2}),
    Config("moe-ep2", "tiny-moe", {"ep": 2, "micro_batch": 2}),
    Config("llama-cp2", "tiny-llama", {"cp": 2, "micro_batch": 2}),                     # ring attention
]
WORLD4 = [
    Config("llama-dp2xtp2-sp", "tiny-llama", {"dp": 2, "tp": 2, "sp": True, "micro_batch": 2}),
    Config("gpt-cp2xpp2", "tiny-gpt", {"cp": 2, "pp": 2, "micro_batch": 2}),
    Config("moe-ep2xdp2-zero3", "tiny-moe", {"ep": 2, "dp": 2, "zero": 3, "micro_batch": 1}),
]


def _train_spawned(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    res = _run(cfg, out, rank)
    res.pop("params")
    return res


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("evaluate2")
    H.run_spawned(2, WORLD2, out, train=_train_spawned)
    return out


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("evaluate4")
    H.run_spawned(4, WORLD4, out, train=_train_spawned)
    return out


def _check_spawned(out: Path, cfg: Config, world: int) -> None:
    per_rank = H.rank_results(out, cfg.name, world)
    assert all(r["evals"] == per_rank[0]["evals"] for r in per_rank)
    assert all(r["gathered"] == 0 for r in per_rank), "evaluate left FSDP2 parameters gathered"
    _check(per_rank[0]["losses"], per_rank[0]["evals"], H.gathered_params(out, cfg.name), reference(cfg.model))


@pytest.mark.parametrize("cfg", WORLD2, ids=lambda c: c.name)
def test_two_processes_evaluate_as_one(cfg, world2):
    _check_spawned(world2, cfg, 2)


@pytest.mark.parametrize("cfg", WORLD4, ids=lambda c: c.name)
def test_four_processes_evaluate_as_one(cfg, world4):
    _check_spawned(world4, cfg, 4)
