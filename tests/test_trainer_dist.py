"""Multi-process equivalence of AutoParallelTrainer (CPU, gloo, fp32): every parallel layout trains the
tiny gpt / llama / moe models (and a user nn.MultiheadAttention model) to the same per-step losses
(LOSS_RTOL) and the same final parameters (PARAM_ATOL absolute, gathered from the shards) as a plain
single-process loop; kill-and-resume across plans; misuse errors raised on every rank. Both tolerances
are derived in trainer_helpers from fp32 summation order, Adam's gain LR / EPS and the step count.

One torch.multiprocessing spawn per world size (2 and 4) runs all its configurations in one process
group (trainer_helpers.worker); the tests then check each configuration's recorded results. See
test_trainer.py for why AdamW runs with eps=1e-4.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.trainer import AutoParallelTrainer

MODELS = {"gpt": "tiny-gpt", "llama": "tiny-llama", "moe": "tiny-moe"}


def _per_model(tag: str, plan: dict) -> list[Config]:
    return [Config(f"{short}-{tag}", model, plan) for short, model in MODELS.items()]


WORLD2: list[Config] = [
    *_per_model("dp2", {"dp": 2, "micro_batch": 2}),                                   # DDP-style, 2 micro
    *_per_model("fsdp2-zero3-fullac", {"dp": 2, "zero": 3, "micro_batch": 2, "recompute": "full"}),
    *_per_model("tp2-sp-selac", {"tp": 2, "sp": True, "micro_batch": 4, "recompute": "selective"}),
    *_per_model("pp2-1f1b", {"pp": 2, "micro_batch": 4}),
    *_per_model("pp2-interleaved", {"pp": 2, "vpp": 2, "micro_batch": 2}),
    Config("moe-ep2", "tiny-moe", {"ep": 2, "micro_batch": 2}),
    Config("llama-fsdp2-zero1", "tiny-llama", {"dp": 2, "zero": 1, "micro_batch": 1}),
    Config("gpt-fsdp2-zero2", "tiny-gpt", {"dp": 2, "zero": 2, "micro_batch": 2}),
    Config("gpt-tp2-nosp-userloss", "tiny-gpt", {"tp": 2, "micro_batch": 4}, user_loss=True),
    Config("gpt-tp2-replicated-vocab-ends", "tiny-gpt", {"tp": 2, "micro_batch": 4, "replicate_ends": True}),
    # kill-and-resume: save after step k, rebuild model (another seed) + trainer under another plan, load
    Config("llama-resume-dp2-to-tp2sp", "tiny-llama", {"dp": 2, "micro_batch": 2},
           resume={"stop": 2, "plan": {"tp": 2, "sp": True, "micro_batch": 4}}),
    Config("gpt-resume-pp2-to-fsdp2", "tiny-gpt", {"pp": 2, "micro_batch": 4},   # tie split, then joined
           resume={"stop": 2, "plan": {"dp": 2, "zero": 3, "micro_batch": 2}}),
    Config("moe-resume-ep2-to-pp2", "tiny-moe", {"ep": 2, "micro_batch": 2},
           resume={"stop": 2, "plan": {"pp": 2, "micro_batch": 4}}),
    Config("moe-resume-ep2-same-plan", "tiny-moe", {"ep": 2, "micro_batch": 2}, resume={"stop": 2}),
    # ranks that built their models from different seeds still start from rank 0's weights
    Config("moe-tp2-sp-rankseeds", "tiny-moe", {"tp": 2, "sp": True, "micro_batch": 4}, rank_seeds=True),
]
META2: list[Config] = [  # meta-device models: initialized shard by shard, identical replicas across ranks
    Config("meta-moe-tp2-sp", "tiny-moe", {"tp": 2, "sp": True, "micro_batch": 4}, meta=True),
    Config("meta-gpt-pp2", "tiny-gpt", {"pp": 2, "micro_batch": 4}, meta=True),
    Config("meta-llama-fsdp2", "tiny-llama", {"dp": 2, "zero": 3, "micro_batch": 4}, meta=True),
]
MISUSE2: list[tuple[Config, str]] = [
    (Config("misuse-world", "tiny-llama", {"dp": 4}), r"plan is for 4 processes .* but 2 are running"),
    (Config("misuse-batch", "tiny-llama", {"dp": 2, "micro_batch": 2}, rows=6),
     r"batch of 6 rows is not divisible by dp\*ep\*micro_batch = 4"),
]
WORLD4: list[Config] = [
    *_per_model("dp2xtp2-sp", {"dp": 2, "tp": 2, "sp": True, "micro_batch": 2}),
    *_per_model("pp2xdp2", {"pp": 2, "dp": 2, "zero": 1, "micro_batch": 2}),
    *_per_model("pp2xtp2-sp", {"pp": 2, "tp": 2, "sp": True, "micro_batch": 4}),
    Config("llama-pp2xdp2-interleaved-zero3", "tiny-llama", {"pp": 2, "dp": 2, "vpp": 2, "zero": 3, "micro_batch": 1}),
    Config("moe-ep2xdp2", "tiny-moe", {"ep": 2, "dp": 2, "micro_batch": 1}),
    Config("moe-ep2xdp2-zero3", "tiny-moe", {"ep": 2, "dp": 2, "zero": 3, "micro_batch": 1}),
    Config("moe-ep4", "tiny-moe", {"ep": 4, "micro_batch": 1}),
    Config("moe-ep2xtp2-sp-selac", "tiny-moe", {"ep": 2, "tp": 2, "sp": True, "micro_batch": 2,
                                                 "recompute": "selective"}),
    Config("llama-fsdp4", "tiny-llama", {"dp": 4, "zero": 3, "micro_batch": 1}),
    Config("gpt-pp4", "tiny-gpt", {"pp": 4, "micro_batch": 2}),
    Config("mha-dp2xtp2", "mha", {"dp": 2, "tp": 2, "micro_batch": 2}),
    Config("llama-pp2xtp2-sp-userloss", "tiny-llama", {"pp": 2, "tp": 2, "sp": True, "micro_batch": 4},
           user_loss=True),
    Config("llama-resume-dp2xtp2-to-pp2xdp2", "tiny-llama", {"dp": 2, "tp": 2, "sp": True, "micro_batch": 2},
           resume={"stop": 2, "plan": {"pp": 2, "dp": 2, "micro_batch": 2}}),
    Config("gpt-resume-pp2xtp2-to-dp4", "tiny-gpt", {"pp": 2, "tp": 2, "sp": True, "micro_batch": 4},
           resume={"stop": 2, "plan": {"dp": 4, "zero": 2, "micro_batch": 1}}),
]


@functools.cache
def reference(model: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    return H.reference(model)


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("world2")
    H.run_spawned(2, WORLD2 + META2 + [c for c, _ in MISUSE2], out)
    return out


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("world4")
    H.run_spawned(4, WORLD4, out)
    return out


def check_equivalent(out, cfg: Config, world: int) -> None:
    H.assert_equivalent(out, cfg.name, world, reference(cfg.model))


@pytest.mark.parametrize("cfg", WORLD2, ids=lambda c: c.name)
def test_two_processes(cfg, world2):
    check_equivalent(world2, cfg, 2)


@pytest.mark.parametrize("cfg", WORLD4, ids=lambda c: c.name)
def test_four_processes(cfg, world4):
    check_equivalent(world4, cfg, 4)


def test_trainers_of_one_process_share_their_process_groups(world2):
    """A trainer whose mesh (and tied-weight groups) an earlier trainer of the process already made takes
    that trainer's process groups instead of making new ones (runtime.ProcessGroups): each group holds a
    communicator torch never frees, and 50 trainers' worth slowed a four-rank gloo group 15x."""
    assert H.result_of_rank(world2, "gpt-dp2", 0)["groups_made"] > 0      # the first dp2 trainer made its mesh
    for name in ("llama-dp2", "llama-fsdp2-zero1", "llama-pp2-1f1b", "gpt-pp2-interleaved", "moe-resume-ep2-same-plan"):
        for rank in range(2):
            assert H.result_of_rank(world2, name, rank)["groups_made"] == 0, (name, rank)


@pytest.mark.parametrize("cfg", META2, ids=lambda c: c.name)
def test_meta_models_materialize_consistently(cfg, world2):
    res = H.result(world2, cfg.name)
    assert "error" not in res, res.get("traceback")
    losses = res["losses"]
    assert abs(losses[0] - math.log(256)) < 0.05  # a fresh N(0, 0.02) init predicts ~uniformly
    assert all(math.isfinite(x) for x in losses)
    p0, p1 = (H.params_of_rank(world2, cfg.name, r) for r in range(2))
    common = set(p0) & set(p1)
    assert common or cfg.plan.get("pp", 1) > 1
    for name in common:  # replicas (and gathered shards) agree although the ranks' RNGs differed
        assert torch.equal(p0[name], p1[name]), name
    for name, p in (p0 | p1).items():
        if name.endswith(("q_proj.weight", "experts.w1")):
            assert 0.015 < p.std().item() < 0.025, (name, p.std().item())  # init_weights: N(0, 0.02)
    if cfg.plan.get("pp", 1) > 1:  # the two stages hold different blocks, drawn from different streams
        a, b = p0["layers.0.attn.q_proj.weight"], p1["layers.2.attn.q_proj.weight"]
        assert not torch.equal(a, b)
        assert torch.equal(p0["tok_embeddings.weight"], p1["lm_head.weight"])  # tied copies start equal


@pytest.mark.parametrize("cfg,message", MISUSE2, ids=lambda c: c.name if isinstance(c, Config) else "")
def test_misuse_raises_user_error_on_every_rank(cfg, message, world2):
    import re

    for rank in range(2):
        res = H.result_of_rank(world2, cfg.name, rank)
        assert res.get("error_type") == "UserError", res
        assert re.search(message, res["error"]), res["error"]
        assert "\n" not in res["error"]


@pytest.mark.parametrize("cfg", [c for c in WORLD4 if c.resume], ids=lambda c: c.name)
def test_checkpoint_from_four_processes_resumes_in_one(cfg, world4):
    """The checkpoint a 4-process plan wrote (at step k) loads into a single process and continues
    exactly like the uninterrupted single-process run."""
    model = H.build(cfg.model, seed=5)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model, micro_batch=4))
    trainer.load_checkpoint(world4 / f"{cfg.name}.ckpt")
    stop = cfg.resume["stop"]
    assert trainer.steps == stop
    losses = [trainer.step(b) for b in H.batches(cfg.model)[stop:]]
    ref_losses, ref_params = reference(cfg.model)
    for a, b in zip(losses, ref_losses[stop:], strict=True):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b)
    params = trainer.full_state_dict()
    assert max((params[n] - p).abs().max().item() for n, p in ref_params.items()) <= H.PARAM_ATOL
