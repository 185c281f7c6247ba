"""A model handed to AutoParallelTrainer in 16 bits (from_pretrained(dtype=torch.bfloat16), .half()) trains with
fp32 master parameters and fp32 optimizer state, as the plan's mixed precision (and the cost model's memory)
assume: exactly as the same weights upcast to fp32 train in a plain single-process loop, at trainer_helpers'
LOSS_RTOL and PARAM_ATOL. Kept in bf16, Adam's first step (~LR = 1e-3 relative) would be lost to bf16 rounding
(2^-8 relative) on most parameters: far outside PARAM_ATOL."""

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


def _bf16_model(name: str) -> torch.nn.Module:
    return H.build(name).to(torch.bfloat16)


@functools.cache
def reference(name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The bf16 weights upcast to fp32, trained by the plain loop."""
    model = _bf16_model(name).float()
    return H.adamw_loop(model, H.batches(name), lambda m, t: F.cross_entropy(
        m(t[:, :-1]).flatten(0, -2).float(), t[:, 1:].flatten()))


def _train(cfg: Config, out: Path | None, rank: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    model = _bf16_model(cfg.model)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model, **cfg.plan))
    losses = [trainer.step(t) for t in H.batches(cfg.model)]
    dtypes = sorted({str(p.dtype) for part in trainer.model_parts for p in part.parameters()}
                    | {str(v.dtype) for opt in trainer.optimizers for s in opt.state.values() for v in s.values()
                       if isinstance(v, torch.Tensor) and v.is_floating_point()})
    params = trainer.full_state_dict()
    if out is not None:
        torch.save(params, out / f"{cfg.name}.rank{rank}.pt")
    return {"losses": losses, "dtypes": dtypes, "user_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "params": None if out is not None else params}


def test_one_process_trains_fp32_masters_of_a_bf16_model():
    res = _train(Config("one", "tiny-llama", {"micro_batch": 2}), None, 0)
    assert res["dtypes"] == ["torch.float32"]
    assert res["user_dtypes"] == ["torch.bfloat16"]  # the user's model is left as it was
    ref_losses, ref_params = reference("tiny-llama")
    for a, b in zip(res["losses"], ref_losses, strict=True):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b)
    for name, want in ref_params.items():
        assert (res["params"][name] - want).abs().max().item() <= H.PARAM_ATOL, name


WORLD2 = [
    Config("gpt-fsdp2-zero3", "tiny-gpt", {"dp": 2, "zero": 3, "micro_batch": 2}),   # tied embedding
    Config("moe-tp2-sp", "tiny-moe", {"tp": 2, "sp": True, "micro_batch": 4}),
    Config("gpt-pp2", "tiny-gpt", {"pp": 2, "micro_batch": 4}),
]


def _spawned(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    res = _train(cfg, out, rank)
    res.pop("params")
    return res


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    out = tmp_path_factory.mktemp("masters2")
    H.run_spawned(2, WORLD2, out, train=_spawned)
    return out


@pytest.mark.parametrize("cfg", WORLD2, ids=lambda c: c.name)
def test_two_processes_train_fp32_masters_of_a_bf16_model(cfg, world2):
    assert all(r["dtypes"] == ["torch.float32"] for r in H.rank_results(world2, cfg.name, 2))
    H.assert_equivalent(world2, cfg.name, 2, reference(cfg.model))


def test_a_bf16_hugging_face_model_exports_in_bf16(tmp_path):
    """save_pretrained writes the dtype the model was handed in (what from_pretrained(dtype=...) loaded), the
    fp32 masters rounded to it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), global_batch_size=4,
                                  seq_len=16)
    ids = torch.randint(0, 128, (4, 16))
    trainer.step({"input_ids": ids, "labels": ids})
    masters = trainer.full_state_dict()
    assert {t.dtype for t in masters.values()} == {torch.float32}
    trainer.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert back.dtype == torch.bfloat16
    for name, p in back.named_parameters():
        assert torch.equal(p, masters[name].to(torch.bfloat16)), name
