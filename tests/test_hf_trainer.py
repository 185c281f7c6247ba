"""Hugging Face causal LMs passed to AutoParallelTrainer as they are (CPU, gloo, fp32): {"input_ids",
"labels"} batches, no loss_fn, under every plan kind. Each configuration must match a plain
single-process loop using HF's own loss (model(**batch).loss): per-step losses within 1e-5 relative
and every final parameter within 1e-5 absolute. Why those tolerances hold: fp32 everywhere, 3 AdamW
steps at lr 1e-3 (eps 1e-6, see test_trainer.py); the parallel run differs from the reference only
in summation order (tp partial sums, all-reduces, per-token loss sums), ~1e-7 relative per op, and
Adam's update is bounded by lr per step, so order noise cannot grow past ~1e-6 in 3 steps.

Matrix (one 4-process group): Llama, Qwen2, GPT-2, Mixtral, Qwen3-MoE, Phi-3 and Gemma each under
dp2 x tp2, dp2 x tp2 + SP, pp2 x dp2 and tp4, and ep2 x dp2 for the MoE models (Phi-3's fused qkv_proj /
gate_up_proj and GPT-2's fused, transposed c_attn column-parallel piece by piece). Besides:
  llama                right padding with attention_mask, labels partly -100 (HF's token weighting
                       across micro-batches and data slices) under dp2 x tp2 + SP and pp2 x dp2; 4 blocks
                       interleaved (vpp 2)
  gpt2                 pp2 x tp2 + SP (re-laid c_attn on each stage, tied embedding split over stages)
  mixtral, qwen3moe    router load-balancing loss (ep2 x dp2; dp2 x tp2 + SP with padding); refused
                       under pipelining
  qwen2moe             ep2 x tp2 + SP (shared expert split over tp inside the MoE branch)
  olmo2                attention kept whole (norms over all heads); a hand-written head split refused
  opt                  pp2 x tp2 with padding (final norm and output projection registered before the
                       blocks, positions from the mask, head counts made local); refused under SP
  gptj                 pp2 x dp2 (a rotary table registered after the blocks, kept on every stage)
  nanochat             pp2 x dp2 (one norm run before and after the blocks, by the first and last stage)
  qwen3_5, lfm2        hybrids whose linear-attention / convolution mixers read the padding mask, under
                       dp2 x tp2 + SP and pp2 x dp2 with padding (convolution mixers kept whole over tp)
plus full / selective activation checkpointing (with ZeRO-3 expert units), meta-device models, resume
across plans (fused weights re-laid for another tp included) and save_pretrained exports.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

pytest.importorskip("transformers")

import hf_helpers as HF  # noqa: E402
import trainer_helpers as H  # noqa: E402
from hf_helpers import Config  # noqa: E402

from autoparallel.errors import UserError  # noqa: E402
from autoparallel.trainer import AutoParallelTrainer  # noqa: E402

DP2TP2 = {"dp": 2, "tp": 2, "micro_batch": 2}
DP2TP2SP = {"dp": 2, "tp": 2, "sp": True, "micro_batch": 2}
PP2DP2 = {"pp": 2, "dp": 2, "micro_batch": 2}
TP4 = {"tp": 4, "micro_batch": 4}
EP2DP2 = {"ep": 2, "dp": 2, "micro_batch": 1}

# The acceptance matrix: every model of the issue under every plan kind, ep2 x dp2 for the MoE models.
MATRIX = {"dp2xtp2": DP2TP2, "dp2xtp2-sp": DP2TP2SP, "pp2xdp2": PP2DP2, "tp4": TP4}
MOE = ("mixtral", "qwen3moe")
# save_pretrained exports: from tensor-parallel runs of the fused (Phi-3) and transposed (GPT-2 Conv1D)
# projections, whose rows the trainer re-lays per tp rank, from pipeline stages (tied embedding split
# over them) and from expert shards
EXPORTED = {"phi3-dp2xtp2", "gpt2-tp4", "gemma-pp2xdp2", "mixtral-ep2xdp2"}
LOW_PRECISION = ("minimax", "openai-gpt")

WORLD4: list[Config] = [
    *(Config(f"{m}-{kind}", m, plan, export=f"{m}-{kind}" in EXPORTED) for kind, plan in MATRIX.items()
      for m in HF.MODELS),
    *(Config(f"{m}-ep2xdp2", m, EP2DP2) for m in MOE),
    Config("llama-dp2xtp2-sp-masked", "llama", DP2TP2SP, masked=True),
    # right padding under pipelining: the attention mask travels with each micro-batch to both stages
    Config("llama-pp2xdp2-masked", "llama", PP2DP2, masked=True),
    Config("llama4-pp2xdp2-interleaved", "llama4", {**PP2DP2, "vpp": 2, "micro_batch": 1}),
    # pipeline stages with tensor parallelism: GPT-2's fused, transposed c_attn re-laid on each stage, the
    # tied embedding split over the stages
    Config("gpt2-pp2xtp2-sp", "gpt2", {"pp": 2, "tp": 2, "sp": True, "micro_batch": 4}),
    # router load-balancing loss (config.output_router_logits): its statistics span the global batch
    Config("mixtral-aux-ep2xdp2", "mixtral-aux", {**EP2DP2, "micro_batch": 2}),
    Config("qwen3moe-aux-dp2xtp2-sp-masked", "qwen3moe-aux", {**DP2TP2SP, "micro_batch": 4}, masked=True),
    Config("mixtral-aux-pp2xdp2-refused", "mixtral-aux", PP2DP2),
    # Qwen2-MoE: a shared expert (column -> row inside the replicated MoE branch) next to routed experts
    Config("qwen2moe-ep2xtp2-sp", "qwen2moe", {"ep": 2, "tp": 2, "sp": True, "micro_batch": 2}),
    # OLMo2: norms over all heads keep attention whole; the MLP is split
    Config("olmo2-dp2xtp2-sp", "olmo2", DP2TP2SP),
    # ... and a hand-written head split of it is refused (on every rank, before training)
    Config("olmo2-head-split-refused", "olmo2", {**DP2TP2, "overrides": {
        **{f"model.layers.{i}.self_attn.{p}": "colwise" for i in range(2) for p in ("q_proj", "k_proj", "v_proj")},
        **{f"model.layers.{i}.self_attn.o_proj": "rowwise" for i in range(2)}}}),
    # ALiBi built from the padding mask (BLOOM) or max_seq_len (MPT) on every stage, each tp rank its heads' slopes
    # of it, the sequence gathered for the attention under SP; BLOOM's embedding norm on the first stage only
    Config("bloom-dp2xtp2-sp-masked", "bloom", DP2TP2SP, masked=True),
    Config("mpt-dp2xtp2-sp-masked", "mpt", DP2TP2SP, masked=True),
    Config("bloom-pp2xdp2-masked", "bloom", PP2DP2, masked=True),
    # a pinned tp the solver found not worth splitting: every module replicated, the tp ranks redundant
    Config("qwen2-dp2xtp2-sp-all-replicated", "qwen2", {**DP2TP2SP, "replicate_all": True}),
    # activation checkpointing of HF blocks (called with keyword arguments), FSDP (zero 3) expert units
    Config("gemma-dp2xtp2-sp-fullac", "gemma", {**DP2TP2SP, "recompute": "full"}),
    Config("mixtral-ep2xdp2-zero3-selac", "mixtral", {**EP2DP2, "zero": 3, "recompute": "selective"}),
    # built on the meta device: HF's own init_weights() runs on this rank's shards
    Config("qwen3moe-meta-dp2xtp2-sp", "qwen3moe", DP2TP2SP, meta=True),
    Config("gemma-meta-pp2xdp2", "gemma", PP2DP2, meta=True),
    # resume across plans: dp2 x tp2 (SP) -> pp2 x dp2 at step 1, that run checkpoints at step 2 and
    # a single process finishes (test_resume_across_plans_into_one_process); tied GPT-2
    Config("gpt2-resume-dp2xtp2-pp2xdp2", "gpt2", DP2TP2SP, resume={"stop": 1, "plan": PP2DP2, "save": 2}),
    Config("qwen3moe-resume-ep2xdp2-dp2xtp2", "qwen3moe", EP2DP2, resume={"stop": 2, "plan": DP2TP2SP}),
    # fused q/k/v re-laid for tp 4, saved in the model's order, loaded and re-laid for tp 2
    Config("phi3-resume-tp4-dp2xtp2", "phi3", TP4, resume={"stop": 1, "plan": DP2TP2}),
    # beyond the seven: a parameter-free final norm a pipeline stage must not apply (OLMo), scaled
    # logits under tp (Cohere), scaled embeddings and logits across stages (Granite)
    Config("olmo-pp2xdp2", "olmo", PP2DP2),
    Config("cohere-dp2xtp2", "cohere", DP2TP2),
    Config("granite-pp2xdp2", "granite", PP2DP2),
    # OPT: its final norm and output projection registered before its blocks but run after them (each stage
    # owns what runs on it), positions counted from the padding mask on the first stage, its attention's
    # view(bsz, -1, self.num_heads, ...) under a head split (num_heads made local: with the global count the
    # -1 silently took 1/tp of the tokens)
    Config("opt-pp2xtp2-masked", "opt", {"pp": 2, "tp": 2, "micro_batch": 2}, masked=True),
    # ... and refused under SP: its MLP flattens the tokens, so no dim is the sequence
    Config("opt-dp2xtp2-sp-refused", "opt", DP2TP2SP),
    # GPT-J's rotary table (a buffer other than inv_freq) registered after its blocks: every stage keeps it
    # (the first stage's blocks ran without position embeddings; the group hung)
    Config("gptj-pp2xdp2", "gptj", PP2DP2),
    # NanoChat's one parameter-free norm before and after the blocks: on both end stages, applied once on each
    Config("nanochat-pp2xdp2", "nanochat", PP2DP2),
    Config("gemma4-pp2xdp2", "gemma4", PP2DP2),  # each stage's blocks store keys and values in a dict of their own
    # MiniMax's linear attention normalizes over all its heads: the layout keeps that module whole (its full-
    # attention layers split), padded tokens zeroed by the 2-D mask
    Config("minimax-dp2xtp2-sp-masked", "minimax", DP2TP2SP, masked=True),
    # hybrids: Qwen3.5's gated delta rule and LFM2's short convolution read the 2-D padding mask; a module holding
    # a convolution stays whole under tp (its projections split, the convolution got half its channels)
    Config("qwen3_5-dp2xtp2-sp-masked", "qwen3_5", DP2TP2SP, masked=True),
    Config("qwen3_5-pp2xdp2-masked", "qwen3_5", PP2DP2, masked=True),
    Config("lfm2-dp2xtp2-sp-masked", "lfm2", DP2TP2SP, masked=True),
    # Jamba's two block classes (attention and Mamba layers) are its blocks: two pipeline stages, where the model
    # had been one FSDP unit without stages ("stage_layers=[0, 0] must be positive integers")
    Config("jamba-pp2xdp2-masked", "jamba", PP2DP2, masked=True),
    # Mamba-2 alone (every block a state-space mixer that zeroes padded states from the 2-D mask)
    Config("mamba2-dp2xtp2-sp-masked", "mamba2", DP2TP2SP, masked=True),
    Config("mamba2-pp2xdp2-masked", "mamba2", PP2DP2, masked=True),
    # FSDP2 computing in bf16 (the layout every GPU plan runs): buffers that HF's bf16 load makes bf16 (MiniMax's
    # decay factors, GPT-1's) must be bf16 too, or their products with bf16 activations fail in the next matmul
    *(Config(f"{m}-dp4-bf16", m, {"dp": 4, "micro_batch": 2, "zero": 2, "param_dtype": "bf16"}, steps=1)
      for m in LOW_PRECISION),
]


@functools.cache
def reference(model: str, masked: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    return HF.reference(model, masked)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_world4")
    H.run_spawned(4, WORLD4, out, train=HF.train)
    return out


def _max_diffs(losses, params, ref_losses, ref_params) -> tuple[float, float]:
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    param_abs = max((params[n] - p).abs().max().item() for n, p in ref_params.items())
    return loss_rel, param_abs


REFUSED = {"olmo2-head-split-refused": r"norm model\.layers\.0\.self_attn\.q_norm spans all heads",
           "opt-dp2xtp2-sp-refused": r"model\.decoder\.layers\.0\.final_layer_norm reads a 2-D input",
           "mixtral-aux-pp2xdp2-refused": r"output_router_logits: the router load-balancing loss .* pp=2"}


@pytest.mark.parametrize("cfg", [c for c in WORLD4 if not c.meta and c.name not in REFUSED
                                 and c.plan.get("param_dtype", "fp32") == "fp32"], ids=lambda c: c.name)
def test_hf_model_as_is_matches_single_process(cfg, world4):
    res = H.result(world4, cfg.name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    per_rank = [H.result_of_rank(world4, cfg.name, r)["losses"] for r in range(4)]
    assert all(x == per_rank[0] for x in per_rank), f"ranks disagree on the loss: {per_rank}"
    ref_losses, ref_params = reference(cfg.model, cfg.masked)
    params = H.gathered_params(world4, cfg.name)
    assert set(params) == set(ref_params), sorted(set(params) ^ set(ref_params))
    loss_rel, param_abs = _max_diffs(res["losses"], params, ref_losses, ref_params)
    print(f"{cfg.name}: max loss rel diff {loss_rel:.2e}, max param abs diff {param_abs:.2e}")
    assert loss_rel <= 1e-5, (res["losses"], ref_losses)
    assert param_abs <= 1e-5


@pytest.mark.parametrize("model", LOW_PRECISION)
def test_bf16_fsdp_runs_the_model_as_its_bf16_load_does(model, world4):
    """Under FSDP2's bf16 compute the first step's loss is the one HF's own bf16 model gives (the same weights,
    built in bf16 as from_pretrained(dtype=bfloat16) builds it). Tolerance: both run the same ops on bf16
    operands (relative rounding 2^-9 each), differing only in where a few casts and reductions fall; a logit
    moves by a few ulps, at most ~1% of these tiny models' |logits| <= 3, and the loss (-logit_y + logsumexp)
    by at most twice that: ~0.06 of a loss of ~4.9, so 2% relative. (Random tiny models sit near ln(128) = 4.85
    either way: the loss check catches a broken computation, not a subtle one.) Before buffers took their
    bf16-load dtype, both models raised (a float32 buffer times a bf16 activation, then a matmul with a bf16
    operand): the run itself is the check."""
    from transformers import AutoModelForCausalLM

    res = H.result(world4, f"{model}-dp4-bf16")
    assert "error" not in res, res.get("traceback", res.get("error"))
    fp32 = HF.build(model)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        ref = AutoModelForCausalLM.from_config(HF.config(model))
    finally:
        torch.set_default_dtype(previous)
    ref.load_state_dict(fp32.state_dict())
    with torch.no_grad():
        want = float(ref(**HF.batches(1)[0]).loss)
    assert abs(res["losses"][0] - want) <= 0.02 * abs(want), (res["losses"][0], want)


def test_a_pinned_per_op_checkpointing_that_torch_refuses_is_one_clear_error():
    """gpt-oss's grouped experts add their bias into the grouped GEMM's output in place; under a plan pinning per-op
    checkpointing torch's SAC refuses the changed cache entry in the first backward. The trainer says so in one
    error naming the plan's setting and the fix (the planner never picks it: test_hf_tracing)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from hf_coverage import tiny_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt_oss")).float()
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                  plan=HF.make_plan(model, micro_batch=2, recompute="op"))
    ids = torch.randint(1, 100, (HF.ROWS, HF.SEQ))
    with pytest.raises(UserError, match=r"plan recompute op: per-op checkpointing cached an op output that the model "
                                        r"then changes in place.*use recompute none or full"):
        trainer.step({"input_ids": ids, "labels": ids})


def test_buffer_dtypes_are_those_of_the_models_low_precision_load():
    """MiniMax computes its decay factors at the default dtype (bf16 in a bf16 load) and its rotary inv_freq
    in fp32 explicitly; a model with no floating buffers has nothing to cast."""
    from autoparallel.hf import buffer_dtypes

    dtypes = buffer_dtypes(HF.build("minimax"), torch.bfloat16)
    assert dtypes["model.layers.1.self_attn.diagonal_decay"] == torch.bfloat16
    assert dtypes["model.rotary_emb.inv_freq"] == torch.float32
    assert buffer_dtypes(HF.build("gpt2"), torch.bfloat16) == {}
    assert torch.get_default_dtype() == torch.float32  # restored

    class Wrapped(type(HF.build("llama"))):  # a user's subclass whose constructor takes more than the config
        def __init__(self, config, extra):
            super().__init__(config)

    wrapped = Wrapped(HF.config("llama"), extra=1)
    assert buffer_dtypes(wrapped, torch.bfloat16) == {}  # its buffers stay as they are
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("cfg", [c for c in WORLD4 if c.plan.get("tp", 1) > 1 and c.name not in REFUSED],
                         ids=lambda c: c.name)
def test_replicated_parameters_stay_identical_across_ranks(cfg, world4):
    """Every rank's copy of a parameter (gathered when sharded, its own copy when replicated: norms,
    routers, qk-norms) is bit-identical after training: a replicated weight whose gradient is not
    summed over the tp ranks (Qwen3-MoE's q_norm / k_norm inside head-sharded attention) drifts."""
    per_rank = [H.params_of_rank(world4, cfg.name, r) for r in range(4)]
    for name in set().union(*per_rank):
        holders = [(r, p[name]) for r, p in enumerate(per_rank) if name in p]  # pipeline: its stage's ranks
        (r0, first), *others = holders
        for r, value in others:
            assert torch.equal(first, value), (
                f"{name}: rank {r} differs from rank {r0} by {(first - value).abs().max():.2e}")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_plans_that_would_compute_wrong_results_are_refused(name, world4):
    import re

    for rank in range(4):
        res = H.result_of_rank(world4, name, rank)
        assert res.get("error_type") == "UserError" and re.search(REFUSED[name], res["error"]), res


@pytest.mark.parametrize("cfg", [c for c in WORLD4 if c.meta], ids=lambda c: c.name)
def test_meta_hf_models_initialize_and_train(cfg, world4):
    """Ranks seeded differently; HF's init_weights() on the shards gives a model that starts at chance
    (loss ~ log vocab), trains, and whose replicas agree (test_replicated_parameters_... for tp)."""
    import math

    res = H.result(world4, cfg.name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    losses = res["losses"]
    assert abs(losses[0] - math.log(HF.VOCAB)) < 0.1 and all(math.isfinite(x) for x in losses), losses
    params = H.gathered_params(world4, cfg.name)
    assert set(params) == {n for n, _ in HF.build(cfg.model).named_parameters(remove_duplicate=False)}
    weights = [p for n, p in params.items() if n.endswith(("q_proj.weight", "gate_up_proj"))]
    assert weights and all(0.015 < p.std().item() < 0.025 for p in weights)  # initializer_range 0.02


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", ["llama", "bloom", "mpt", "bart", "whisper"])
def test_local_mode_hf_batches_and_token_weighting(name, masked):
    """One process, 4 micro-batches: HF label shift, -100 ignored and the loss averaged over the valid
    tokens of the whole batch (not per micro-batch) equal HF's own loss on the whole batch. BLOOM's and MPT's
    ALiBi biases (BLOOM's counted from each row's padding mask) come from autoparallel's forward. BART's and
    Whisper's decoders score each position against its own label (hf.shifts_labels False), and so does the
    trainer (it had shifted them: a different objective from the model's own)."""
    model = HF.build(name)
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=HF.make_plan(model, micro_batch=2))
    losses = [trainer.step(b) for b in HF.batches(masked=masked)]
    ref_losses, ref_params = reference(name, masked)
    loss_rel, param_abs = _max_diffs(losses, trainer.full_state_dict(), ref_losses, ref_params)
    assert loss_rel <= 1e-5 and param_abs <= 1e-5, (loss_rel, param_abs)


def test_router_aux_loss_in_local_mode():
    """One process, the whole batch in one micro-batch: HF's loss with the router load-balancing term
    (coef 0.1, about 0.2 of a ~5.0 loss: leaving it out misses by 4%), losses and final parameters
    within 1e-5 of HF's own loop; with two micro-batches the balance statistic would not span the batch:
    refused."""
    model = HF.build("mixtral-aux")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=HF.make_plan(model, micro_batch=HF.ROWS))
    losses = [trainer.step(b) for b in HF.batches(masked=True)]
    ref_losses, ref_params = reference("mixtral-aux", True)
    loss_rel, param_abs = _max_diffs(losses, trainer.full_state_dict(), ref_losses, ref_params)
    assert loss_rel <= 1e-5 and param_abs <= 1e-5, (loss_rel, param_abs)
    halves = AutoParallelTrainer(model, hardware=None, plan=HF.make_plan(model, micro_batch=HF.ROWS // 2))
    with pytest.raises(UserError, match=r"one micro-batch per data-parallel rank .* set micro_batch to the rows per "
                                        r"rank \(8\)"):
        halves.step(HF.batches(1)[0])


def test_attention_mask_in_batch_matches_hf():
    """A right-padded batch with attention_mask: same loss as HF's model(**batch).loss."""
    model = HF.build("qwen2")
    batch = HF.batches(1)[0]
    mask = torch.ones_like(batch["input_ids"])
    mask[::2, 12:] = 0
    labels = batch["labels"].masked_fill(mask == 0, -100)
    batch = {**batch, "labels": labels, "attention_mask": mask}
    with torch.no_grad():
        expected = model(**batch).loss.item()
    trainer = AutoParallelTrainer(model, lambda params: torch.optim.SGD(params, lr=0.0),
                                  plan=HF.make_plan(model, micro_batch=4))
    assert abs(trainer.step(batch) - expected) <= 1e-6 * expected


def test_resume_across_plans_into_one_process(world4):
    """dp2 x tp2 -> pp2 x dp2 -> one process: the checkpoint the second leg wrote before step 2 loads
    into a single process, whose last step equals the uninterrupted single-process run."""
    cfg = next(c for c in WORLD4 if c.name == "gpt2-resume-dp2xtp2-pp2xdp2")
    trainer = HF._trainer(cfg.model, {"micro_batch": 4}, seed=7)
    trainer.load_checkpoint(world4 / f"{cfg.name}.ckpt2")
    assert trainer.steps == 2
    losses = [trainer.step(b) for b in HF.batches()[2:]]
    ref_losses, ref_params = reference(cfg.model, False)
    loss_rel, param_abs = _max_diffs(losses, trainer.full_state_dict(), ref_losses[2:], ref_params)
    assert loss_rel <= 1e-5 and param_abs <= 1e-5, (loss_rel, param_abs)


@pytest.mark.parametrize("cfg", [c for c in WORLD4 if c.export], ids=lambda c: c.name)
def test_export_loads_with_from_pretrained_and_gives_the_same_logits(cfg, world4):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(world4 / f"{cfg.name}.hf")
    trained = H.gathered_params(world4, cfg.name)
    expected = HF.build(cfg.model, seed=3)
    expected.load_state_dict(trained)
    for name, p in loaded.named_parameters(remove_duplicate=False):
        assert torch.equal(p, trained[name]), name
    ids = HF.batches(1)[0]["input_ids"]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, expected(input_ids=ids).logits)


def test_local_export_round_trip(tmp_path):
    trainer = HF._trainer("qwen2", {"micro_batch": 4})
    trainer.step(HF.batches(1)[0])
    trainer.save_pretrained(tmp_path / "out")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    ids = HF.batches(1)[0]["input_ids"]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, trainer.model_parts[0](ids))


def test_an_export_onto_a_file_is_one_error(tmp_path):
    """transformers' save_pretrained onto a file logs a line and returns without writing: the user's script went
    on as if the model had been saved."""
    trainer = HF._trainer("qwen2", {"micro_batch": 4})
    target = tmp_path / "model.bin"
    target.write_text("keep me")
    with pytest.raises(UserError, match=r"save_pretrained: .*model.bin is a file; pass a directory"):
        trainer.save_pretrained(target)
    assert target.read_text() == "keep me"


def test_checkpoint_before_the_plan_exists():
    model = HF.build("llama")
    trainer = AutoParallelTrainer(model, hardware=None)
    with pytest.raises(UserError, match=r"load_checkpoint\(\) before the plan exists"):
        trainer.load_checkpoint("/nonexistent")


def test_train_hf_example_trains_and_exports(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "examples/train_hf.py", "--steps", "8", "--output", str(tmp_path / "out")],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    first, last = (float(x) for x in run.stdout.split("loss ")[-1].split(" in ")[0].split(" -> "))
    assert last < first
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.model_type == "llama"


@pytest.mark.parametrize("name", (*HF.MODELS, "mistral", "qwen2moe", "olmo2", "olmo", "cohere", "granite", "gemma2",
                                  "falcon", "gpt_neox", "gptj", "gemma3", "opt", "nanochat", "doge", "olmo3",
                                  "openai-gpt", "biogpt", "minimax", "deepseek_v3", "deepseek_v32", "gemma4",
                                  "gemma4-per-layer-input", "gemma4-kv-shared",
                                  "qwen3_5", "lfm2", "jamba", "mamba2", "whisper", "bloom", "mpt", "bart", "trocr"))
def test_training_forward_equals_the_models_own(name):
    """autoparallel.hf's forward (root-level positions, no mask builders) gives the logits of the
    model's own forward bit for bit, without a padding mask and with right and left padding (OPT counts
    positions from the mask), and leaves the user's module alone."""
    import copy

    from autoparallel.hf import hf_parts, install_forward, is_hf_causal_lm

    model = HF.build(name)
    assert is_hf_causal_lm(model)  # by get_output_embeddings(): BioGPT's head is `output_projection`
    ids = HF.batches(1)[0]["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    mine = copy.deepcopy(model)
    install_forward(mine, hf_parts(model))
    assert "forward" not in vars(model)
    with torch.no_grad():
        assert torch.equal(mine(ids), model(input_ids=ids).logits)
        valid = mask.bool()
        assert torch.equal(mine(ids, mask)[valid], model(input_ids=ids, attention_mask=mask).logits[valid])
        left = mask.flip(1)
        valid = left.bool()
        assert torch.equal(mine(ids, left)[valid], model(input_ids=ids, attention_mask=left).logits[valid])


def test_a_split_of_a_projection_that_runs_without_autograd_is_one_clear_error():
    """DeepSeek V3.2's top-k indexer runs under @torch.no_grad(): a head split of its projections leaves each rank's
    head sum partial (no gradient's reduction completes it) and the ranks would pick different tokens. The planner
    keeps it whole (cost_models.facts.no_grad_modules); a plan handed to the trainer that splits it is refused in
    one line, while the attention's own projections beside it split."""
    from autoparallel.trainer.tensor_parallel import _check_heads

    model = HF.build("deepseek_v32")
    attn = "model.layers.0.self_attn"
    for path, placement in ((f"{attn}.indexer.wq_b", "colwise"), (f"{attn}.indexer.weights_proj", "rowwise")):
        with pytest.raises(UserError, match=r"runs without autograd"):
            _check_heads(model, {path: placement}, 2)
    _check_heads(model, {f"{attn}.q_b_proj": "colwise", f"{attn}.o_proj": "rowwise"}, 2)  # raises nothing


def test_a_layer_type_without_rotary_parameters_gets_no_position_embedding():
    """Ergo's config gives its full-attention layers no rotary parameters (`rope_parameters["full_attention"]`
    None) and its base model passes them position_embeddings None; autoparallel's forward does the same (it had
    refused the model: no rotary table for that layer type), with the model's own logits."""
    import copy

    import transformers

    from autoparallel.hf import hf_parts, install_forward

    if not hasattr(transformers, "ErgoConfig"):
        pytest.skip("Ergo is in transformers >= 5.25")
    model = HF.build("ergo")
    parts = hf_parts(model)
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    assert parts.rotary_by_layer_type and parts.unrotated_types == ("full_attention",)
    ids = HF.batches(1)[0]["input_ids"]
    mine = copy.deepcopy(model)
    install_forward(mine, parts)
    with torch.no_grad():
        assert torch.equal(mine(ids), model(input_ids=ids).logits)


def test_a_block_argument_the_base_model_computes_is_one_error():
    """Beam's full-attention layers take no position embedding, as Ergo's, but its base model also computes a
    position-dependent query scale for them and passes it as `attention_scaling`, which causal_lm_forward would
    not (a different model: benchmarks/hf_coverage.py measured its logits 2.6e-4 apart): one error naming the
    argument. An argument the base model only hands on from its own inputs (GPT-2's `encoder_hidden_states`,
    None in a causal LM) keeps the model running as its own; GLM-5's "shared" indexer layers, which read the top-k
    the layer before them returns, are refused by their config."""
    import sys
    from pathlib import Path

    import transformers

    from autoparallel.errors import UserError
    from autoparallel.hf import hf_parts

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import hf_coverage
    if not hasattr(transformers, "BeamConfig"):
        pytest.skip("Beam is in transformers >= 5.25")
    beam = hf_coverage.check("beam")
    assert beam["result"] == "refused" and "the argument 'attention_scaling'" in beam["detail"], beam
    assert hf_coverage.check("gpt2")["result"] == "same"
    if hasattr(transformers, "GlmMoeDsaConfig"):
        cfg = hf_coverage.tiny_config("glm_moe_dsa")
        assert hf_coverage.check("glm_moe_dsa")["result"] == "same"  # every indexer layer "full"
        cfg.indexer_types = ["full", "shared"] * (cfg.num_hidden_layers // 2) + ["full"] * (cfg.num_hidden_layers % 2)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        with pytest.raises(UserError, match="config.indexer_types has 'shared' layers"):
            hf_parts(model)


@pytest.mark.parametrize("name, message", [
    ("ctrl", r"transformer holds \['pos_encoding'\] itself"),
    ("xglm", r"runs \['embed_positions'\] \(XGLMSinusoidalPositionalEmbedding\) before its blocks"),
    # (checked before its rotary tables, which its attention picks per kind from a dict)
    ("deepseek_v4", r"DeepseekV4ForCausalLM: model's forward reshapes the token embeddings before its blocks "
                    r"\(hyper-connections: config.hc_mult=4 residual streams per token"),
    # the trainer failed on the shapes: one residual stream where the blocks take hc_mult
    ("hy_v4", r"HYV4ForCausalLM: model's forward reshapes the token embeddings before its blocks \(hyper-connections"),
    ("qwen4_exp", r"Qwen4ExpForCausalLM: model's forward reshapes the token embeddings before its blocks"),
    # both gave other logits than the model's own (benchmarks/hf_coverage.py: DIFFERENT)
    ("dory", r"DoryForCausalLM: config.n_recurrent_loops=2 runs some of its layers 2 times a forward"),
    ("marian", r"model.decoder.embed_positions \(MarianSinusoidalPositionalEmbedding\) builds positions from the "
               r"input's shape"),
    # its CLI trace at 1024 tokens (a Python loop over the sequence in each block) had run past 5 minutes
    ("rwkv", r"RwkvForCausalLM: its config declares no attention heads \(num_attention_heads\)")])
def test_forwards_the_hf_path_cannot_reproduce_are_one_clear_error(name, message):
    """What a base model's forward does around its blocks that causal_lm_forward has no place for is refused
    with one line naming it (each gave other logits, or failed deep in transformers, before)."""
    from autoparallel.hf import hf_parts

    with pytest.raises(UserError, match=message):
        hf_parts(HF.build(name))


def test_the_base_forward_orders_its_pieces_as_they_run():
    """What runs around the blocks is ordered as the forward runs it, not as its text names it: a call's
    arguments first (`self.norm(self.proj(h))` runs proj, then norm), an assigned value before its target."""
    from autoparallel.trainer.structure import forward_order, runs_around

    class Base(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.proj, self.embed = torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity()
            self.layers = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, x):
            self.cache = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.norm(self.proj(x))

    base = Base()
    assert forward_order(base, ["norm", "proj", "layers", "embed"]) == ["embed", "layers", "proj", "norm"]
    assert runs_around(base, ["norm", "proj", "embed"], "layers") == set()


def test_modules_beside_the_base_model_and_head_are_one_clear_error():
    """The head is get_output_embeddings(), whatever its name; a module the LM holds besides it and the base model
    (Inkling 2's logit_softcap, BERT's transform around cls.predictions.decoder) would be skipped: refused."""
    from autoparallel.hf import hf_parts

    model = HF.build("llama")
    model.logit_softcap = torch.nn.LayerNorm(32)
    with pytest.raises(UserError, match=r"\['logit_softcap'\] \(LayerNorm\), beside its base model model and output "
                                        r"head lm_head, would not run"):
        hf_parts(model)


# Models whose layers attend differently (a sliding window on some, chunks on Llama 4's, everything on the rest),
# built tiny with a window or chunk of WINDOW tokens, so that a 16-token sequence leaves it on every layer that has
# one. Their config classes take these keywords at construction (layer_types is derived from some of them).
WINDOW = 4
_TWO = ["sliding_attention", "full_attention"]
WINDOWED = {
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),  # layer 0 full, 1 slides
    "mistral": dict(sliding_window=WINDOW),                                              # every layer slides
    "gemma2": dict(sliding_window=WINDOW, layer_types=_TWO),
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=_TWO),
    "cohere2": dict(sliding_window=WINDOW, layer_types=_TWO),
    "gpt_oss": dict(sliding_window=WINDOW, layer_types=_TWO, num_local_experts=4),  # eager attention with sinks
    "olmo3": dict(sliding_window=WINDOW, layer_types=_TWO),
    "llama4_text": dict(attention_chunk_size=WINDOW, layer_types=["chunked_attention", "full_attention"],
                        no_rope_layers=[1, 0], intermediate_size_mlp=128, num_local_experts=4),
}


@pytest.mark.parametrize("model_type", list(WINDOWED))
def test_windowed_and_chunked_layers_beyond_the_window_match_the_model(model_type):
    """Beyond its window (or chunk) each layer gets the mask of its own type, as transformers builds them per layer
    type (causal within WINDOW positions back; within WINDOW-token chunks counted from a row's first unpadded token;
    causal on the rest): the logits equal the model's own without a padding mask and, at the unpadded positions,
    with right and left padding. Before, these models were refused beyond the window (Gemma 3's 512 tokens, gpt-oss's
    128): one causal mask on every layer trains a different model (Llama 4's logits 0.58 of 0.62 off at 32 tokens
    in chunks of 8). Both forwards run the same fp32 ops on the same weights, and the masked scores are -inf-like
    either way (finfo.min added, or masked out), which softmax maps to exact zeros: equal, not close."""
    import copy

    import transformers as T

    from autoparallel.hf import hf_parts, install_forward

    cfg = T.AutoConfig.for_model(model_type, vocab_size=HF.VOCAB, hidden_size=64, intermediate_size=64,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                                 **WINDOWED[model_type])
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg).float().eval()
    parts = hf_parts(model)
    assert WINDOW in (parts.sliding_window, parts.attention_chunk)
    assert parts.mixed_windows == (model_type != "mistral") or parts.attention_chunk == WINDOW
    mine = copy.deepcopy(model)
    install_forward(mine, parts)
    ids = HF.batches(1)[0]["input_ids"][:2]
    assert ids.shape[1] >= 3 * WINDOW  # every layer with a window or chunks masks keys a causal mask would not
    right = torch.ones_like(ids)
    right[1, -5:] = 0
    with torch.no_grad():
        for mask in (None, right, right.flip(1)):
            valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
            got, ref = mine(ids, mask)[valid], model(input_ids=ids, attention_mask=mask).logits[valid]
            assert torch.equal(got, ref), f"{model_type}, mask {mask}: max |diff| {(got - ref).abs().max():.2e}"


def test_a_window_only_counts_where_the_models_forward_builds_its_mask():
    """Moshi's config carries a sliding_window (3000) that only reaches flash-attention kernels: its forward builds
    transformers' plain create_causal_mask, so under SDPA it attends to everything; applying the window there made
    its logits 0.63 of the largest off beyond the window (benchmarks/hf_coverage.py with every window at 4 tokens).
    The window counts where the base model's forward builds create_sliding_window_causal_mask (Mistral's, Gemma's),
    or where its forward builds neither (masks of its own: taken at the config's word)."""
    import types

    from autoparallel.hf import _windows

    cfg = types.SimpleNamespace(sliding_window=WINDOW, layer_types=None)
    assert _windows(cfg, "mask = create_sliding_window_causal_mask(**mask_kwargs)") == (WINDOW, False)  # Mistral's
    assert _windows(cfg, "causal_mask = create_causal_mask(config=self.config, ...)") == (None, False)  # Moshi's
    assert _windows(cfg, "") == (WINDOW, False)


def test_a_window_the_forward_cannot_mask_is_refused():
    """A layer type beyond the three masks causal_lm_forward builds, in a model whose layers attend differently
    beyond the window, is one error line rather than a causal mask it does not ask for."""
    import copy

    import transformers as T

    from autoparallel.hf import hf_parts, install_forward

    cfg = T.AutoConfig.for_model("cohere2", vocab_size=HF.VOCAB, hidden_size=64, intermediate_size=64,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                                 sliding_window=WINDOW, layer_types=_TWO)
    model = T.AutoModelForCausalLM.from_config(cfg).eval()
    parts = hf_parts(model)
    mine = copy.deepcopy(model)
    install_forward(mine, parts)
    mine.model.layers[1]._layer_type = "local_attention"  # what the forward looks the type up as
    ids = HF.batches(1)[0]["input_ids"][:1]
    with torch.no_grad(), pytest.raises(UserError, match=r"layer type 'local_attention'.*use seq_len <= 4"):
        mine(ids)


@dataclasses.dataclass(frozen=True)
class FalconCase:
    name: str
    extra: tuple = ()   # config overrides: the three query_key_value layouts


FALCON = [FalconCase("falcon-mq"), FalconCase("falcon-per-head", (("multi_query", False),)),
          FalconCase("falcon-grouped", (("new_decoder_architecture", True), ("num_kv_heads", 2)))]


def _falcon(extra: tuple):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                               attn_implementation="sdpa", **dict(extra))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).float()


def _falcon_batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (4, 16), generator=g) for _ in range(3)]


def _falcon_train(cfg: FalconCase, out, rank: int) -> dict:
    """dp1 x tp2 on Falcon passed as it is: the MLP split column -> row, the fused attention kept whole
    (no tp divides it by heads; hf._falcon_split), and the MLP's in-place residual add on the rowwise
    output (owned_outputs)."""
    losses, trainer = HF.sgd_trainer_losses(_falcon(cfg.extra), _falcon_batches())
    return {"losses": losses, "placements": trainer.plan.placements}


def test_falcon_under_tensor_parallelism_matches_hf(tmp_path):
    """Per-step losses of HF's own loop (same SGD, same batches) within 1e-5 relative: the fp32 bound the
    other configurations of this file hold (tests/trainer_helpers.py derives it)."""
    H.run_spawned(2, FALCON, tmp_path, train=_falcon_train)
    for cfg in FALCON:
        res = H.result(tmp_path, cfg.name)
        model = _falcon(cfg.extra)
        if cfg.name == "falcon-mq" and "error" in res:
            # transformers >= 5.25 hands attention Falcon's one key/value head (its attention interface repeats
            # it there): the trace reads kv heads 1, which no tp > 1 divides, and the pin is one error line
            from autoparallel.tracer import trace
            from cost_models.estimate import attention_heads
            assert attention_heads(trace(model, batch=1, seq_len=16))[1] == 1, res["error"]
            assert res["error"] == "UserError: pin tp=2 does not divide the model's 4 heads / 1 kv heads"
            continue
        assert "error" not in res, res.get("error")
        ref = HF.sgd_losses(model, _falcon_batches())
        assert max(abs(a - b) / b for a, b in zip(res["losses"], ref, strict=True)) < 1e-5, (cfg.name, res["losses"], ref)
        assert res["placements"]["transformer.h.0.mlp.dense_h_to_4h"] == "colwise"


@pytest.mark.parametrize("recompute", ["full", "op"])
def test_rotary_tables_per_layer_type_under_recompute_match_hf(recompute):
    """Gemma 3's rotary table depends on each layer's attention type; under activation checkpointing the
    block is a wrapper whose attention sits one level further down (the lookup missed it: TypeError)."""
    ref_losses, ref_params = HF.reference("gemma3", steps=2)
    model = HF.build("gemma3")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=HF.make_plan(model, recompute=recompute))
    losses = [trainer.step(b) for b in HF.batches(2)]
    loss_rel, param_abs = _max_diffs(losses, trainer.full_state_dict(), ref_losses, ref_params)
    assert loss_rel <= H.LOSS_RTOL and param_abs <= H.PARAM_ATOL, (loss_rel, param_abs)


@pytest.mark.parametrize("padding", [False, True])
def test_the_first_batchs_padding_reaches_the_planner(padding, monkeypatch):
    """The trainer plans on its first batch: one with padding (an attention mask with zeros, which it keeps) is
    planned as padded, one without (a mask of ones, which it drops) as not (api.plan_model's `padded`); a trainer
    that plans at construction (global_batch_size, seq_len) takes it from `padded=`."""
    import autoparallel.api as api

    seen = []
    real = api.plan_model

    def spy(*args, **kwargs):
        seen.append(kwargs.get("padded"))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "plan_model", spy)
    model = HF.build("llama")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), hardware="h200",
                                  fix={"compile": 0})
    batch = HF.batches(1)[0]
    mask = torch.ones_like(batch["input_ids"])
    if padding:
        mask[1, -3:] = 0
    trainer.step({**batch, "attention_mask": mask})
    assert seen == [padding]
    AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), hardware="h200", fix={"compile": 0},
                        global_batch_size=8, seq_len=16, padded=padding)
    assert seen == [padding, padding]


def test_a_hybrids_blocks_of_two_classes_are_its_blocks():
    """Jamba's layer list holds attention and Mamba layers (two classes): the trainer's layout and the tracer's
    blocks are that list (they had required one class: the whole model one FSDP unit, no pipeline stages),
    a MoE's expert list never wins, and MOSS-Transcribe's language layers are its blocks, not its audio tower's
    (as many layers of one class, which a text step never runs)."""
    from autoparallel.hf import hf_layer_list
    from autoparallel.tracer import find_blocks
    from autoparallel.trainer.structure import find_layout

    jamba = HF.build("jamba")
    assert {type(b).__name__ for b in jamba.model.layers} == {"JambaMambaDecoderLayer", "JambaAttentionDecoderLayer"}
    assert hf_layer_list(jamba) == "model.layers"
    assert find_blocks(jamba) == ["model.layers.0", "model.layers.1"]
    assert find_layout(jamba).block_paths == ("model.layers.0", "model.layers.1")
    mixtral = HF.build("mixtral")
    assert find_blocks(mixtral) == ["model.layers.0", "model.layers.1"]
    transformers = pytest.importorskip("transformers")
    if "moss_transcribe_diarize" in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
        from hf_coverage import tiny_config
        moss = transformers.AutoModelForCausalLM.from_config(tiny_config("moss_transcribe_diarize"))
        assert len(moss.model.audio_tower.layers) == len(moss.model.language_model.layers)  # a tie of one class each
        assert find_blocks(moss) == ["model.language_model.layers.0", "model.language_model.layers.1"]


# A heterogeneous config (transformers' per_layer_config, dots3): each layer reads its own heads, and the global
# read of a per-layer attribute raises (AmbiguousGlobalPerLayerAttributeError) where autoparallel read it. Both it
# and DeepSeek V3.2 run a top-k indexer under @torch.no_grad, whose projections tensor parallelism keeps whole
# (facts.no_grad_modules): split by heads, each rank's head sum was partial and its key norm was cut. OLMo's and
# nanochat's norms have no parameters, so the Megatron-style placements (the planner's fallback where a pinned tp
# finds nothing worth splitting) took gate/up, fed by o_proj, for rowwise Linears: the trainer crashed in the MLP
# Aria's shared experts (two of intermediate_size each) hold a plain gate_proj 2 * intermediate_size wide, which
# the trainer took for Phi-3's fused gate_up_proj (hf.fused_split: only where a sibling reads half of it); the
# sharding solver leaves Nemotron-H's token embedding and LM head whole under sequence parallelism, and the trainer
# now slices and gathers there as the solver priced it (each rank had read its whole sequence as its chunk)
# BLOOM's and MPT's attention split by heads: each rank takes its heads' rows of the ALiBi bias (hf.localize_head_bias)
INDEXED = [FalconCase("dots3-hetero"), FalconCase("deepseek_v32"), FalconCase("olmo"), FalconCase("nanochat"),
           FalconCase("moshi"), FalconCase("persimmon"), FalconCase("aria_text"), FalconCase("nemotron_h"),
           FalconCase("bloom"), FalconCase("mpt")]
# read piece by piece through a view of their features: Moshi's gating MLP (fc1 as view(b, s, 2, -1)[..., 0 / 1, :],
# gate and up) and Persimmon's per-head fused qkv (view(b, s, H, 3, d)[..., 0 / 1 / 2, :], split by whole heads:
# hf._head_layout); Megatron-style columns would hand each rank gate or up, or crash on the heads
TINY = ("moshi", "persimmon", "aria_text", "nemotron_h")  # built from benchmarks/hf_coverage.py's tiny config (tests/hf_helpers builds neither)


def _dots3():
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model(
        "dots3_note_text", num_hidden_layers=3, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, num_attention_heads=8, num_key_value_heads=8, vocab_size=128,
        kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa",
        layer_types=["indexed_attention", "sliding_attention", "indexed_attention"],
        per_layer_config={1: {"num_attention_heads": 4, "num_key_value_heads": 4}})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).float()


def _indexed(name: str):
    if name in TINY:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
        from hf_coverage import tiny_config
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(tiny_config(name)).float()
    return _dots3() if name == "dots3-hetero" else HF.build(name)


def _indexed_train(cfg: FalconCase, out, rank: int) -> dict:
    return {"losses": HF.sgd_trainer_losses(_indexed(cfg.name), _falcon_batches())[0]}


def _needs_heterogeneous_configs() -> None:
    transformers = pytest.importorskip("transformers")
    if "dots3_note_text" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip("this transformers has no heterogeneous (per_layer_config) model type")


def test_a_heterogeneous_config_plans_with_the_heads_every_layer_divides():
    """Layers of 8, 4 and 8 heads: tensor parallelism must divide the fewest (their gcd), so tp=8 is one error line
    and tp=4 plans; the global heads read no longer raises."""
    _needs_heterogeneous_configs()
    from autoparallel.api import plan_model
    model = _dots3()
    assert [c.num_attention_heads for c in model.config.per_layer_config] == [8, 4, 8]
    with pytest.raises(UserError, match="does not divide the model's 4 heads / 4 kv heads"):
        plan_model(model, hardware="h100-sxm", gpus=8, global_batch=8, seq_len=16, fix={"tp": 8})
    assert plan_model(model, hardware="h100-sxm", gpus=8, global_batch=8, seq_len=16, fix={"tp": 4}).tp == 4


def test_tensor_parallelism_of_models_as_passed_matches_hf(tmp_path):
    """dp1 x tp2 on a heterogeneous dots3, DeepSeek V3.2, OLMo, nanochat, Moshi, Persimmon, Aria, Nemotron-H, BLOOM and MPT,
    passed as they are: per-step losses of HF's own loop (same SGD, same batches) within the file's fp32 bound
    (1e-5 relative)."""
    transformers = pytest.importorskip("transformers")
    cases = [c for c in INDEXED if c.name != "dots3-hetero"
             or "dots3_note_text" in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES]
    H.run_spawned(2, cases, tmp_path, train=_indexed_train)
    for cfg in cases:
        res = H.result(tmp_path, cfg.name)
        assert "error" not in res, (cfg.name, res.get("error"))
        ref = HF.sgd_losses(_indexed(cfg.name), _falcon_batches())
        assert max(abs(a - b) / b for a, b in zip(res["losses"], ref, strict=True)) < H.LOSS_RTOL, \
            (cfg.name, res["losses"], ref)
