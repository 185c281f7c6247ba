"""Low precision in the plan space: the fp8 plan field and int8 gradient reduction (plan, cost model,
planner, CLI, trainer). The multi-process part runs one 4-process gloo group: Int8ReduceScatter against
its error bound, and 30 steps of int8 vs fp32 gradient reduction under dp4 (docs/low_precision.md: 50)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import trainer_helpers as H

from autoparallel.cli import main
from autoparallel.errors import UserError
from autoparallel.plan import Plan
from cost_models.comm import (
    GRAD_WIRE_BYTES,
    INT8_BLOCK,
    collective_time,
    link_for,
    megatron_dp_schedule,
    quantized_pass_bytes,
)
from cost_models.compute import fp8_gemm_times, op_times
from cost_models.estimate import dp_sync_time
from hardware_profiles import load_profile

INT8_STEPS = 30
WORLD = 4


def _plan(**kw) -> Plan:
    base = dict(model="m", hardware="h200", gpus=4, gpus_per_node=8, global_batch=8, seq_len=16, dp=4,
                zero=2, recompute=("none",) * 4)
    return Plan(**{**base, **kw})


# ---- plan ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_plan_low_precision_fields_round_trip(tmp_path: Path, suffix: str):
    plan = _plan(fp8=("tensorwise", "rowwise", "none", "tensorwise"), grad_reduce_dtype="int8")
    path = tmp_path / f"plan{suffix}"
    plan.save(path)
    assert Plan.load(path) == plan
    assert "fp8" not in _plan().to_dict()  # plans without FP8 keep the files they always had
    assert "fp8         none x1, rowwise x1, tensorwise x2" in str(plan)


@pytest.mark.parametrize("kw, needle", [
    (dict(fp8=("e4m3",) * 4), "fp8 recipe 'e4m3'"),
    (dict(grad_reduce_dtype="int4"), "grad_reduce_dtype='int4'"),
    (dict(param_dtype="int8"), "param_dtype='int8'"),       # int8 is a reduction dtype only
])
def test_plan_rejects_bad_low_precision_values(kw, needle):
    with pytest.raises(UserError, match=needle):
        Plan.from_dict(_plan(**kw).to_dict())


def test_runnable_plans_keep_low_precision_where_the_trainer_runs_it():
    with pytest.raises(UserError, match="fp8 has 3 entries"):
        _plan(fp8=("tensorwise",) * 3).validate(4)
    with pytest.raises(UserError, match="needs zero >= 1"):
        _plan(zero=0, grad_reduce_dtype="int8").check_runnable(4)
    _plan(zero=0, grad_reduce_dtype="int8", dp=1, gpus=1).check_runnable(4)  # nothing is reduced
    _plan(dp=2, tp=2, placements={"x": "colwise"}, fp8=("tensorwise",) * 4).check_runnable(4)  # FP8 under tp runs


# ---- cost model --------------------------------------------------------------------------------------------
def test_int8_reduction_moves_a_quarter_of_the_bytes_plus_its_quantize_passes():
    h200 = load_profile("h200")
    link = link_for(h200, "inter")
    params, d, qbw = 1e9, 16, 3e12
    zero2 = megatron_dp_schedule(2, 1)  # one micro-batch: one reduction, one gather
    fp32 = dp_sync_time(params, d, link, 2, zero2, "fp32", 2)
    int8 = dp_sync_time(params, d, link, 2, zero2, "int8", 2, qbw)
    gather = collective_time("all_gather", params * 2, d, link)
    # ZeRO-2: one reduce-scatter of 1 + 4/256 bytes per element, the quantize/dequantize passes, one all-gather
    assert GRAD_WIRE_BYTES["int8"] == 1 + 4 / INT8_BLOCK
    expect = collective_time("reduce_scatter", params * GRAD_WIRE_BYTES["int8"], d, link) + \
        params * quantized_pass_bytes("reduce_scatter", d) / qbw + gather
    assert math.isclose(int8, expect, rel_tol=1e-12)
    assert int8 - gather < (fp32 - gather) / 3  # across nodes the wire dominates: int8 is > 3x cheaper
    # ZeRO-0 all-reduces: reduce-scatter + all-gather of int8 payloads, two rounds of passes
    ar = dp_sync_time(params, d, link, 0, megatron_dp_schedule(0, 1), "int8", 2, qbw)
    assert math.isclose(ar, collective_time("all_reduce", params * GRAD_WIRE_BYTES["int8"], d, link)
                        + params * quantized_pass_bytes("all_reduce", d) / qbw, rel_tol=1e-12)
    assert quantized_pass_bytes("all_reduce", d) > quantized_pass_bytes("reduce_scatter", d)


@pytest.mark.parametrize("compiled", [False, True])
def test_fp8_gemm_beats_bf16_on_large_gemms_not_on_tiny_ones(compiled: bool):
    """An n^3 GEMM: FP8 halves the O(n^3) matrix work and adds O(n^2) casts, so it wins from some size on:
    at 8192 once the casts are fused (compiled), only at 32768 with eager torchao's unfused casts (34 bytes
    per operand element: compute.FP8_CAST_BYTES); a 64^3 GEMM is launch-bound and only gains kernels."""
    h200 = load_profile("h200")
    large = 8192 if compiled else 32768
    for n, faster in ((large, True), (64, False)):
        flops = np.array([2.0 * n**3])
        bf16 = op_times(flops, np.array([3 * 2.0 * n * n]), np.array([True]), h200, "bf16")
        fp8 = fp8_gemm_times(flops, np.array([2.0 * n * n]), h200, "tensorwise", compiled)
        if faster:
            assert fp8[0] < 0.8 * bf16[0], (n, fp8, bf16)
        else:
            assert fp8[0] >= bf16[0], (n, fp8, bf16)
        rowwise = fp8_gemm_times(flops, np.array([2.0 * n * n]), h200, "rowwise", compiled)
        assert rowwise[0] >= fp8[0]                        # rowwise casts every operand of every GEMM


def test_megatron_fp8_issues_no_torchao_cast_kernels():
    """Transformer Engine fuses its FP8 casts (as Inductor does): under the Megatron runtime an eager FP8 block
    pays the fused casts' bytes and no torchao cast kernels on the host; the trainer's eager FP8 block pays
    FP8_EAGER_KERNELS per GEMM on top of its ops."""
    from autoparallel.api import context
    from cost_models.compute import FP8_EAGER_KERNELS
    ctx = {rt: context("llama3-8b", "h100-sxm", 8, 2048, runtime=rt) for rt in ("trainer", "megatron")}
    for rt, c in ctx.items():
        cm = c.cost_model
        seg = cm.segments({}, False)[cm.block_rep(0)]
        gemms = int(seg.fwd.fp8_gemm.sum())
        assert gemms == 7
        floors = {fp8: cm._phase_times(seg.fwd, "fwd", 1, 1, False, 1.0, fp8=fp8)[3] for fp8 in ("none", "tensorwise")}
        extra = floors["tensorwise"] - floors["none"]
        if rt == "megatron":
            assert extra == pytest.approx(0.0, abs=1e-15)
        else:
            per_op = floors["none"] / len(seg.fwd.flops)
            assert extra == pytest.approx(gemms * FP8_EAGER_KERNELS["tensorwise"] * per_op, rel=1e-9)


def test_calibrate_fits_the_fp8_gemm_curve_the_cost_model_reads():
    """FP8 GEMM samples timed by compute.fp8_gemm_times (no casts: calibrate times torch._scaled_mm
    alone) under gemm_fp8_max = 0.6 fit back to 0.6, and the profile calibrate writes carries it."""
    from autoparallel import calibrate as cal
    from cost_models.compute import fp8_gemm_curve
    base = load_profile("h200")
    truth = dataclasses.replace(base, calibration={**base.calibration, "gemm_fp8_max": 0.6})
    assert fp8_gemm_curve(truth, "tensorwise")[0] == 0.6 and fp8_gemm_curve(base, "tensorwise")[0] == \
        base.efficiency.gemm_max                          # default: the bf16 curve's maximum until measured
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192)] + [(16384, 2048, 5632), (16384, 4096, 14336)]
    fp8 = [cal.GemmSample(m, n, k, "fp8", "nn", 0.0) for m, n, k in shapes]
    fp8 = [dataclasses.replace(x, seconds=float(fp8_gemm_times(np.array([x.flops]), np.zeros(1), truth, "tensorwise",
                                                               True)[0])) for x in fp8]
    bf16 = [cal.GemmSample(m, n, k, "bf16", "nn", 0.0) for m, n, k in shapes]
    bf16 = [dataclasses.replace(x, seconds=float(op_times(np.array([x.flops]), np.array([x.bytes]), np.array([True]),
                                                          truth, "bf16")[0])) for x in bf16]
    copy = cal.BandwidthSample("copy", 2**30, 2**30 / (truth.memory_bandwidth * truth.efficiency.memory_bound))
    meas = cal.Measurements("cuda:0", "H200", "x", "today", gemm=bf16 + fp8, bandwidth=[copy],
                            launch_graph_s=truth.efficiency.kernel_overhead_s)
    f = cal.fit(meas, truth)
    assert f.gemm_fp8 == pytest.approx(0.6, abs=0.005)
    assert cal.profile_extra(truth, meas, f)["calibration"]["gemm_fp8_max"] == pytest.approx(0.6, abs=0.005)
    assert cal.measure_fp8_gemms(torch.device("cpu"), cal.CalibrationPlan.quick(), print, 2**20) == []


def _run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_uses_fp8_only_when_asked_and_where_it_pays(capsys):
    args = ["plan", "llama3-8b", "--hardware", "h200", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
            "--quiet", "--top", "0", "--fix", "compile=1"]
    rc, out, _ = _run_cli(capsys, *args, "--json")
    assert rc == 0
    import json
    bf16 = json.loads(out)
    assert "fp8" not in bf16["plan"]                    # default bf16: FP8 changes numerics, so only when asked
    rc, out, _ = _run_cli(capsys, *args, "--json", "--precision", "fp8")
    fp8 = json.loads(out)
    assert fp8["plan"]["fp8"] == ["tensorwise"] * 32
    assert fp8["predicted"]["step_time_s"] < 0.9 * bf16["predicted"]["step_time_s"]
    rc, out, _ = _run_cli(capsys, *args, "--precision", "fp8")
    assert "bought    fp8: -" in out
    # the planner's objective prices the FP8 blocks as the cost model's estimate of its plan does
    from autoparallel.api import plan_result
    res, _ = plan_result("llama3-8b", hardware="h200", gpus=8, global_batch=64, seq_len=4096, fix="compile=1",
                         top_k=0, precision="fp8")
    assert res.solver.objective == pytest.approx(res.estimate.step_time_s, rel=1e-6)
    # compare shows what FP8 bought per device, and plans a device without an FP8 peak in bf16
    rc, out, _ = _run_cli(capsys, "compare", "llama3-8b", "--hardware", "h200,a100-sxm-80gb", "--gpus", "8",
                          "--global-batch", "64", "--seq-len", "4096", "--quiet", "--fix", "compile=1",
                          "--precision", "fp8")
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert rc == 0 and "(fp8: -" in rows["h200"] and "no fp8 peak: bf16)" in rows["a100-sxm-80gb"]
    # a tiny model's GEMMs are launch-bound: asked for FP8, the planner keeps bf16 and says why
    rc, out, _ = _run_cli(capsys, "plan", "tiny-llama", "--hardware", "h200", "--gpus", "1", "--global-batch", "8",
                          "--seq-len", "128", "--quiet", "--precision", "fp8")
    assert rc == 0 and "note      --precision fp8: no block runs faster in FP8" in out


def test_precision_errors_are_one_line(capsys):
    rc, _, err = _run_cli(capsys, "plan", "tiny-llama", "--hardware", "a100-sxm-80gb", "--gpus", "1",
                          "--global-batch", "8", "--seq-len", "128", "--quiet", "--precision", "fp8")
    assert rc == 2 and err.count("\n") == 1 and "has no fp8 peak" in err and "Traceback" not in err
    rc, _, err = _run_cli(capsys, "plan", "tiny-llama", "--hardware", "h200", "--gpus", "2", "--global-batch", "8",
                          "--seq-len", "128", "--quiet", "--fix", "grad_reduce_dtype=int4")
    assert rc == 2 and "use fp32, bf16 or int8" in err


def test_planner_reduces_in_int8_only_when_pinned():
    from autoparallel.api import plan_result
    from autoparallel.report import choice_gains
    # one 1k-token sequence per GPU: the gradient sync across 8 nodes (8 NICs a node) outlasts the backward
    kw = dict(hardware="h100-sxm", gpus=64, global_batch=64, seq_len=1024, top_k=0)
    fp32, _ = plan_result("llama3-8b", fix="tp=1,pp=1", **kw)
    assert fp32.plan.grad_reduce_dtype == "fp32"      # never chosen silently: int8 changes numerics
    int8, ctx = plan_result("llama3-8b", fix="tp=1,pp=1,grad_reduce_dtype=int8", **kw)
    assert int8.plan.grad_reduce_dtype == "int8" and int8.plan.zero >= 1
    assert int8.estimate.step_time_s <= fp32.estimate.step_time_s
    same_fp32 = ctx.cost_model.estimate(dataclasses.replace(int8.plan, grad_reduce_dtype="fp32"))
    b = int8.estimate.breakdown
    # the reduce-scatter is wire-bound: int8 saves most of its ~3/4 of the bytes
    assert b["dp_comm_total_s"] < same_fp32.breakdown["dp_comm_total_s"]
    gains = choice_gains(ctx.cost_model, int8.plan, int8.estimate)
    assert set(gains) - {"compile"} == {"int8 grads"} and gains["int8 grads"] <= 0  # compile: the planner's post-pass


# ---- trainer: FP8 conversion (one process) ---------------------------------------------------------------------
def _fp8_trainer(recipe: str, steps: int, recompute: str = "none") -> tuple[list[float], object]:
    from autoparallel.trainer import AutoParallelTrainer
    torch.set_num_threads(1)
    model = H.build("tiny-llama")
    plan = H.make_plan(model, recompute=recompute)
    plan = dataclasses.replace(plan, fp8=(recipe,) * len(plan.recompute) if recipe != "none" else ())
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan)
    return [trainer.step(t) for t in H.batches("tiny-llama", 1) * steps], trainer


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_trainer_converts_the_block_linears_to_float8(recipe: str):
    pytest.importorskip("torchao.float8")
    ref, _ = _fp8_trainer("none", 3)
    losses, trainer = _fp8_trainer(recipe, 3)
    (model,) = trainer.model_parts
    float8 = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    expected = {f"layers.{i}.{p}" for i in range(4) for p in ("attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                               "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                               "mlp.down_proj")}
    assert float8 == expected == set(trainer.fp8_modules)   # lm_head and the embedding stay high precision
    # The first loss runs the same parameters through FP8 linears: e4m3 keeps 3 mantissa bits, so each
    # operand is rounded by at most 2^-4 relative; the rounding errors are unbiased and the loss averages
    # 128 token losses, so its relative change stays below one such rounding (2^-4).
    assert abs(losses[0] - ref[0]) <= 2**-4 * ref[0]
    assert losses[-1] < losses[0]                              # and it trains (one batch, three steps)


@pytest.mark.parametrize("recompute", ["op", "full"])
def test_fp8_blocks_recompute_the_same_values(recompute: str):
    """Activation checkpointing re-runs the FP8 casts and GEMMs on the same inputs (per-op SAC saves
    _scaled_mm outputs like mm's), so the losses are those without recompute, up to fp32 reordering."""
    pytest.importorskip("torchao.float8")
    ref, _ = _fp8_trainer("tensorwise", 3)
    losses, _ = _fp8_trainer("tensorwise", 3, recompute)
    assert losses == pytest.approx(ref, rel=H.LOSS_RTOL)


def test_fp8_without_torchao_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails as if torchao were absent
    with pytest.raises(UserError, match="pip install torchao"):
        _fp8_trainer("tensorwise", 1)


# ---- trainer: int8 gradient reduction (4 processes) --------------------------------------------------------------
def _int8_data() -> list[torch.Tensor]:
    """One batch, every step: the loss falls steadily, so L_0 - L_t measures what the updates did."""
    return H.batches("tiny-llama", 1) * INT8_STEPS


def _int8_worker(cfg: H.Config, out: Path, rank: int) -> dict:
    import torch.distributed as dist

    from autoparallel.trainer import AutoParallelTrainer
    from autoparallel.trainer.low_precision import Int8ReduceScatter
    if cfg.name == "comm":
        # every rank rebuilds every rank's input, so each can check its own shard of the exact mean
        n, chunk = dist.get_world_size(), 3 * INT8_BLOCK + 77       # a padded last block
        xs = [torch.randn(n * chunk, generator=torch.Generator().manual_seed(r))
              * torch.logspace(-3, 1, n * chunk) for r in range(n)]   # blocks of very different scales
        out_t = torch.empty(chunk)
        Int8ReduceScatter()(out_t, xs[rank].clone(), dist.group.WORLD, dist.ReduceOp.AVG)
        mine = torch.stack([x.view(n, chunk)[rank] for x in xs])     # [ranks, chunk]
        exact = mine.double().mean(0)
        # |error| <= sum over ranks of scale_r / 2 = absmax_{r,block} / 254, averaged over the n ranks, plus the
        # fp32 dequantize-and-sum rounding: n terms, at most n * 2^-24 * sum |terms| (terms <= |x| + scale/2)
        pad = (-chunk) % INT8_BLOCK
        absmax = F.pad(mine.abs(), (0, pad)).view(n, -1, INT8_BLOCK).amax(-1)
        per_elem = absmax.repeat_interleave(INT8_BLOCK, dim=1)[:, :chunk]
        bound = (per_elem / 254).sum(0) / n + n * 2.0**-24 * (mine.abs() + per_elem / 254).sum(0) / n
        err = (out_t.double() - exact).abs()
        return {"max_ratio": float((err / bound.double()).max()), "max_err": float(err.max())}
    model = H.build(cfg.model)
    if cfg.name == "fp8tp":  # FP8 linears under tensor + sequence parallelism and FSDP2
        plan = H.make_plan(model, dp=2, tp=2, sp=True, zero=2)
        plan = dataclasses.replace(plan, fp8=("tensorwise",) * len(plan.recompute))
        trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan)
        return {"losses": [trainer.step(t) for t in H.batches("tiny-llama", 1) * 3], "fp8": trainer.fp8_modules}
    plan = dataclasses.replace(H.make_plan(model, dp=WORLD, zero=2), grad_reduce_dtype=cfg.name)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan)
    return {"losses": [trainer.step(t) for t in _int8_data()]}


@pytest.fixture(scope="module")
def int8_world(tmp_path_factory):
    out = tmp_path_factory.mktemp("int8")
    configs = [H.Config("comm", "tiny-llama", {}), H.Config("fp32", "tiny-llama", {}),
               H.Config("int8", "tiny-llama", {}), H.Config("fp8tp", "tiny-llama", {})]
    H.run_spawned(WORLD, configs, out, train=_int8_worker)
    return out


def test_int8_reduce_scatter_stays_within_its_error_bound(int8_world):
    for rank in range(WORLD):
        r = H.result_of_rank(int8_world, "comm", rank)
        assert "error" not in r, r.get("traceback")
        assert 0 < r["max_ratio"] <= 1.0, r  # within the bound, and quantization did happen (error > 0)


def _quantization_gain() -> float:
    """R = sum over blocks of INT8_BLOCK * (mean over ranks of the block's absmax) / sum |reduced gradient|:
    how much larger than an element the int8 error bound of its block is, on average (>= 1), measured on
    the four ranks' first-step gradients of the tiny llama (blocks of the flattened gradient, as the
    reduce-scatter input is the units' flattened gradients)."""
    model = H.build("tiny-llama")
    tokens = _int8_data()[0]
    rows = tokens.shape[0] // WORLD
    grads = []
    for r in range(WORLD):
        model.zero_grad()
        t = tokens[r * rows:(r + 1) * rows]
        F.cross_entropy(model(t[:, :-1]).flatten(0, -2).float(), t[:, 1:].flatten()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    g = torch.stack(grads)
    absmax = F.pad(g.abs(), (0, (-g.shape[1]) % INT8_BLOCK)).view(WORLD, -1, INT8_BLOCK).amax(-1).mean(0)
    return float(absmax.sum() * INT8_BLOCK / g.mean(0).abs().sum())


def test_int8_gradient_reduction_tracks_fp32(int8_world):
    fp32, int8 = (H.result(int8_world, name) for name in ("fp32", "int8"))
    assert "error" not in fp32 and "error" not in int8, (fp32.get("traceback"), int8.get("traceback"))
    a, b = np.array(fp32["losses"]), np.array(int8["losses"])
    assert len(a) == len(b) == INT8_STEPS and a[-1] < a[0] - 1.0  # it trains: the test has something to track
    # Tolerance, first order. Each reduced gradient element errs by at most e_i = (mean over ranks of its
    # block's absmax) / 254. Adam moves every element by about LR per step whatever its gradient size, and
    # changes that move by at most 2 e_i / |g_i| relative (m_hat shifts by <= e_i, sqrt(v_hat) by <= e_i), so
    # the loss change a step buys, sum_i |g_i| * LR, changes by at most sum_i 2 e_i * LR: a fraction
    # 2 R / 254 of it (R: _quantization_gain). Summed over the steps: |L_t(int8) - L_t(fp32)| <=
    # 2 R / 254 * (L_0 - L_t), plus the fp32 reordering noise of the loss itself (LOSS_RTOL * L_t).
    gain = 2 * _quantization_gain() / 254
    assert gain < 0.5, gain  # a bound looser than half the progress could not catch a broken reduction
    tol = gain * np.maximum(a[0] - a, 0.0) + H.LOSS_RTOL * a
    assert np.all(np.abs(a - b) <= tol), (np.abs(a - b) / np.maximum(tol, 1e-12)).max()
    assert np.any(a != b)  # the int8 path ran (quantization moved the trajectory)


def test_fp8_runs_under_tensor_and_sequence_parallelism(int8_world):
    pytest.importorskip("torchao.float8")
    r = H.result(int8_world, "fp8tp")
    assert "error" not in r, r.get("traceback")
    assert len(r["fp8"]) == 28                     # every block linear, as in one process
    ref, _ = _fp8_trainer("tensorwise", 3)
    # The same FP8 computation split over tp2 x dp2: tensorwise scales are DTensor reductions and equal one
    # device's, so only summation order differs; an operand landing on the other side of an e4m3 rounding
    # boundary moves by at most one rounding (2^-4 relative), the bound the single-process test uses.
    assert all(abs(a - b) <= 2**-4 * b for a, b in zip(r["losses"], ref)), (r["losses"], ref)
