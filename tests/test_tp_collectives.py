"""Tensor + sequence parallelism runs exactly Megatron-LM's collectives (issue 14), counted on CPU.

Two gloo processes train a small llama (hidden 256, 4 heads / 2 kv, SwiGLU 512, vocab 256) under tp2 + SP
with the default loss (vocab-sharded logits, loss_parallel). A TorchDispatchMode sees every c10d call
(functional collectives, which DTensor issues, and in-place c10d ops); torch's ModTracker says whether it
ran in forward or backward and under which block. Collectives over one rank (the data-parallel wrapper's
group when dp = 1) move nothing and are left out.

The minimum, per transformer block of b*s tokens, hidden h, tp ranks (Megatron-LM's sequence parallelism,
Korthikanti et al. 2022, fig. 5: the operators g / g-bar around each of the two tensor-parallel regions):
  forward   all-gather of the sequence-sharded norm output before attention and before the MLP
            (input b*s*h/tp each, shared by q/k/v and by gate/up), reduce-scatter of the row-parallel
            output after o_proj and after down_proj (input b*s*h each): 2 AG + 2 RS.
  backward  the transposes: each forward all-gather becomes a reduce-scatter of the summed q/k/v (gate/up)
            input gradients, each reduce-scatter an all-gather of the output gradient: 2 AG + 2 RS,
            plus the replicated norm weights' partial gradients summed over the tp ranks: one all-reduce
            of h elements per norm (attn_norm, mlp_norm), i.e. 2 per block per micro-batch (Megatron
            sums them once per step; h elements each, latency only).
Around the blocks: the vocab-parallel embedding reduce-scatters its output (backward: all-gather); the
column-parallel LM head all-gathers its input (backward: reduce-scatter); the parallel cross entropy
all-reduces three [b*s] vectors (max logit, sum of exponentials, target logit); the final norm's weight
gradient is one all-reduce. Nothing else: no rotary table, mask or parameter moves between ranks.

Before this was pinned, every q/k/v/gate/up input gradient was all-reduced in backward (5 all-reduces of
b*s*h per block, each moving twice a reduce-scatter's bytes, instead of 2 reduce-scatters); and the
compiled blocks got the embedding's AsyncCollectiveTensor as block 0's input, which compiled block 0
twice and, under aot_eager, left the token embedding with a zero gradient (both checked below).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import trainer_helpers as H

from autoparallel.errors import UserError
from autoparallel.plan import Plan

TP = 2
LAYERS = 2
HIDDEN = 256
ROWS, SEQ = 8, 16
SPEC = {"model_type": "llama", "vocab_size": 256, "hidden_size": HIDDEN, "intermediate_size": 512,
        "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64}
TOKENS = ROWS * SEQ  # b*s of the one micro-batch


@dataclass
class Case:
    name: str
    compile: Any = None          # trainer compile= (a dict of torch.compile kwargs, or None)
    async_tp: bool = False
    sp: bool = True


CASES = [Case("count"), Case("count-nosp", sp=False), Case("eager"), Case("aot_eager", compile={"backend": "aot_eager"}),
         Case("async_tp_cpu", compile={"backend": "aot_eager"}, async_tp=True)]


def _model() -> torch.nn.Module:
    from autoparallel.models import build_model, load_model_spec
    torch.manual_seed(0)
    model = build_model(load_model_spec(SPEC))
    model.init_weights(seed=0)
    return model


# c10d ops that wait for a collective already counted, or wrap its output for autograd
_NOT_COLLECTIVES = {"wait_tensor", "wait_tensor_", "_wrap_tensor_autograd"}


def _group_size(func_name: str, args: tuple) -> int:
    """Ranks of the collective's group: functional collectives name it, c10d ops pass the object."""
    import torch.distributed.distributed_c10d as c10d
    for a in args:
        if isinstance(a, str):
            try:
                return c10d._resolve_process_group(a).size()
            except (RuntimeError, ValueError, KeyError):
                continue
        if isinstance(a, torch.ScriptObject):  # a c10d op's ProcessGroup
            return torch.distributed.ProcessGroup.unbox(a).size()
        if isinstance(a, torch.distributed.ProcessGroup):
            return a.size()
    raise AssertionError(f"no process group among the arguments of c10d op {func_name}")


def _count(model: torch.nn.Module, tokens: torch.Tensor) -> list[dict[str, Any]]:
    """One forward + backward of the default loss; every multi-rank collective with its phase, block and
    input size."""
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoparallel.trainer.trainer import cross_entropy_loss

    tracker = ModTracker()
    records: list[dict[str, Any]] = []

    class Collectives(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                # let DTensor run first (modes run before subclasses): the collectives its ops issue
                # (the parallel cross entropy's all-reduces) then come back through this mode
                return NotImplemented
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **(kwargs or {}))
            name = func._overloadpacket.__name__
            if func.namespace in ("_c10d_functional", "c10d") and name not in _NOT_COLLECTIVES and _group_size(name, args) > 1:
                first = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
                blocks = sorted({p.split("layers.")[1].split(".")[0] for p in tracker.parents if "layers." in p})
                records.append({"op": name.rstrip("_"), "phase": "bwd" if tracker.is_bw else "fwd",
                                "block": blocks[0] if blocks else None, "numel": first.numel()})
            return func(*args, **(kwargs or {}))

    with tracker, Collectives(), loss_parallel():
        logits = model(tokens[:, :-1])
        cross_entropy_loss(logits, tokens[:, 1:]).backward()
    return records


def _train(case: Case, out: Path, rank: int) -> dict[str, Any]:
    from autoparallel.trainer import AutoParallelTrainer
    model = _model()
    plan = H.make_plan(model, tp=TP, sp=case.sp, micro_batch=ROWS, global_batch=ROWS)
    if case.async_tp:
        plan = replace(plan, compile=True, async_tp=True)
    data = H.batches("tiny-llama", 3, rows=ROWS, seq=SEQ)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan,
                                      compile=case.compile)
    result: dict[str, Any] = {"warnings": [str(w.message) for w in caught]}
    if case.name.startswith("count"):
        result["records"] = _count(trainer.model_parts[0], data[0])
        return result
    from torch._dynamo.utils import counters
    counters.clear()
    result["losses"] = [trainer.step(b) for b in data[:2]]
    # a third step keeps its gradients (step() would update and free them): the token embedding's
    opt = trainer.optimizers[0]
    opt.step = opt.zero_grad = lambda *a, **k: None
    result["losses"].append(trainer.step(data[2]))
    result["embedding_grad"] = float(trainer.model_parts[0].tok_embeddings.weight.grad.full_tensor().abs().sum())
    result["graphs"] = counters["stats"]["unique_graphs"]
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tp_collectives")
    H.run_spawned(TP, CASES, out, train=_train)
    return out


def _ok(out: Path, name: str) -> dict[str, Any]:
    res = H.result(out, name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    return res


def _tally(records: list[dict[str, Any]], **where: Any) -> Counter:
    return Counter(r["op"] for r in records if all(r[k] == v for k, v in where.items()))


def test_each_block_runs_megatrons_minimum(runs):
    records = _ok(runs, "count")["records"]
    h = HIDDEN
    for block in map(str, range(LAYERS)):
        assert _tally(records, phase="fwd", block=block) == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
        assert _tally(records, phase="bwd", block=block) == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2,
                                                             "all_reduce": 2}
        sizes = {(r["phase"], r["op"]): set() for r in records if r["block"] == block}
        for r in records:
            if r["block"] == block:
                sizes[r["phase"], r["op"]].add(r["numel"])
        # activations: gathers take this rank's b*s/tp rows, reduce-scatters the whole b*s rows
        assert sizes["fwd", "all_gather_into_tensor"] == sizes["bwd", "all_gather_into_tensor"] == {TOKENS * h // TP}
        assert sizes["fwd", "reduce_scatter_tensor"] == sizes["bwd", "reduce_scatter_tensor"] == {TOKENS * h}
        assert sizes["bwd", "all_reduce"] == {h}  # the two norm weights


def test_only_the_embedding_head_and_loss_communicate_outside_the_blocks(runs):
    records = _ok(runs, "count")["records"]
    outside = [r for r in records if r["block"] is None]
    assert _tally(outside, phase="fwd") == {"reduce_scatter_tensor": 1, "all_gather_into_tensor": 1,
                                            "all_reduce": 3}
    assert _tally(outside, phase="bwd") == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1,
                                            "all_reduce": 1}
    # the loss's three all-reduces carry one value per token (max, sum of exponentials, target logit)
    assert sorted(r["numel"] for r in outside if r["op"] == "all_reduce" and r["phase"] == "fwd") == [TOKENS] * 3
    assert [r["numel"] for r in outside if r["op"] == "all_reduce" and r["phase"] == "bwd"] == [HIDDEN]


def test_tensor_parallel_without_sp_all_reduces_twice_per_block_each_way(runs):
    """Megatron's TP without SP: the row-parallel outputs are all-reduced in forward (g), the column-
    parallel inputs' gradients in backward (f), once per attention and once per MLP (input b*s*h);
    around the blocks the embedding's output and the head's input gradient, and the loss's three."""
    records = _ok(runs, "count-nosp")["records"]
    for block in map(str, range(LAYERS)):
        for phase in ("fwd", "bwd"):
            assert _tally(records, phase=phase, block=block) == {"all_reduce": 2}
            assert {r["numel"] for r in records if r["block"] == block and r["phase"] == phase} == {TOKENS * HIDDEN}
    outside = [r for r in records if r["block"] is None]
    assert sorted(r["numel"] for r in outside if r["phase"] == "fwd") == sorted([TOKENS * HIDDEN] + [TOKENS] * 3)
    assert [r["numel"] for r in outside if r["phase"] == "bwd"] == [TOKENS * HIDDEN]
    assert {r["op"] for r in records} == {"all_reduce"}


def test_compiled_blocks_match_eager_and_compile_once(runs):
    eager, compiled = _ok(runs, "eager"), _ok(runs, "aot_eager")
    # same kernels in the same order (aot_eager runs the traced aten ops): equal up to fp32 reordering
    for a, b in zip(compiled["losses"], eager["losses"], strict=True):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b)
    assert compiled["embedding_grad"] > 0  # the embedding trains under compiled blocks too
    assert abs(compiled["embedding_grad"] - eager["embedding_grad"]) <= 1e-4 * eager["embedding_grad"]
    assert compiled["graphs"] == 1  # every block (block 0 included) runs one graph


def test_async_tp_off_cuda_warns_and_runs_synchronous_tp(runs):
    res, compiled = _ok(runs, "async_tp_cpu"), _ok(runs, "aot_eager")
    assert any("async_tp needs CUDA symmetric memory" in w for w in res["warnings"]), res["warnings"]
    assert res["losses"] == compiled["losses"]


def _plan(**kw: Any) -> Plan:
    base = {"model": "m", "hardware": "h200", "gpus": 2, "gpus_per_node": 2, "global_batch": 2, "seq_len": 16,
            "tp": 2, "sequence_parallel": True, "compile": True, "async_tp": True}
    return Plan(**{**base, **kw})


def test_plan_async_tp_round_trips_and_is_left_out_when_off():
    plan = _plan()
    plan.validate()
    assert Plan.from_dict(plan.to_dict()).async_tp is True
    assert "async_tp" not in replace(plan, async_tp=False).to_dict()  # older plan files unchanged


@pytest.mark.parametrize("kw,needs", [({"tp": 1, "gpus": 1}, "tp > 1"),
                                      ({"sequence_parallel": False}, "sequence_parallel: true"),
                                      ({"compile": False}, "compile: true")])
def test_plan_async_tp_needs_tp_sequence_parallel_and_compile(kw, needs):
    with pytest.raises(UserError, match=f"async_tp needs {needs}") as e:
        _plan(**kw).validate()
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="async_tp=1 must be true or false"):
        _plan(async_tp=1).validate()


def _tp_speed():
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tp_speed.py"
    spec = importlib.util.spec_from_file_location("tp_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tp_speed_benchmark_plans_and_arguments():
    """The CPU parts of benchmarks/tp_speed.py: its plans, the compile options of the overlap variants and
    its argument checks."""
    bench = _tp_speed()
    plans = bench.build_plans()
    # async TP after the other compiled variants: it sets inductor's global flag
    assert list(plans) == list(bench.VARIANTS)
    assert [(p.dp, p.tp, p.compile, p.async_tp) for p in plans.values()] == [
        (2, 1, True, False), (1, 2, True, False), (1, 2, True, False), (1, 2, True, False), (1, 2, True, True),
        (1, 2, False, False)]
    # the overlap variants differ from tp2-sp-compiled only in inductor options the trainer passes on
    assert set(bench.COMPILE_KWARGS) == {"tp2-sp-compiled-reorder", "tp2-sp-compiled-overlap"}
    assert plans["tp2-sp-compiled-reorder"] == plans["tp2-sp-compiled"] == plans["tp2-sp-compiled-overlap"]
    import torch._inductor.config as inductor_config
    for kwargs in bench.COMPILE_KWARGS.values():
        for key in kwargs["options"]:  # every option names a config entry of the installed torch
            obj = inductor_config
            for part in key.split("."):
                obj = getattr(obj, part)
    assert bench.parse_args(["--out", "x.json"]).steps == 8
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x.json", "--only", "tp8"])


def test_tp_speed_exposed_comm_is_comm_not_under_compute():
    bench = _tp_speed()
    # comm 0-10 us under compute 5-20 us, then comm 30-40 us alone: 5 + 10 us exposed
    kernels = [("ncclDevKernel_AllGather", 0.0, 10.0), ("sm90_gemm", 5.0, 20.0), ("ncclKernel_ReduceScatter", 30.0, 40.0)]
    out = bench.breakdown(kernels, wall_s=50e-6)
    assert out["comm_kernel_s"] == pytest.approx(20e-6)
    assert out["compute_kernel_s"] == pytest.approx(15e-6)
    assert out["comm_exposed_s"] == pytest.approx(15e-6)
    assert out["device_busy_s"] == pytest.approx(30e-6)
    assert out["device_idle_s"] == pytest.approx(20e-6)
