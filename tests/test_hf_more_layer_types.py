"""Hugging Face causal LMs whose base models hand their blocks more than one rotary table or mask, passed as they are.

* Granite-SWA and GraniteMoE-SWA: one rotary module per distinct per-layer rope theta (config.layer_rope_theta,
  theta 0 for a layer without position embedding), which the base model picks for each block by that list.
* LFM3: short-convolution layers ("conv") beside sliding and full attention, its rotary module holding tables for
  the attention types only; the base model hands a conv layer no table (and the [B, S] padding mask).
* Falcon-H1: a Mamba-2 mixer beside the attention in every block, which takes the [B, S] padding mask as
  `mamba_attention_mask` (it zeroes padded tokens before its convolution and scan: left padding would otherwise
  leak into the state), and logits times lm_head_multiplier.

autoparallel's Hugging Face forward (autoparallel/hf.py, what the trainer and the tracer run) hands each block what
the model's own forward does: the logits agree in fp32 without a padding mask and with right and left padding.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

pytest.importorskip("transformers")

import hf_helpers as HF  # noqa: E402
import trainer_helpers as H  # noqa: E402

_KW = dict(vocab_size=HF.VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=8, num_key_value_heads=4,
           max_position_embeddings=64)


def _config(name: str):
    import transformers as T

    if name == "granite_swa":  # two thetas and a NoPE layer, full and sliding layers, a window under the sequence
        return T.GraniteSWAConfig(**_KW, num_hidden_layers=4, sliding_window=6, embedding_multiplier=3.0,
                                  layer_types=["full_attention", "sliding_attention"] * 2,
                                  layer_rope_theta=[10000.0, 0, 500000.0, 10000.0])
    if name == "granitemoe_swa":
        return T.GraniteMoeSWAConfig(**_KW, num_hidden_layers=3, sliding_window=6, num_local_experts=4,
                                     num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention",
                                                                         "sliding_attention"],
                                     layer_rope_theta=[500000.0, 10000.0, 0])
    if name == "lfm3":  # conv, sliding and full layers; sandwich norms (its default)
        return T.Lfm3Config(**_KW, num_hidden_layers=4, head_dim=4, sliding_window=6, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2, layer_types=["conv", "sliding_attention", "full_attention", "conv"])
    if name == "falcon_h1":  # multipliers off 1, a scan chunk under the sequence
        return T.FalconH1Config(**_KW, num_hidden_layers=2, head_dim=4, mamba_d_ssm=None, mamba_n_heads=4,
                                mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8, lm_head_multiplier=0.25,
                                embedding_multiplier=3.0, ssm_multipliers=[0.5, 2.0, 1.5, 0.7, 1.3],
                                mlp_multipliers=[0.5, 2.0], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    raise KeyError(name)


def _build(name: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(name)).float()


def _max_diff(model, ids: torch.Tensor) -> float:
    """The largest |logit difference| of autoparallel's forward against the model's own, over the unpadded positions
    without a padding mask and with right and left padding, relative to the largest logit."""
    from autoparallel.hf import hf_parts, install_forward

    mask = torch.ones_like(ids)
    mask[1, ids.shape[1] - 5:] = 0
    mine = copy.deepcopy(model)
    install_forward(mine, hf_parts(model))
    worst = 0.0
    with torch.no_grad():
        for m in (None, mask, mask.flip(1)):
            valid = torch.ones_like(ids, dtype=torch.bool) if m is None else m.bool()
            ref = model(input_ids=ids, attention_mask=m, use_cache=False).logits[valid]
            worst = max(worst, float((mine(ids, m)[valid] - ref).abs().max() / ref.abs().max()))
    return worst


@pytest.mark.parametrize("name", ["granite_swa", "granitemoe_swa", "lfm3", "falcon_h1"])
def test_training_forward_equals_the_models_own(name):
    """The logits of autoparallel's forward equal the model's own within 1e-5 (these types had been refused)."""
    model = _build(name).eval()
    assert _max_diff(model, HF.batches(1)[0]["input_ids"][:2]) <= 1e-5


@pytest.mark.parametrize("model_type", ["granite", "hyperclovax"])
def test_logits_scaling_is_applied_as_the_models_own_forward_applies_it(model_type):
    """config.logits_scaling off 1: Granite's forward divides the logits by it, HyperCLOVA X's multiplies them (MuP);
    autoparallel's forward had divided for both, a silent wrong objective for HyperCLOVA X."""
    import transformers as T
    from transformers import AutoModelForCausalLM

    config = T.AutoConfig.for_model(model_type, **_KW, num_hidden_layers=2, logits_scaling=4.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    assert _max_diff(model, HF.batches(1)[0]["input_ids"][:2]) <= 1e-5


def _scaled_llama(bias: bool):
    import transformers as T
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class ScaledLlamaForCausalLM(T.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kwargs):
            outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 **kwargs)
            hidden_states = outputs.last_hidden_state / self.config.head_input_divisor
            return CausalLMOutputWithPast(logits=self.lm_head(hidden_states))

    config = T.LlamaConfig(**_KW, num_hidden_layers=2, head_input_divisor=6.0)
    torch.manual_seed(0)
    model = ScaledLlamaForCausalLM(config).float().eval()
    if bias:
        model.lm_head.bias = torch.nn.Parameter(torch.randn(HF.VOCAB))
    return model


def test_a_scaling_before_the_head_is_the_same_scaling_of_its_logits():
    """A forward that divides the base model's output by a number before its head (Inkling's, by
    config.logits_mup_width_multiplier): through a head without a bias that is the logits divided by it
    (hf._logit_ops, first); it had been refused. With a bias on the head the two differ: one error line."""
    from autoparallel.errors import UserError
    from autoparallel.hf import hf_parts

    model = _scaled_llama(bias=False)
    assert hf_parts(model).logit_ops[0] == ("div", 6.0)
    assert _max_diff(model, HF.batches(1)[0]["input_ids"][:2]) <= 1e-5
    with pytest.raises(UserError, match=r"divides the base model's output by self\.config\.head_input_divisor"
                                         r"=6\.0 before its head lm_head"):
        hf_parts(_scaled_llama(bias=True))


def _normed_embedding_llama():
    """A Llama whose token embedding normalizes the rows it looks up inside its own forward, as Inkling's
    InklingNormedEmbedding does (Inkling itself is refused for its sliding window)."""
    import transformers as T

    class NormedEmbedding(torch.nn.Embedding):
        def __init__(self, rows: int, width: int) -> None:
            super().__init__(rows, width)
            self.embed_norm = T.models.llama.modeling_llama.LlamaRMSNorm(width)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embed_norm(super().forward(ids))

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**_KW, num_hidden_layers=2)).float()
    model.model.embed_tokens = NormedEmbedding(HF.VOCAB, _KW["hidden_size"])
    return model


def test_an_embedding_with_a_norm_of_its_own_stays_whole_under_tp():
    """An embedding that normalizes the looked-up rows inside its forward (Inkling's InklingNormedEmbedding): split by
    vocabulary, the norm would see each rank's partial rows (torch's style also refused the table: "parameter name
    can't contain '.'"). The planner's layouts keep it whole and a hand-written vocab placement is one error."""

    from autoparallel.api import plan_result
    from autoparallel.errors import UserError
    from autoparallel.placements import megatron_placements
    from autoparallel.report import explain_op
    from autoparallel.trainer.tensor_parallel import _check_divisible
    from cost_models.facts import embeddings_with_inner_modules

    model = _normed_embedding_llama()
    result, ctx = plan_result(model, hardware="h100-sxm", gpus=2, global_batch=4, seq_len=16, fix={"tp": 2},
                              cache=False)
    assert embeddings_with_inner_modules(ctx.graph) == {"model.embed_tokens"}
    assert megatron_placements(ctx.graph)["model.embed_tokens"] == "replicate"
    # the sharding solver does not offer the split (at this width it would not pay anyway: asked, not inferred)
    assert re.search(r"vocab +not possible .*: it runs modules of its own on the looked-up rows",
                     explain_op(ctx, result.plan, "model.embed_tokens"))
    with pytest.raises(UserError, match=r"vocab on model\.embed_tokens: NormedEmbedding runs modules of its "
                                         r"own \(embed_norm\)"):
        _check_divisible("model.embed_tokens", model.model.embed_tokens, "vocab", 2)


def test_each_granite_swa_layer_gets_the_table_of_its_theta():
    """Block i takes the rotary module of theta layer_rope_theta[i] (the base model's `rotary_embs`, in the order of
    their thetas), a NoPE layer none; the base model's own `rotary_emb` (the global theta) is not used."""
    from autoparallel.hf import hf_parts

    parts = hf_parts(_build("granite_swa"))
    assert parts.rotary_by_layer == ("model.rotary_embs.0", None, "model.rotary_embs.1", "model.rotary_embs.0")
    assert parts.sliding_window == 6 and parts.mixed_windows


def test_local_trainer_matches_the_models_own_loop():
    """One process, the batch in one micro-batch: per-step losses and final parameters equal HF's own AdamW loop on
    right-padded batches."""
    from autoparallel.trainer import AutoParallelTrainer

    batches = HF.batches(2, masked=True)
    ref_losses, ref_params = H.adamw_loop(_build("granite_swa"), batches, lambda m, b: m(**b).loss)
    model = _build("granite_swa")
    trainer = AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                                  plan=HF.make_plan(model, micro_batch=HF.ROWS))
    losses = [trainer.step(b) for b in batches]
    params = trainer.full_state_dict()
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= H.LOSS_RTOL, (losses, ref_losses)
    assert max((params[n] - p).abs().max().item() for n, p in ref_params.items()) <= H.PARAM_ATOL


def test_lfm3_conv_layers_take_no_rotary_table():
    """LFM3's conv layers are recurrent (the padding mask, no causal one) and take no rotary table: its rotary module
    holds one per attention type only, and hf_parts had refused the model for that."""
    from autoparallel.hf import hf_parts

    parts = hf_parts(_build("lfm3"))
    assert parts.unrotated_types == ("conv",) and parts.padding_mask_types == ("conv",)
    assert parts.rotary_by_layer_type and parts.sliding_window == 6 and parts.mixed_windows


def test_falcon_h1_hands_its_mixers_the_padding_mask():
    """Falcon-H1's blocks take the padding mask as `mamba_attention_mask` beside the attention's causal mask, and its
    logits are multiplied by lm_head_multiplier: hf_parts reads both (it had refused the model for the convolution);
    without the mask a left-padded batch's logits differ."""
    import dataclasses

    from autoparallel.hf import causal_lm_forward, hf_parts

    model = _build("falcon_h1").eval()
    parts = hf_parts(model)
    assert parts.padding_mask_args == ("mamba_attention_mask",) and parts.logit_ops == (("mul", 0.25),)
    ids = HF.batches(1)[0]["input_ids"][:2]
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[mask.bool()]
        blind = causal_lm_forward(model, ids, mask, parts=dataclasses.replace(parts, padding_mask_args=()))
    assert (blind[mask.bool()] - ref).abs().max() / ref.abs().max() > 1e-4  # (the tolerance: 1e-5)


@pytest.mark.parametrize("model_type, why", [
    ("deepseek_v4", r"model's forward reshapes the token embeddings before its blocks \(hyper-connections: "
                    r"config.hc_mult=4 residual streams per token, which the blocks take and return and which are "
                    r"merged after them\)"),
    ("zamba2", r"model's forward passes its blocks \(Zamba2HybridLayer, Zamba2MambaDecoderLayer\) "
               r"original_hidden_states, layer_idx, causal_mask_mapping\['full_attention'\] by position \(as "
               r"original_hidden_states, layer_idx, causal_mask\) beside the hidden states"),
    ("inkling_text", r"config\.sliding_window_size=512 limits its attention layers to a sliding window that "
                     r"autoparallel's Hugging Face forward does not apply"),
])
def test_what_stays_refused_says_what_its_forward_does(model_type, why):
    """What autoparallel's forward cannot reproduce is named in one line: DeepSeek V4's hyper-connections (it had been
    refused for its rotary tables, which it picks per attention kind from a dict), Zamba2's positional block
    arguments (the token embeddings its shared attention blocks concatenate, the layer index, both masks), Inkling's
    sliding window under another name (config.sliding_window_size: beyond it autoparallel's forward had attended
    globally, 11% off the logits)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from autoparallel.errors import UserError
    from autoparallel.hf import hf_parts, quiet_optional_kernels

    cfg = AutoConfig.for_model(model_type)
    cfg.num_hidden_layers = 2
    if model_type == "zamba2":
        cfg.layers_block_type = ["mamba", "hybrid"]
    with torch.device("meta"), quiet_optional_kernels():
        model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UserError, match=f"^{type(model).__name__}: {why}") as e:
        hf_parts(model)
    assert "\n" not in str(e.value)
