"""Learning-rate schedules (AutoParallelTrainer(lr_scheduler=factory)): one scheduler per trainer optimizer,
stepped after each optimizer step, trains as a single-process loop with the same scheduler does; a resumed
run, under the same or another plan, continues the schedule from the checkpoint's step. Tolerances:
trainer_helpers' LOSS_RTOL and PARAM_ATOL (the schedule only rescales Adam's step, by at most 1 here, so the
bounds derived for a constant LR hold); the learning rates themselves are compared exactly (the same float
recurrence from the same initial rate)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.errors import UserError
from autoparallel.trainer import AutoParallelTrainer


def decay(step: int) -> float:
    return 0.5 ** step


def factory(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, decay)


@functools.cache
def reference(name: str) -> tuple[list[float], dict[str, torch.Tensor], list[float]]:
    """Plain single-process AdamW with the schedule: (losses, final parameters, the LR of every step)."""
    torch.set_num_threads(1)
    model = H.build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS)
    sched = factory(opt)
    losses, lrs = [], []
    for tokens in H.batches(name):
        lrs.append(opt.param_groups[0]["lr"])
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, -2).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}, lrs


def _trainer(name: str, plan: dict[str, Any], seed: int = 0) -> AutoParallelTrainer:
    model = H.build(name, seed=seed)
    return AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                               plan=H.make_plan(model, **plan), lr_scheduler=factory)


def _train(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    """cfg.resume: {"stop": k, "plan": {...}}: save after k steps, then a fresh trainer (another seed) under that
    plan loads the checkpoint and trains on."""
    trainer = _trainer(cfg.model, cfg.plan)
    losses, lrs = [], []
    for i, tokens in enumerate(H.batches(cfg.model)):
        if i == cfg.resume.get("stop"):
            trainer.save_checkpoint(out / f"{cfg.name}.ckpt")
            trainer = _trainer(cfg.model, cfg.resume.get("plan", cfg.plan), seed=99)
            trainer.load_checkpoint(out / f"{cfg.name}.ckpt")
        lrs.append({g["lr"] for opt in trainer.optimizers for g in opt.param_groups})
        losses.append(trainer.step(tokens))
    torch.save(trainer.full_state_dict(), out / f"{cfg.name}.rank{rank}.pt")
    return {"losses": losses, "lrs": [sorted(x) for x in lrs],
            "schedulers": len(trainer.lr_schedulers), "optimizers": len(trainer.optimizers)}


def _check(out: Path, cfg: Config, world: int) -> None:
    ref_losses, ref_params, ref_lrs = reference(cfg.model)
    for r, rank in enumerate(H.rank_results(out, cfg.name, world)):
        assert rank["lrs"] == [[lr] for lr in ref_lrs], (r, rank["lrs"], ref_lrs)
        assert rank["schedulers"] == rank["optimizers"]
    H.assert_equivalent(out, cfg.name, world, (ref_losses, ref_params))


@pytest.mark.parametrize("resume", [{}, {"stop": 2}], ids=["straight", "resumed"])
def test_one_process_follows_the_schedule(tmp_path, resume):
    cfg = Config("one", "tiny-llama", {"micro_batch": 2}, resume=resume)
    (tmp_path / "one.rank0.json").write_text(json.dumps(_train(cfg, tmp_path, 0)))
    _check(tmp_path, cfg, 1)


WORLD2 = [
    Config("llama-pp2-interleaved", "tiny-llama", {"pp": 2, "vpp": 2, "micro_batch": 2}),  # two optimizers a rank
    Config("gpt-resume-dp2-to-pp2", "tiny-gpt", {"dp": 2, "zero": 3, "micro_batch": 2},
           resume={"stop": 2, "plan": {"pp": 2, "micro_batch": 4}}),
    Config("moe-resume-ep2-to-tp2", "tiny-moe", {"ep": 2, "micro_batch": 2},
           resume={"stop": 1, "plan": {"tp": 2, "sp": True, "micro_batch": 4}}),
]


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("lr2")
    H.run_spawned(2, WORLD2, out, train=_train)
    return out


@pytest.mark.parametrize("cfg", WORLD2, ids=lambda c: c.name)
def test_two_processes_follow_the_schedule(cfg, world2):
    _check(world2, cfg, 2)


@pytest.mark.parametrize("value, message", [
    (3, r"^lr_scheduler: expected a callable\(optimizer\) -> LRScheduler, got int$"),
    (lambda opt: opt, r"^lr_scheduler: the factory returned AdamW, not a torch.optim.lr_scheduler.LRScheduler$"),
    (lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt), r"^lr_scheduler: ReduceLROnPlateau steps on a metric"),
])
def test_a_bad_lr_scheduler_is_one_error(value, message):
    model = H.build("tiny-gpt")
    with pytest.raises(UserError, match=message):
        AutoParallelTrainer(model, torch.optim.AdamW(model.parameters()), plan=H.make_plan(model), lr_scheduler=value)


def test_a_scheduler_built_on_the_users_optimizer_is_refused():
    model = H.build("tiny-gpt")
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError, match=r"^lr_scheduler: pass a factory callable\(optimizer\)"):
        AutoParallelTrainer(model, opt, plan=H.make_plan(model), lr_scheduler=torch.optim.lr_scheduler.StepLR(opt, 1))
    with pytest.raises(UserError, match=r"drives another optimizer than the one it was given"):
        AutoParallelTrainer(model, opt, plan=H.make_plan(model),
                            lr_scheduler=lambda _: torch.optim.lr_scheduler.StepLR(opt, 1))
