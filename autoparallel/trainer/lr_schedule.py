"""Learning-rate schedules on the trainer's own optimizers.

The trainer builds one optimizer per model part (the model, or each local pipeline stage), so a schedule
is a factory called on each of them, as torchtitan builds one scheduler per optimizer:
`lr_scheduler=lambda opt: transformers.get_cosine_schedule_with_warmup(opt, 100, 10_000)`. Each scheduler
steps once after every optimizer step.

A schedule is a function of the step count, so a resumed run rebuilds its schedulers and steps them to the
checkpoint's step (`fast_forward`) rather than storing their state: that holds under any plan, whose parts
and param groups differ from the saving run's, and reproduces the saving run's learning rates exactly (the
same recurrence from the same initial rates). ReduceLROnPlateau, which steps on a metric, is refused.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from autoparallel.errors import UserError

SchedulerFactory = Callable[[torch.optim.Optimizer], LRScheduler]


def check_factory(lr_scheduler: Any) -> SchedulerFactory | None:
    if lr_scheduler is None:
        return None
    if isinstance(lr_scheduler, LRScheduler | ReduceLROnPlateau):
        raise UserError("lr_scheduler: pass a factory callable(optimizer) -> LRScheduler, e.g. lambda opt: "
                        "torch.optim.lr_scheduler.LambdaLR(opt, fn); the trainer builds one on each of its own "
                        "optimizers (a scheduler built on the optimizer you passed would drive that one, which "
                        "the trainer never steps)")
    if not callable(lr_scheduler):
        raise UserError(f"lr_scheduler: expected a callable(optimizer) -> LRScheduler, got "
                        f"{type(lr_scheduler).__name__}")
    return lr_scheduler


def build(factory: SchedulerFactory, optimizer: torch.optim.Optimizer) -> LRScheduler:
    sched = factory(optimizer)
    if isinstance(sched, ReduceLROnPlateau):
        raise UserError("lr_scheduler: ReduceLROnPlateau steps on a metric, not on the step count; step it "
                        "yourself on each of trainer.optimizers")
    if not isinstance(sched, LRScheduler):
        raise UserError(f"lr_scheduler: the factory returned {type(sched).__name__}, not a "
                        f"torch.optim.lr_scheduler.LRScheduler")
    if getattr(sched, "optimizer", optimizer) is not optimizer:
        raise UserError("lr_scheduler: the factory's scheduler drives another optimizer than the one it was "
                        "given; build it on its argument")
    return sched


def fast_forward(schedulers: list[LRScheduler], steps: int) -> None:
    """Step freshly built schedulers to `steps` optimizer steps (a resumed run's), without optimizer steps."""
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": here on purpose, no optimizer step is due
        warnings.filterwarnings("ignore", message=r".*lr_scheduler\.step\(\)")
        for sched in schedulers:
            for _ in range(steps):
                sched.step()
