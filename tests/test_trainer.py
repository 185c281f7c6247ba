"""AutoParallelTrainer in one process (no process group): equivalence with a plain training loop,
recompute modes, meta-device materialization, optimizer rebuilding, checkpoints and misuse errors.

The multi-process equivalence suite (gloo, 2 and 4 processes) is in test_trainer_dist.py.

About the optimizer: the tests use AdamW with eps=1e-4 (trainer_helpers.EPS). With the default 1e-8,
a gradient that is analytically zero but numerically ~1e-10 (e.g. the attention key bias: adding a
constant to every key of a query does not change its softmax) is normalized by Adam into an update of
size ~lr whose sign is summation-order noise; any re-ordering of the same sums (micro-batching,
sharded reductions) then changes those parameters by O(lr). eps bounds that gain by lr/eps, which with
the step count and an fp32 summation bound gives the parameter tolerance H.PARAM_ATOL (derived in
trainer_helpers), so the comparisons are strict and stated.
"""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
import trainer_helpers as H
from torch import nn

from autoparallel.errors import UserError
from autoparallel.plan import Plan
from autoparallel.trainer import AutoParallelTrainer
from autoparallel.trainer import trainer as trainer_module
from autoparallel.trainer.batch import parse_batch

MODELS = ["tiny-gpt", "tiny-llama", "tiny-moe", "mha"]


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[list[float], dict[str, torch.Tensor]]]:
    return {m: H.reference(m) for m in MODELS}


def train(name: str, plan_kw: dict | None = None, steps: int = H.STEPS, **trainer_kw) -> tuple[list[float],
                                                                                            AutoParallelTrainer]:
    torch.set_num_threads(1)
    model = H.build(name)
    plan = H.make_plan(model, **(plan_kw or {}))
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS), plan=plan,
                                  **trainer_kw)
    return [trainer.step(b) for b in H.batches(name, steps)], trainer


def assert_equivalent(losses: list[float], params: dict[str, torch.Tensor],
                      ref: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    ref_losses, ref_params = ref
    assert len(losses) == len(ref_losses)
    for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
        assert abs(a - b) <= H.LOSS_RTOL * abs(b), f"step {step}: loss {a} != reference {b}"
    assert set(params) == set(ref_params)
    for name, ref_p in ref_params.items():
        diff = (params[name] - ref_p).abs().max().item()
        assert diff <= H.PARAM_ATOL, f"{name}: max |param - reference| = {diff:.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_single_process_matches_plain_loop(name, references):
    losses, trainer = train(name, {"micro_batch": 2})  # 4 micro-batches of gradient accumulation
    assert_equivalent(losses, trainer.full_state_dict(), references[name])
    initial = H.build(name)
    moved = max((p - trainer.full_state_dict()[n]).abs().max().item() for n, p in initial.named_parameters())
    assert moved > 1e-3  # H.STEPS steps of lr 1e-3 (Adam: up to ~lr each) really changed the weights


@pytest.mark.parametrize("mode", ["full", "selective", "op"])
def test_recompute_is_numerically_transparent(mode, references):
    losses, trainer = train("tiny-llama", {"micro_batch": 4, "recompute": mode})
    assert_equivalent(losses, trainer.full_state_dict(), references["tiny-llama"])
    block = trainer.model_parts[0].layers["0"]
    if mode in ("full", "op"):  # op: per-op selective checkpointing of the whole block
        assert type(block).__name__ == "CheckpointWrapper"
    else:  # Megatron's selective: the attention core is recomputed (a no-op for SDPA, see recompute.py)
        assert block.attn.recompute_core


def test_selective_recompute_of_eager_attention_core_is_transparent():
    """Eager attention with dropout (Megatron's layout): recomputing the seq x seq core in backward
    gives the same gradients, dropout masks included (checkpoint preserves the RNG state)."""
    import copy

    from autoparallel.models import build_model, load_model_spec

    spec = load_model_spec({"model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2,
                            "n_head": 4, "attn_impl": "eager", "resid_pdrop": 0.1})
    torch.manual_seed(0)
    plain = build_model(spec)
    core = copy.deepcopy(plain)
    for m in core.modules():
        if hasattr(m, "recompute_core"):
            m.recompute_core = True
    tokens = torch.randint(0, 64, (2, 32))
    grads = []
    for model in (plain, core):
        torch.manual_seed(1)
        model(tokens).float().logsumexp(-1).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-6)


def test_meta_model_is_materialized_with_init_weights():
    from autoparallel.models import build_model, load_model_spec

    spec = load_model_spec("tiny-llama")
    with torch.device("meta"):
        model = build_model(spec)
    torch.manual_seed(0)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR),
                                  plan=H.make_plan(model, micro_batch=8))
    params = trainer.full_state_dict()
    assert all(not p.is_meta for p in params.values())
    assert torch.equal(params["norm.weight"], torch.ones_like(params["norm.weight"]))
    std = params["layers.0.attn.q_proj.weight"].std().item()
    assert 0.015 < std < 0.025  # init_weights draws N(0, 0.02)
    losses = [trainer.step(b) for b in H.batches("tiny-llama", 3)]
    assert all(math.isfinite(x) for x in losses) and abs(losses[0] - math.log(256)) < 0.1


def test_meta_model_without_init_needs_init_fn():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4))
    plan = Plan(model="Sequential", hardware="cpu", gpus=1, gpus_per_node=1, global_batch=2, seq_len=3,
                param_dtype="fp32")
    with pytest.raises(UserError, match="init_fn"):
        AutoParallelTrainer(model, plan=plan)
    seen = []
    trainer = AutoParallelTrainer(model, plan=plan, init_fn=lambda m: (seen.append(m), nn.init.zeros_(m[0].weight),
                                                                      nn.init.zeros_(m[0].bias)))
    assert seen and torch.count_nonzero(trainer.full_state_dict()["0.weight"]) == 0
    # an init_fn that leaves a parameter unset trained on whatever memory to_empty handed out (NaN losses or
    # garbage, no error): the trainer fills the shards with NaN first and names what is still NaN after it
    with pytest.raises(UserError, match=r"after init_fn, parameter 0.bias still holds NaN \(left unset"):
        AutoParallelTrainer(model, plan=plan, init_fn=lambda m: nn.init.zeros_(m[0].weight))


def test_optimizer_param_groups_and_class_are_rebuilt():
    model = H.build("tiny-llama")
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "lr": 0.5}], lr=0.01,
                          momentum=0.9)
    trainer = AutoParallelTrainer(model, opt, plan=H.make_plan(model, micro_batch=8))
    (new,) = trainer.optimizers
    assert type(new) is torch.optim.SGD
    assert [len(g["params"]) for g in new.param_groups] == [len(decay), len(no_decay)]
    assert new.param_groups[0]["weight_decay"] == 0.1 and new.param_groups[0]["lr"] == 0.01
    assert new.param_groups[1]["lr"] == 0.5 and new.param_groups[1]["momentum"] == 0.9
    assert not any(p is q for p in new.param_groups[0]["params"] for q in decay)  # parallel copies


def test_optimizer_factory_is_called_with_the_parallel_parameters():
    model = H.build("tiny-gpt")
    calls = []

    def factory(params):
        params = list(params)
        calls.append(len(params))
        return torch.optim.SGD(params, lr=0.1)

    trainer = AutoParallelTrainer(model, factory, plan=H.make_plan(model, micro_batch=8))
    assert calls == [len(list(model.parameters()))]
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.1


def test_checkpoint_resume_in_one_process(tmp_path, references):
    model = H.build("tiny-moe")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model, micro_batch=4))
    data = H.batches("tiny-moe")
    losses = [trainer.step(b) for b in data[:2]]
    trainer.save_checkpoint(tmp_path / "ck")
    fresh = H.build("tiny-moe", seed=7)
    resumed = AutoParallelTrainer(fresh, torch.optim.AdamW(fresh.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(fresh, micro_batch=8))  # another micro-batching
    resumed.load_checkpoint(tmp_path / "ck")
    assert resumed.steps == 2
    losses += [resumed.step(b) for b in data[2:]]
    assert_equivalent(losses, resumed.full_state_dict(), references["tiny-moe"])


def test_checkpoint_of_another_model_is_refused(tmp_path):
    model = H.build("tiny-llama")
    AutoParallelTrainer(model, plan=H.make_plan(model, micro_batch=8)).save_checkpoint(tmp_path / "ck")
    other = H.build("tiny-gpt")
    trainer = AutoParallelTrainer(other, plan=H.make_plan(other, micro_batch=8))
    with pytest.raises(UserError, match="saved from another model"):
        trainer.load_checkpoint(tmp_path / "ck")
    with pytest.raises(UserError, match="no such directory"):
        trainer.load_checkpoint(tmp_path / "missing")


# ---- misuse: one clear UserError each ----------------------------------------------------------
def test_world_size_not_matching_the_plan():
    model = H.build("tiny-llama")
    with pytest.raises(UserError, match=r"plan is for 4 processes .* but 1 are running.*torchrun"):
        AutoParallelTrainer(model, plan=H.make_plan(model, dp=2, tp=2))


def test_plan_file_for_another_model(tmp_path):
    llama, gpt = H.build("tiny-llama"), H.build("tiny-gpt")
    path = tmp_path / "plan.json"
    H.make_plan(llama, micro_batch=8).save(path)
    with pytest.raises(UserError, match="another model"):
        AutoParallelTrainer(gpt, plan=path)
    trainer = AutoParallelTrainer(llama, plan=str(path))  # the right model loads the same file
    assert trainer.plan == H.make_plan(llama, micro_batch=8)


def test_placement_for_a_module_the_model_lacks():
    model = H.build("tiny-llama")
    plan = H.with_plan(H.make_plan(model), placements={"layers.9.attn.q_proj": "colwise"}, model_fingerprint="")
    with pytest.raises(UserError, match="no such module"):
        AutoParallelTrainer(model, plan=plan)


def test_tensor_parallel_plan_without_placements():
    model = H.build("tiny-llama")
    plan = H.with_plan(H.make_plan(model, tp=2), placements={})
    with pytest.raises(UserError, match="nothing would be split"):
        AutoParallelTrainer(model, plan=plan)


def test_planner_is_called_with_the_model_and_mixed_precision_is_applied():
    model = H.build("tiny-llama")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR), hardware="h100-sxm",
                                  global_batch_size=8, seq_len=16, mixed_precision="fp32")
    plan = trainer.plan  # planned at construction: sizes were given
    assert (plan.hardware, plan.gpus, plan.global_batch, plan.seq_len) == ("h100-sxm", 1, 8, 16)
    assert plan.param_dtype == "fp32"
    assert plan.model_fingerprint == H.make_plan(model).model_fingerprint
    assert math.isfinite(trainer.step(H.batches("tiny-llama", 1)[0]))


def test_model_without_parameters():
    with pytest.raises(UserError, match="no parameters"):
        AutoParallelTrainer(nn.ReLU(), plan=None)


def test_a_quantized_model_is_one_error():
    """Integer (quantized) weights and models transformers marks quantized are refused before any work, in one line
    that says how to load the model instead (they had failed in the first forward, or deep inside FSDP2)."""
    model = H.build("tiny-llama")
    q = model.layers["0"].attn.q_proj
    q.weight = nn.Parameter(torch.zeros_like(q.weight, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(UserError, match=r"parameter layers\.0\.attn\.q_proj\.weight is uint8, not floating point") as e:
        AutoParallelTrainer(model)
    assert "\n" not in str(e.value)
    marked = H.build("tiny-llama")
    marked.is_quantized = True  # what transformers sets on a model loaded with a quantization_config
    with pytest.raises(UserError, match=r"is quantized: AutoParallelTrainer trains floating-point parameters"):
        AutoParallelTrainer(marked)


def test_batch_not_divisible_as_planned():
    model = H.build("tiny-llama")
    trainer = AutoParallelTrainer(model, plan=H.make_plan(model, micro_batch=4))
    with pytest.raises(UserError, match=r"batch of 6 rows is not divisible by dp\*ep\*micro_batch = 4"):
        trainer.step(torch.randint(0, 256, (6, 17)))
    assert trainer.steps == 0


def test_batch_forms():
    tokens = torch.arange(12).view(2, 6)
    b = parse_batch(tokens)
    assert torch.equal(b.inputs, tokens[:, :-1]) and torch.equal(b.labels, tokens[:, 1:])
    b2 = parse_batch({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]})
    assert torch.equal(b2.inputs, b.inputs) and torch.equal(b2.labels, b.labels)
    for bad in (torch.randn(2, 5), [tokens], {"inputs": tokens}, "tokens", (tokens, tokens[:1])):
        with pytest.raises(UserError, match="batch"):
            parse_batch(bad)


def test_a_mask_without_padding_is_dropped_and_one_with_padding_kept():
    """A tokenizer's attention_mask of ones says nothing a causal LM does not already do: dropped, so attention
    runs SDPA's is_causal (a mask made it a kernel that computes every score, ~3x the time); one with a padded
    position is kept, whatever its dtype."""
    ids = torch.arange(12).view(2, 6)
    for ones in (torch.ones_like(ids), torch.ones(2, 6, dtype=torch.bool)):
        assert parse_batch({"input_ids": ids, "labels": ids, "attention_mask": ones}).attention_mask is None
    padded = torch.ones_like(ids)
    padded[1, -2:] = 0
    kept = parse_batch({"input_ids": ids, "labels": ids, "attention_mask": padded}).attention_mask
    assert kept is padded


def test_a_padded_batch_for_a_model_without_an_attention_mask_is_one_error():
    """A catalog model's forward takes no attention_mask: a padded batch is one error line naming the fix (it was
    a TypeError from inside the first step); a mask without padding is dropped and the step runs."""
    model = H.build("tiny-llama")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS))
    ids = H.batches("tiny-llama", steps=1)[0]
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    mask = torch.ones_like(batch["input_ids"])
    mask[0, -2:] = 0
    with pytest.raises(UserError, match=r"attention_mask has padding, but Llama.forward takes no attention_mask"):
        trainer.step({**batch, "attention_mask": mask})
    assert math.isfinite(trainer.step({**batch, "attention_mask": torch.ones_like(mask)}))


def test_plan_is_made_from_the_first_batch_on_cpu():
    model = H.build("tiny-gpt")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS))
    with pytest.raises(UserError, match="first step"):
        _ = trainer.plan
    with pytest.warns(UserWarning, match="plain data parallelism"):
        loss = trainer.step(H.batches("tiny-gpt", 1)[0])
    plan = trainer.plan
    assert (plan.dp, plan.tp, plan.pp, plan.global_batch, plan.seq_len) == (1, 1, 1, H.GLOBAL_BATCH, H.SEQ)
    assert plan.model_fingerprint and plan.param_dtype == "fp32"
    assert math.isfinite(loss)


def test_fix_needing_a_profile_is_refused_on_cpu():
    model = H.build("tiny-gpt")
    with pytest.raises(UserError, match="hardware"):
        AutoParallelTrainer(model, global_batch_size=8, seq_len=16, fix={"tp": 2})


def test_hardware_auto_matches_profiles_by_device_name(monkeypatch):
    """hardware="auto" on a GPU resolves torch's device name through hardware_profiles.match_device."""
    from autoparallel.trainer import hardware

    monkeypatch.setattr(hardware.torch.cuda, "get_device_name", lambda device: "NVIDIA H100 PCIe")
    monkeypatch.setattr(hardware.torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(total_memory=81559 * 2**20))
    assert hardware.resolve_hardware("auto", torch.device("cuda", 0)) == "h100-pcie"
    monkeypatch.setattr(hardware.torch.cuda, "get_device_name", lambda device: "Some Unknown Accelerator")
    with pytest.raises(UserError, match="no hardware profile matches the local device 'Some Unknown"):
        hardware.resolve_hardware("auto", torch.device("cuda", 0))


def test_default_budget_is_the_local_devices_usable_memory(monkeypatch):
    """Without max_memory_per_gpu the trainer plans for the card it runs on (its reported capacity times
    the profile's usable fraction), not for a fixed 80 GB: a 7B on two H200s was planned ZeRO-3 with full
    recompute under the old default (51% MFU) where ZeRO-2 without recompute fits (60%)."""
    from autoparallel.trainer.hardware import local_budget
    from hardware_profiles import load_profile

    class Props:
        total_memory = 150_000_000_000

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    fraction = load_profile("h200").usable_fraction
    assert local_budget(torch.device("cuda", 0), "h200") == int(150_000_000_000 * fraction)
    assert local_budget(torch.device("cpu"), "h200") is None
    seen = {}

    def fake_plan_model(model, **kw):
        seen.update(kw)
        raise RuntimeError("stop after planning")

    import autoparallel.api

    monkeypatch.setattr(autoparallel.api, "plan_model", fake_plan_model)
    trainer = AutoParallelTrainer(H.build("tiny-moe"), hardware="h200")
    with pytest.raises(RuntimeError, match="stop after planning"):
        trainer._make_plan(8, 16)
    assert seen["max_memory_per_gpu"] is None  # off the GPU: the profile's usable memory
    trainer = AutoParallelTrainer(H.build("tiny-moe"), hardware="h200", max_memory_per_gpu="20GB")
    with pytest.raises(RuntimeError, match="stop after planning"):
        trainer._make_plan(8, 16)
    assert seen["max_memory_per_gpu"] == 20e9


def test_trainer_plans_with_the_attention_kernel_torch_runs_here(monkeypatch):
    """torch's SDPA dispatcher picks the flash backend (FlashAttention-2) on Hopper before torch 2.9 (or with a
    bundled cuDNN < 9.15) and cuDNN's kernel after; the trainer asks it and plans with that kernel's cost
    (RuntimeVariant.attention), off the GPU with the default one."""
    from torch.nn.attention import SDPBackend

    import autoparallel.api
    from autoparallel.trainer import hardware

    assert hardware.attention_kernel(torch.device("cpu")) == "default"
    for backend, kernel in ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.CUDNN_ATTENTION, "default"),
                            (SDPBackend.EFFICIENT_ATTENTION, "default")):
        monkeypatch.setattr(hardware, "_sdpa_choice", lambda device, b=backend: int(b))
        assert hardware.attention_kernel(torch.device("cuda", 0)) == kernel
    monkeypatch.setattr(hardware, "_sdpa_choice", lambda device: None)  # a torch that cannot say
    assert hardware.attention_kernel(torch.device("cuda", 0)) == "default"
    seen = {}

    def fake_plan_model(model, **kw):
        seen.update(kw)
        raise RuntimeError("stop after planning")

    monkeypatch.setattr(autoparallel.api, "plan_model", fake_plan_model)
    monkeypatch.setattr(trainer_module, "attention_kernel", lambda device: "flash")
    with pytest.raises(RuntimeError, match="stop after planning"):
        AutoParallelTrainer(H.build("tiny-moe"), hardware="h200")._make_plan(8, 16)
    assert seen["variant"].attention == "flash"
    assert not seen["variant"].clip_grad_norm
    # clipping (max_grad_norm) is priced in the plan the trainer makes for itself
    with pytest.raises(RuntimeError, match="stop after planning"):
        AutoParallelTrainer(H.build("tiny-moe"), hardware="h200", max_grad_norm=1.0)._make_plan(8, 16)
    assert seen["variant"].clip_grad_norm


def test_plan_round_trips_through_json_for_the_trainer(tmp_path):
    model = H.build("tiny-moe")
    plan = H.make_plan(model, micro_batch=4, recompute="selective")
    path = tmp_path / "p.json"
    plan.save(path)
    assert json.loads(path.read_text())["plan"]["recompute"] == ["selective"] * 4
    trainer = AutoParallelTrainer(model, plan=path)
    assert trainer.plan == plan


@pytest.mark.parametrize("name", MODELS)
def test_gradient_scale_bounds_the_tolerance(name):
    """trainer_helpers derives PARAM_ATOL assuming no gradient entry exceeds GRAD_SCALE: check it."""
    import torch.nn.functional as F
    torch.set_num_threads(1)
    model = H.build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS)
    for tokens in H.batches(name):
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, -2).float(), tokens[:, 1:].flatten()).backward()
        assert max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None) <= H.GRAD_SCALE
        opt.step()
        opt.zero_grad()


def test_a_step_that_fails_leaves_no_gradients_behind():
    """A step that raises in its second micro-batch (here the loss) had left the first one's gradients, in
    .grad and in FSDP2's unreduced accumulation, and the next step added them to its own: after a caught
    failure the run must continue exactly as one that never saw the bad batch."""
    fail = {"armed": False, "calls": 0}

    def loss_fn(logits, labels):
        fail["calls"] += 1
        if fail["armed"] and fail["calls"] == 2:
            raise RuntimeError("bad micro-batch")
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    def run(with_failure: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
        torch.set_num_threads(1)
        model = H.build("tiny-gpt")
        plan = H.make_plan(model, micro_batch=H.GLOBAL_BATCH // 2)
        trainer = AutoParallelTrainer(model, torch.optim.SGD(model.parameters(), lr=1.0), plan=plan, loss_fn=loss_fn)
        batches = H.batches("tiny-gpt", 2)
        if with_failure:
            fail.update(armed=True, calls=0)
            with pytest.raises(RuntimeError, match="bad micro-batch"):
                trainer.step(batches[0])
            fail["armed"] = False
        losses = [trainer.step(b) for b in batches]
        return losses, trainer.full_state_dict()

    clean_losses, clean = run(False)
    losses, params = run(True)
    assert losses == clean_losses
    for name, p in clean.items():
        assert torch.equal(params[name], p), name


def test_bad_tokens_and_unread_batch_keys_are_refused_before_any_forward():
    """Token ids or labels outside the vocabulary failed inside torch's embedding or loss (on a GPU a device-side
    assert that ends the process), after earlier micro-batches ran; keys the trainer does not read (a packing
    collator's position_ids) were dropped silently, training another computation. Each is one error before the
    first forward, and the trainer takes a good batch afterwards."""
    model = H.build("tiny-llama")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model, micro_batch=H.GLOBAL_BATCH // 2))
    vocab = H.vocab_of("tiny-llama")
    tokens = H.batches("tiny-llama", steps=1)[0]
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    too_big = ids.clone()
    too_big[-1, 3] = vocab
    cases = [(too_big, rf"token id {vocab} is outside the model's vocabulary of {vocab}"),
             (ids - ids.max() - 1, r"token id -\d+ is outside"),
             (ids.float(), r"input_ids must be integer token ids, got dtype torch.float32")]
    for bad, message in cases:
        with pytest.raises(UserError, match=message):
            trainer.step({"input_ids": bad, "labels": labels})
    bad_labels = labels.clone()
    bad_labels[0, 0] = vocab + 3
    with pytest.raises(UserError, match=rf"label {vocab + 3} is outside the model's output of {vocab} tokens"):
        trainer.step({"input_ids": ids, "labels": bad_labels})
    ignored = labels.clone()
    ignored[:, :2] = -100  # ignored positions are not token ids
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with pytest.raises(UserError, match=r"\['position_ids'\] would be ignored"):
        trainer.step({"input_ids": ids, "labels": ignored, "position_ids": positions})
    assert trainer.steps == 0
    assert math.isfinite(trainer.step({"input_ids": ids, "labels": ignored}))


def test_a_save_target_that_is_a_file_is_one_error(tmp_path):
    """save_checkpoint onto a file raised DCP's CheckpointException (a BaseException: `except Exception` missed it);
    load_checkpoint of a directory without a checkpoint logged two DCP tracebacks before its error."""
    model = H.build("tiny-gpt")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=H.make_plan(model))
    target = tmp_path / "a_file"
    target.write_text("keep me")
    with pytest.raises(UserError, match=r"save_checkpoint: .*a_file is a file; pass a directory"):
        trainer.save_checkpoint(target)
    assert target.read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no checkpoint in it \(no \.metadata\)"):
        trainer.load_checkpoint(tmp_path / "empty")
    with pytest.raises(UserError, match=r"a file, not a directory"):
        trainer.load_checkpoint(target)


@pytest.mark.parametrize("kwargs, message", [
    ({"compile": "no"}, r"compile: 'no' is not True, False, None or a dict"),   # bool("no") compiled
    ({"padded": "no"}, r"padded: 'no' is not True, False or None"),            # bool("no") planned padded
    ({"global_batch_size": "8", "seq_len": 16}, r"global_batch_size: '8' is not a whole number"),
    ({"moe": ["x"]}, r"moe: expected a dict"),
    ({"loss_fn": "ce"}, r"loss_fn: 'ce' is not callable"),
    ({"compile": {"mode": "fastest"}}, r"compile: mode 'fastest' is not one of torch.compile's modes \(default, "),
    ({"compile": {"fullgraf": True}}, r"compile: 'fullgraf' is not an argument of torch.compile \(it takes fullgraph"),
    ({"fix": ["tp"]}, r"fix: expected 'tp=8,pp=4' or a dict"),
    ({"max_memory_per_gpu": "1MB"}, r"'1MB' is less than 1 MiB"),              # re-read later as 1e6 bare bytes
])
def test_trainer_arguments_of_the_wrong_kind_are_one_error(kwargs, message):
    model = H.build("tiny-gpt")
    with pytest.raises(UserError, match=message):
        AutoParallelTrainer(model, **kwargs)


def test_fix_as_a_string_and_a_cpu_dp_pin_the_processes_cannot_run():
    """fix takes 'micro_batch=2' as autoparallel.plan does (it was a ValueError from dict()); without a profile
    the trainer runs data parallelism over every process, and a dp pin of another degree was dropped silently."""
    model = H.build("tiny-gpt")
    trainer = AutoParallelTrainer(model, fix="micro_batch=2", global_batch_size=H.GLOBAL_BATCH, seq_len=H.SEQ)
    assert trainer.plan.micro_batch == 2
    with pytest.raises(UserError, match=r"fix dp=2: without a hardware profile the trainer runs data parallelism "
                                        r"over all 1 process"):
        AutoParallelTrainer(H.build("tiny-gpt"), fix={"dp": 2}, global_batch_size=H.GLOBAL_BATCH, seq_len=H.SEQ)


def test_a_plan_of_a_mistyped_field_or_kind_is_one_error():
    """A misspelled plan field kept its default silently (`micro_bach: 4` ran micro-batches of 1); a plan given as
    its dict was read as a path ("a name or path component longer than 255 bytes"), a number was a TypeError."""
    model = H.build("tiny-gpt")
    plan = H.make_plan(model, micro_batch=4)
    d = plan.to_dict()
    assert Plan.from_dict(d) == plan  # what to_dict writes reads back, derived keys included
    assert AutoParallelTrainer(model, plan=d).plan == plan
    typo = {**{k: v for k, v in d.items() if k != "micro_batch"}, "micro_bach": 4}
    with pytest.raises(UserError, match=r"unknown field 'micro_bach' \(did you mean 'micro_batch'\?\)"):
        Plan.from_dict(typo)
    with pytest.raises(UserError, match=r"plan: expected a Plan, its dict or a plan file path, got int"):
        AutoParallelTrainer(model, plan=123)


@pytest.mark.parametrize("loss_fn, message", [
    (lambda logits, labels: 1.5, r"loss_fn returned float 1.5: it must return the micro-batch's mean loss"),
    (lambda logits, labels: nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                        reduction="none"),
     r"loss_fn returned a tensor of shape \(\d+,\) and dtype torch.float32"),
    (lambda logits, labels: nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()).detach(),
     r"does not depend on the logits"),
])
def test_a_loss_fn_of_the_wrong_result_is_one_error(loss_fn, message):
    """A loss_fn returning a float, per-token losses or a detached value failed inside autograd ("grad can be
    implicitly created only for scalar outputs", "element 0 of tensors does not require grad"); each is one
    error naming what it returned, and no step is counted."""
    model = H.build("tiny-gpt")
    trainer = AutoParallelTrainer(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                  plan=H.make_plan(model, micro_batch=H.GLOBAL_BATCH), loss_fn=loss_fn)
    with pytest.raises(UserError, match=message):
        trainer.step(H.batches("tiny-gpt", 1)[0])
    assert trainer.steps == 0


def test_a_sequence_longer_than_planned_is_one_error_and_shorter_runs():
    """The plan's activation memory is budgeted for its seq_len: a longer batch was accepted by a plan
    without a pipeline (its memory no longer held), now one error naming the seq_len to pass; a shorter
    batch fits the budget and runs."""
    model = H.build("tiny-llama")
    plan = H.make_plan(model, micro_batch=H.GLOBAL_BATCH)
    trainer = AutoParallelTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), plan=plan)
    vocab = H.vocab_of("tiny-llama")
    longer = torch.randint(0, vocab, (H.GLOBAL_BATCH, plan.seq_len + 9))
    with pytest.raises(UserError, match=rf"sequence length {plan.seq_len + 8} is longer than the plan's seq_len "
                                        rf"{plan.seq_len}.*pass seq_len={plan.seq_len + 8}"):
        trainer.step(longer)
    assert trainer.steps == 0
    assert math.isfinite(trainer.step(longer[:, : plan.seq_len // 2 + 1]))


class _SequentialBlocks(nn.Module):
    """Blocks in an nn.Sequential, beside a longer list of parameter-free modules: the planner's tracer and the
    trainer must take the same four blocks (autoparallel.blocks.find_blocks, one rule for both)."""

    def __init__(self, vocab: int = 64, h: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.acts = nn.ModuleList(nn.GELU() for _ in range(6))
        self.layers = nn.Sequential(*(nn.Sequential(nn.LayerNorm(h), nn.Linear(h, h)) for _ in range(4)))
        self.head = nn.Linear(h, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.acts[0](self.layers(self.emb(input_ids))))


def test_the_trainer_runs_the_blocks_the_tracer_planned():
    """A model whose layers are an nn.Sequential (the trainer once took only ModuleDict / ModuleList containers
    and refused the planner's per-block recompute for them): both sides find the same blocks, and a plan that
    recomputes every block trains as the plan without recompute does (the same sums in the same order)."""
    from autoparallel.blocks import find_blocks
    from autoparallel.tracer import trace
    from autoparallel.trainer.structure import find_layout
    torch.manual_seed(0)
    model = _SequentialBlocks()
    blocks = [f"layers.{i}" for i in range(4)]
    assert find_blocks(model) == blocks and list(find_layout(model).block_paths) == blocks
    assert trace(model, batch=2, seq_len=8).blocks == blocks
    ids = torch.randint(0, 64, (H.GLOBAL_BATCH, H.SEQ))
    losses = {}
    for mode in ("none", "full"):
        torch.manual_seed(0)
        m = _SequentialBlocks()
        plan = Plan(model="_SequentialBlocks", hardware="cpu", gpus=1, gpus_per_node=1, global_batch=H.GLOBAL_BATCH,
                    seq_len=H.SEQ, micro_batch=4, recompute=(mode,) * 4, grad_reduce_dtype="fp32", param_dtype="fp32")
        trainer = AutoParallelTrainer(m, torch.optim.AdamW(m.parameters(), lr=H.LR, eps=H.EPS), plan=plan)
        losses[mode] = [trainer.step({"input_ids": ids, "labels": ids}) for _ in range(2)]
    assert losses["full"] == pytest.approx(losses["none"], rel=H.LOSS_RTOL)
