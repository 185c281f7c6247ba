"""Context parallelism (plan field cp, ring attention) on CPU/gloo in fp32: cp2 x dp2 and cp2 x tp2 (+SP)
training equals a plain single-process loop (per-step losses within LOSS_RTOL, final parameters within
PARAM_ATOL, the tolerances derived in trainer_helpers), plus the plan checks and refusals.

Why the derived tolerances hold under cp too: a cp rank computes its tokens' attention as cp partial
softmaxes merged through their log-sum-exp (torch's _SDPAMerger, in fp32): with cp = 2 each output gets
at most one merge, out - sigmoid(lse_b - lse) * (out - out_b), a handful of roundings (<= 4 u relative),
and the tokens' gradients are summed over dp*cp ranks instead of dp: the same 128 token positions in
another order, which the depth-7 pairwise bound GRAD_NOISE already covers. A wrong chunk order (positions
not load-balanced like the tokens) or a missing ring step moves the loss by > 1e-2, far above LOSS_RTOL.
"""

from __future__ import annotations

import functools

import pytest
import torch
import trainer_helpers as H
from trainer_helpers import Config

from autoparallel.errors import UserError
from autoparallel.plan import Plan

CP4 = [
    Config("llama-cp2xdp2", "tiny-llama", {"cp": 2, "dp": 2, "micro_batch": 2}),
    Config("llama-cp2xtp2-sp", "tiny-llama", {"cp": 2, "tp": 2, "sp": True, "micro_batch": 4}),
    Config("llama-cp2xtp2-zero3", "tiny-llama", {"cp": 2, "tp": 2, "zero": 3, "micro_batch": 2}),
    Config("gpt-cp2xdp2-zero3", "tiny-gpt", {"cp": 2, "dp": 2, "zero": 3, "micro_batch": 4}),
    Config("moe-cp2xep2", "tiny-moe", {"cp": 2, "ep": 2, "micro_batch": 2}),
]


@functools.cache
def reference(model: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    return H.reference(model)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp4")
    H.run_spawned(4, CP4, out)
    return out


@pytest.mark.parametrize("cfg", CP4, ids=lambda c: c.name)
def test_cp_equals_one_process(cfg, world4):
    res = H.result(world4, cfg.name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    per_rank = [H.result_of_rank(world4, cfg.name, r)["losses"] for r in range(4)]
    assert all(losses == per_rank[0] for losses in per_rank), f"ranks disagree on the loss: {per_rank}"
    ref_losses, ref_params = reference(cfg.model)
    for step, (a, b) in enumerate(zip(res["losses"], ref_losses, strict=True)):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b), f"step {step}: loss {a} != single-process {b}"
    params = H.gathered_params(world4, cfg.name)
    assert set(params) == set(ref_params)
    for name, ref in ref_params.items():
        diff = (params[name] - ref).abs().max().item()
        assert diff <= H.PARAM_ATOL, f"{name}: max |param - single-process| = {diff:.2e}"


def _plan(**kw) -> Plan:
    base = dict(model="m", hardware="h100-sxm", gpus=8, gpus_per_node=8, global_batch=8, seq_len=64)
    base.update(kw)
    return Plan(**base)


def test_plan_cp_field_validation_and_round_trip(tmp_path):
    p = _plan(dp=2, cp=2, tp=2)
    assert p.mesh_shape == {"pp": 1, "dp": 2, "cp": 2, "ep": 1, "tp": 2}
    assert (p.dense_dp, p.expert_dp, p.num_micro_batches) == (4, 4, 4)  # cp ranks share rows
    assert "cp=2 (intra)" in str(p) and "cp=" not in str(_plan(dp=8))
    p.save(tmp_path / "p.yaml")
    assert Plan.load(tmp_path / "p.yaml") == p
    with pytest.raises(UserError, match="does not equal gpus"):
        _plan(dp=4, cp=4).validate()
    with pytest.raises(UserError, match=r"seq_len 64 is not divisible by 2\*cp = 128"):
        _plan(gpus=64, dp=1, cp=64).validate()


def test_trainer_refuses_what_cp_cannot_run():
    from autoparallel.trainer.context_parallel import check_cp_model

    check_cp_model(H.build("tiny-llama"), False, 2)  # our models take positions
    with pytest.raises(UserError, match="accept `positions`"):
        check_cp_model(H.build("mha"), False, 2)
    with pytest.raises(UserError, match="Hugging Face"):
        check_cp_model(H.build("tiny-llama"), True, 2)
