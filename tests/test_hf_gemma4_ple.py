"""Gemma 4's small models (E2B / E4B) passed as they are: per-layer embeddings (PLE, config.hidden_size_per_layer_input
> 0: a second token table, num_layers x width wide, plus a projection of the token embeddings, of which block i takes
slice i as `per_layer_input`) and keys and values the last layers reuse from earlier ones (num_kv_shared_layers).

autoparallel's Hugging Face forward (autoparallel/hf.py, what the trainer and the tracer run) computes them as the
model's own forward does, bit for bit in fp32; the trainer runs them in one process and under tensor parallelism
(gloo, CPU: the per-layer gate split by columns takes its columns of the per-layer input); pipeline stages would not
hand the per-layer inputs and the shared keys and values on, so the planner keeps pp=1 and a pp>1 plan or pin is one
error line.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("transformers")

import hf_helpers as HF  # noqa: E402
import trainer_helpers as H  # noqa: E402

from autoparallel.errors import UserError  # noqa: E402


def _config(name: str):
    """Tiny Gemma 4 text configs (hf_helpers' widths: 8 heads, 4 kv heads, hidden 32)."""
    import transformers as T

    kw = dict(vocab_size=HF.VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=8, num_key_value_heads=4,
              max_position_embeddings=64, head_dim=4, global_head_dim=8, sliding_window=64,
              vocab_size_per_layer_input=HF.VOCAB)
    if name == "ple":  # per-layer inputs only
        return T.Gemma4TextConfig(**kw, num_hidden_layers=2, hidden_size_per_layer_input=8,
                                  layer_types=["sliding_attention", "full_attention"])
    if name == "ple-kv-shared":  # E4B's kinds of layers: per-layer inputs, the last two layers reuse keys and values
        return T.Gemma4TextConfig(**kw, num_hidden_layers=4, hidden_size_per_layer_input=8, num_kv_shared_layers=2,
                                  layer_types=["sliding_attention", "full_attention"] * 2)
    if name == "ple-e2b":  # E2B's: a double-wide MLP in the layers that reuse keys and values
        return T.Gemma4TextConfig(**kw, num_hidden_layers=4, hidden_size_per_layer_input=8, num_kv_shared_layers=2,
                                  use_double_wide_mlp=True, layer_types=["sliding_attention", "full_attention"] * 2)
    raise KeyError(name)


def _build(name: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(name)).float()


@pytest.mark.parametrize("name", ["ple", "ple-kv-shared", "ple-e2b"])
def test_training_forward_equals_the_models_own(name):
    """The logits of autoparallel's forward equal the model's own bit for bit, without a padding mask and with right
    and left padding (they had been refused: config.hidden_size_per_layer_input, config.num_kv_shared_layers)."""
    from autoparallel.hf import hf_parts, install_forward

    model = _build(name).eval()
    parts = hf_parts(model)
    assert parts.per_layer is not None and parts.per_layer.table == "model.embed_tokens_per_layer"
    assert parts.after == ("model.norm",) and parts.before == ()  # the PLE modules run beside the embedding
    ids = HF.batches(1)[0]["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    mine = copy.deepcopy(model)
    install_forward(mine, parts)
    with torch.no_grad():
        for m in (None, mask, mask.flip(1)):
            valid = torch.ones_like(ids, dtype=torch.bool) if m is None else m.bool()
            got = mine(ids, m)[valid]
            assert torch.equal(got, model(input_ids=ids, attention_mask=m).logits[valid])
    # the per-layer inputs matter: without them the logits would differ (the blocks fail on None)
    assert parts.no_pipeline.startswith("config.hidden_size_per_layer_input=8: every block takes its slice")


def test_the_per_layer_modules_belong_to_the_embedding_end():
    """The base model reaches its PLE modules through methods of its own (get_per_layer_inputs,
    project_per_layer_inputs): they are read there, so the layout puts them before the blocks (they had come after
    the final norm, in registration order), where the first stage and sequence parallelism's slicing expect them."""
    from autoparallel.trainer.structure import find_layout

    layout = find_layout(_build("ple"))
    assert layout.pre == ("model.embed_tokens", "model.embed_tokens_per_layer", "model.per_layer_model_projection",
                          "model.per_layer_projection_norm")
    assert layout.post == ("model.norm", "lm_head")


@pytest.mark.parametrize("name, recompute", [("ple", "none"), ("ple-kv-shared", "full")])
def test_local_trainer_matches_the_models_own_loop(name, recompute):
    """One process, the batch in one micro-batch: per-step losses and final parameters equal HF's own AdamW loop
    (model(**batch).loss) on right-padded batches, under full activation checkpointing too (the reused keys and
    values cross the checkpointed blocks)."""
    from autoparallel.trainer import AutoParallelTrainer

    batches = HF.batches(masked=True)
    ref_losses, ref_params = H.adamw_loop(_build(name), batches, lambda m, b: m(**b).loss)
    model = _build(name)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=HF.make_plan(model, micro_batch=HF.ROWS, recompute=recompute))
    losses = [trainer.step(b) for b in batches]
    params = trainer.full_state_dict()
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= H.LOSS_RTOL, (losses, ref_losses)
    assert max((params[n] - p).abs().max().item() for n, p in ref_params.items()) <= H.PARAM_ATOL


def test_pipeline_parallelism_is_refused_in_one_line():
    """The planner never offers pp>1 for such a model; a pp pin, an explicit pp2 plan and an estimate with --pp 2
    are each one UserError line naming why (the per-layer inputs, the reused keys and values)."""
    from autoparallel.api import estimate_plan, make_cluster, plan_model
    from autoparallel.planner import Planner
    from autoparallel.trainer import AutoParallelTrainer

    model = _build("ple-kv-shared")
    why = (r"blocks cannot be cut into pipeline stages \(config.hidden_size_per_layer_input=8: every block takes its "
           r"slice of per-layer inputs computed beside the token embedding; config.num_kv_shared_layers=2: its last 2 "
           r"layers reuse earlier layers' keys and values, which the trainer's stages do not pass on\)")
    with pytest.raises(UserError, match=f"pin pp=2: Gemma4ForCausalLM's {why}; use pp=1") as e:
        plan_model(model, hardware="h100-sxm", gpus=4, global_batch=8, seq_len=16, fix={"pp": 2})
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=f"plan has pp=2 but Gemma4ForCausalLM's {why}; use a plan with pp=1"):
        AutoParallelTrainer(model, hardware=None, plan=HF.make_plan(model, pp=2, micro_batch=2)).step(HF.batches(1)[0])
    with pytest.raises(UserError, match=f"--pp 2: .*{why}; use --pp 1"):
        estimate_plan(model, hardware="h100-sxm", gpus=2, global_batch=8, seq_len=16, pp=2)
    from autoparallel.tracer import trace
    graph = trace(model, batch=1, seq_len=16, compiled_saved=False)
    planner = Planner(graph, make_cluster("h100-sxm", 8, None), 64, 16)
    configs = list(planner.mesh_configs())
    assert configs and {c.pp for c in configs} == {1}
    assert plan_model(model, hardware="h100-sxm", gpus=8, global_batch=64, seq_len=16).pp == 1


def test_the_per_layer_embedding_is_counted():
    """The traced graph holds the per-layer table and projection among the parameters (vocab x layers*width and
    hidden x layers*width), which the planner's memory counts like every other parameter."""
    from autoparallel.tracer import trace

    model = _build("ple")
    graph = trace(model, batch=1, seq_len=16, compiled_saved=False)
    assert graph.parameters == sum(p.numel() for p in model.parameters())
    ops = graph.parametric_ops
    assert {"model.embed_tokens_per_layer", "model.per_layer_model_projection",
            "model.per_layer_projection_norm"} <= set(ops)


# ---- tensor parallelism (two gloo ranks) ------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    model: str
    sp: bool = False
    fsdp_bf16: bool = False  # dp2, ZeRO-3 computing in bf16 instead of tp2


CASES = [Case("ple-tp2", "ple"), Case("ple-tp2-sp", "ple", sp=True),
         Case("ple-kv-shared-tp2-sp", "ple-kv-shared", sp=True),
         Case("ple-kv-shared-dp2-bf16", "ple-kv-shared", fsdp_bf16=True)]


def _layout(model, sp: bool) -> dict[str, str]:
    """What the planner emits for a pinned tp=2 at these widths (the sharding solver splits nothing that pays):
    Megatron's layout made runnable, the token embedding, the per-layer table and the tied head split by vocabulary,
    attention and MLP by heads and columns, the per-layer gate and projection whole."""
    from autoparallel.api import make_cluster
    from autoparallel.planner import pinned_tp_placements
    from autoparallel.sharding import cost_model
    from autoparallel.tracer import trace

    graph = trace(model, batch=1, seq_len=16, compiled_saved=False)
    return pinned_tp_placements(cost_model(graph, make_cluster("h100-sxm", 2)), 2, sp)


def _train(cfg: Case, out, rank: int) -> dict:
    """Plain SGD on token batches: dp1 x tp2, or dp2 under FSDP2 in bf16 (whose input casts copy a plain dict: the
    shared keys and values then never reached the layers that reuse them, KeyError)."""
    from autoparallel.trainer import AutoParallelTrainer

    model = _build(cfg.model)
    if cfg.fsdp_bf16:
        plan = HF.make_plan(model, dp=2, micro_batch=2, zero=3, param_dtype="bf16")
    else:
        plan = dataclasses.replace(HF.make_plan(model, tp=2, sp=cfg.sp, micro_batch=4),
                                   placements=_layout(model, cfg.sp))
    trainer = AutoParallelTrainer(model, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                  plan=dataclasses.replace(plan, global_batch=4))
    losses = [trainer.step({"input_ids": b, "labels": b}) for b in _token_batches()]
    return {"losses": losses, "placements": plan.placements}


def _token_batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, HF.VOCAB, (4, 16), generator=g) for _ in range(2)]  # step 2 sees step 1's gradients


def test_tensor_parallelism_matches_the_models_own_loop(tmp_path):
    """Per-step losses of HF's own SGD loop within the fp32 bound (1e-5 relative) under tp2, with and without
    sequence parallelism (the per-layer inputs then computed on each rank's chunk of the sequence), the per-layer
    table split by vocabulary like the token embedding; within bf16's rounding under FSDP2 in bf16."""
    H.run_spawned(2, CASES, tmp_path, train=_train)
    for cfg in CASES:
        res = H.result(tmp_path, cfg.name)
        assert "error" not in res, (cfg.name, res.get("traceback", res.get("error")))
        ref = HF.sgd_losses(_build(cfg.model), _token_batches())
        rel = max(abs(a - b) / b for a, b in zip(res["losses"], ref, strict=True))
        assert rel < (2e-2 if cfg.fsdp_bf16 else H.LOSS_RTOL), (cfg.name, res["losses"], ref)
        if not cfg.fsdp_bf16:
            placements = res["placements"]
            assert placements["model.embed_tokens_per_layer"] == placements["model.embed_tokens"] == "vocab"
            assert placements["model.layers.0.mlp.gate_proj"] == "colwise"


def _train_raw_megatron(cfg: Case, out, rank: int) -> dict:
    """Megatron's layout as the graph rule gives it, not made runnable (CostModel._runnable): the per-layer gate
    split by columns beside the block's norms."""
    from autoparallel.placements import megatron_placements
    from autoparallel.tracer import trace
    from autoparallel.trainer import AutoParallelTrainer

    model = _build(cfg.model)
    placements = megatron_placements(trace(model, batch=1, seq_len=16, compiled_saved=False), False)
    plan = dataclasses.replace(HF.make_plan(model, tp=2, micro_batch=4), placements=placements, global_batch=4)
    trainer = AutoParallelTrainer(model, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), plan=plan)
    return {"losses": [trainer.step({"input_ids": b, "labels": b}) for b in _token_batches()[:1]]}


def test_a_hand_written_layout_dtensor_cannot_run_is_one_clear_error(tmp_path):
    """A plan whose placements split a module its neighbours then read whole fails in DTensor's sharding propagation;
    the trainer says so in one UserError naming the op and the way out (trainer._explain_sharding_failure), not
    DTensor's trace."""
    H.run_spawned(2, [Case("raw-megatron-tp2", "ple")], tmp_path, train=_train_raw_megatron)
    res = H.result(tmp_path, "raw-megatron-tp2")
    assert res.get("error_type") == "UserError", res.get("traceback", res)
    assert "cannot run aten." in res["error"] and "planner's placements" in res["error"]
