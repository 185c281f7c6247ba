"""Gradient clipping (AutoParallelTrainer(max_grad_norm=...)): every layout reports the single-process global
gradient norm and trains to the single-process clipped parameters (CPU, gloo, fp32).

SGD rather than Adam: Adam divides a clipped gradient's scale back out (up to its eps), so a wrong clipping
coefficient would hardly move its parameters; SGD moves them by lr * coefficient * gradient.

Tolerances, derived from trainer_helpers' fp32 bounds (a parallel plan sums the same terms in another order;
every gradient entry differs from the single-process one by at most H.GRAD_NOISE):
- the norm of N entries moves by at most ||delta g|| <= sqrt(N) * GRAD_NOISE, plus the sum of squares'
  own pairwise rounding, ceil(log2 N) * u * norm (`norm_atol`);
- an SGD step moves a parameter by lr * c * g with c = max_norm / norm <= 1: by at most
  lr * (GRAD_NOISE + GRAD_SCALE * |delta norm| / norm) more or less per step, summed over the steps
  (first order: the later gradients' own change from the earlier steps' differences is far smaller).
A norm that counts a replicated or tied gradient twice, or misses a shard or a pipeline stage, is off by
tens of percent: lr * GRAD_SCALE * 0.1 = 2.5e-3, against a tolerance of ~3e-6.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.errors import UserError
from autoparallel.trainer import AutoParallelTrainer

MAX_NORM = 0.5   # below every step's norm of the tiny models (1.4-2.3): the clip binds (asserted)
SGD_LR = 0.1


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=SGD_LR)


def reference(name: str, max_norm: float = MAX_NORM) -> tuple[list[float], list[float], dict[str, torch.Tensor], int]:
    """Plain single-process SGD with torch.nn.utils.clip_grad_norm_: (losses, norms, parameters, entries)."""
    torch.set_num_threads(1)
    model = H.build(name)
    opt = _sgd(model.parameters())
    losses, norms = [], []
    for tokens in H.batches(name):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, -2).float(), tokens[:, 1:].flatten())
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    entries = sum(p.numel() for p in model.parameters())
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}, entries


def norm_atol(entries: int, norm: float) -> float:
    return math.sqrt(entries) * H.GRAD_NOISE + math.ceil(math.log2(entries)) * H.FP32_UNIT_ROUNDOFF * norm


def param_atol(entries: int, norms: list[float]) -> float:
    return sum(SGD_LR * (H.GRAD_NOISE + H.GRAD_SCALE * norm_atol(entries, n) / n) for n in norms)


def check(losses: list[float], norms: list[float], params: dict[str, torch.Tensor], ref: tuple) -> None:
    ref_losses, ref_norms, ref_params, entries = ref
    for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b), f"step {step}: loss {a} != single-process {b}"
    for step, (a, b) in enumerate(zip(norms, ref_norms, strict=True)):
        assert abs(a - b) <= norm_atol(entries, b), f"step {step}: grad norm {a} != single-process {b}"
    assert set(params) == set(ref_params)
    tol = param_atol(entries, ref_norms)
    for name, want in ref_params.items():
        diff = (params[name] - want).abs().max().item()
        assert diff <= tol, f"{name}: max |param - single-process| = {diff:.2e} > {tol:.2e}"


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe"])
def test_one_process_clips_as_torch_does(name):
    ref = reference(name)
    assert min(ref[1]) > MAX_NORM  # the clip binds at every step
    torch.set_num_threads(1)
    model = H.build(name)
    trainer = AutoParallelTrainer(model, _sgd(model.parameters()), plan=H.make_plan(model, micro_batch=2),
                                  max_grad_norm=MAX_NORM)
    assert trainer.grad_norm is None
    losses, norms = [], []
    for tokens in H.batches(name):
        losses.append(trainer.step(tokens))
        norms.append(trainer.grad_norm)
    check(losses, norms, trainer.full_state_dict(), ref)


def test_an_infinite_max_norm_measures_without_clipping():
    clipped = reference("tiny-llama", max_norm=math.inf)
    torch.set_num_threads(1)
    model = H.build("tiny-llama")
    trainer = AutoParallelTrainer(model, _sgd(model.parameters()), plan=H.make_plan(model), max_grad_norm=math.inf)
    losses, norms = [], []
    for tokens in H.batches("tiny-llama"):
        losses.append(trainer.step(tokens))
        norms.append(trainer.grad_norm)
    check(losses, norms, trainer.full_state_dict(), clipped)


def test_without_max_grad_norm_there_is_no_norm():
    model = H.build("tiny-gpt")
    trainer = AutoParallelTrainer(model, _sgd(model.parameters()), plan=H.make_plan(model))
    trainer.step(H.batches("tiny-gpt", 1)[0])
    assert trainer.grad_norm is None


@pytest.mark.parametrize("value", [0, -1.0, math.nan, True, "1.0", [1.0]])
def test_a_bad_max_grad_norm_is_one_error(value):
    model = H.build("tiny-gpt")
    with pytest.raises(UserError, match=r"^max_grad_norm: expected a positive number") as err:
        AutoParallelTrainer(model, _sgd(model.parameters()), plan=H.make_plan(model), max_grad_norm=value)
    assert "\n" not in str(err.value)


# ---- many processes ---------------------------------------------------------------------------------
WORLD2 = [
    Config("gpt-dp2", "tiny-gpt", {"dp": 2, "micro_batch": 2}),                  # replicated (zero 0)
    Config("llama-fsdp2-zero3", "tiny-llama", {"dp": 2, "zero": 3, "micro_batch": 2}),
    Config("gpt-tp2-sp", "tiny-gpt", {"tp": 2, "sp": True, "micro_batch": 4}),
    Config("llama-tp2-sp", "tiny-llama", {"tp": 2, "sp": True, "micro_batch": 4}),
    Config("gpt-pp2", "tiny-gpt", {"pp": 2, "micro_batch": 4}),                   # tied embedding split
    Config("llama-pp2-interleaved", "tiny-llama", {"pp": 2, "vpp": 2, "micro_batch": 2}),
    Config("moe-ep2", "tiny-moe", {"ep": 2, "micro_batch": 2}),
]
WORLD4 = [
    Config("llama-dp2xtp2-sp", "tiny-llama", {"dp": 2, "tp": 2, "sp": True, "micro_batch": 2}),
    Config("gpt-pp2xdp2-zero1", "tiny-gpt", {"pp": 2, "dp": 2, "zero": 1, "micro_batch": 2}),
    Config("gpt-pp2xtp2-sp", "tiny-gpt", {"pp": 2, "tp": 2, "sp": True, "micro_batch": 4}),
    Config("moe-ep2xdp2-zero3", "tiny-moe", {"ep": 2, "dp": 2, "zero": 3, "micro_batch": 1}),
    Config("moe-ep2xtp2-sp", "tiny-moe", {"ep": 2, "tp": 2, "sp": True, "micro_batch": 2}),
]


def _train_clipped(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    model = H.build(cfg.model)
    trainer = AutoParallelTrainer(model, _sgd(model.parameters()), plan=H.make_plan(model, **cfg.plan),
                                  max_grad_norm=MAX_NORM)
    losses, norms = [], []
    for tokens in H.batches(cfg.model):
        losses.append(trainer.step(tokens))
        norms.append(trainer.grad_norm)
    torch.save(trainer.full_state_dict(), out / f"{cfg.name}.rank{rank}.pt")
    return {"losses": losses, "norms": norms}


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("clip2")
    H.run_spawned(2, WORLD2, out, train=_train_clipped)
    return out


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("clip4")
    H.run_spawned(4, WORLD4, out, train=_train_clipped)
    return out


def _check_spawned(out: Path, cfg: Config, world: int) -> None:
    per_rank = H.rank_results(out, cfg.name, world)
    assert all(r["norms"] == per_rank[0]["norms"] for r in per_rank), [r["norms"] for r in per_rank]
    check(per_rank[0]["losses"], per_rank[0]["norms"], H.gathered_params(out, cfg.name), reference_of(cfg.model))


@functools.cache
def reference_of(model: str) -> tuple:
    return reference(model)


@pytest.mark.parametrize("cfg", WORLD2, ids=lambda c: c.name)
def test_two_processes_clip_the_global_norm(cfg, world2):
    _check_spawned(world2, cfg, 2)


@pytest.mark.parametrize("cfg", WORLD4, ids=lambda c: c.name)
def test_four_processes_clip_the_global_norm(cfg, world4):
    _check_spawned(world4, cfg, 4)
