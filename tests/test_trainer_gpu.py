"""AutoParallelTrainer on a CUDA device (skipped without one): the local path, the distributed path
(nccl, one process: FSDP2 on a one-rank mesh, bf16 mixed precision), and torch.compile per block.
Multi-GPU layouts are covered on CPU by test_trainer_dist.py (same code, gloo instead of nccl)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import trainer_helpers as H

from autoparallel.trainer import AutoParallelTrainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def gpu_reference(name: str) -> list[float]:
    model = H.build(name).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS)
    out = []
    for tokens in H.batches(name):
        tokens = tokens.cuda()
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, -2).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def run(name: str, **plan_kw) -> tuple[list[float], AutoParallelTrainer]:
    model = H.build(name)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model, **plan_kw.pop("plan", {})), **plan_kw)
    return [trainer.step(b) for b in H.batches(name)], trainer


@pytest.fixture
def one_rank_group():
    # A trainer built earlier in this process on the GPU started a one-rank NCCL group itself (one GPU
    # runs FSDP2 like N); reuse it, as the trainer reuses an initialized group.
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    yield
    if started:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-moe"])
def test_local_cuda_matches_plain_loop(name):
    ref = gpu_reference(name)
    losses, trainer = run(name, plan={"micro_batch": 4})
    assert trainer.device.type == "cuda"
    for a, b in zip(losses, ref, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)


@pytest.mark.parametrize("zero", [0, 3])
def test_nccl_fsdp_one_rank_fp32_matches(zero, one_rank_group):
    ref = gpu_reference("tiny-gpt")
    losses, _ = run("tiny-gpt", plan={"micro_batch": 4, "zero": zero, "recompute": "selective"})
    for a, b in zip(losses, ref, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)


def test_nccl_bf16_mixed_precision_trains(one_rank_group):
    model = H.build("tiny-llama")
    plan = H.with_plan(H.make_plan(model, micro_batch=4, zero=3), param_dtype="bf16", grad_reduce_dtype="fp32")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan)
    losses = [trainer.step(b) for b in H.batches("tiny-llama")]
    ref = gpu_reference("tiny-llama")
    assert all(math.isfinite(x) for x in losses)
    assert max(abs(a - b) for a, b in zip(losses, ref, strict=True)) < 5e-2  # bf16 compute, fp32 master
    assert trainer.full_state_dict()["norm.weight"].dtype == torch.float32


def test_compile_per_block_matches_eager():
    ref = gpu_reference("tiny-llama")
    losses, trainer = run("tiny-llama", plan={"micro_batch": 4}, compile=True)
    for a, b in zip(losses, ref, strict=True):
        assert abs(a - b) <= 1e-4 * abs(b)
