"""Tiny random-weight Hugging Face causal LMs for the trainer tests (transformers required), their
Megatron placements by module role, HF batches, the single-process reference loop with HF's own loss,
and a spawned multi-process runner (one process group for many configurations, as trainer_helpers).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import trainer_helpers as H
from torch import nn

from autoparallel.placements import megatron_placements
from autoparallel.plan import Plan
from autoparallel.tracer import trace
from autoparallel.trainer.structure import find_layout, model_fingerprint

STEPS = 3
VOCAB = 128
SEQ = 16
ROWS = 8
# 8 heads and 4 kv heads: whole (GQA) heads split under tp 2 and 4.
_KW = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=64)
MODELS = ("llama", "qwen2", "gpt2", "mixtral", "qwen3moe", "phi3", "gemma")


def config(name: str):
    import transformers as T

    if name.endswith("-aux"):  # the MoE router's load-balancing loss added to the loss, as HF does
        cfg = config(name.removesuffix("-aux"))
        cfg.output_router_logits, cfg.router_aux_loss_coef = True, 0.1
        return cfg
    if name == "llama":
        return T.LlamaConfig(**_KW)
    if name == "qwen2":
        return T.Qwen2Config(**_KW)
    if name == "gpt2":  # dropout off: the reference and the parallel run must draw nothing
        return T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=8, n_positions=64, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    if name == "mixtral":
        return T.MixtralConfig(**_KW, num_local_experts=4, num_experts_per_tok=2)
    if name == "qwen3moe":
        return T.Qwen3MoeConfig(**_KW, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=4)
    if name == "phi3":
        return T.Phi3Config(**_KW, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "qwen2moe":  # routed experts plus a gated shared expert
        return T.Qwen2MoeConfig(**_KW, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                                num_experts_per_tok=2)
    if name == "olmo2":  # q_norm / k_norm over all heads (not per head like Qwen3)
        return T.Olmo2Config(**_KW)
    if name == "llama4":  # four blocks: two virtual stages per pipeline rank
        return T.LlamaConfig(**{**_KW, "num_hidden_layers": 4})
    if name == "mistral":  # a sliding window shorter than the test sequences
        return T.MistralConfig(**_KW, sliding_window=6)
    if name == "gemma":
        return T.GemmaConfig(**_KW, head_dim=4)
    # beyond the seven of issue 13: what their forwards do differently from Llama's
    if name == "olmo":  # a final LayerNorm without parameters
        return T.OlmoConfig(**_KW)
    if name == "cohere":  # logits times logit_scale
        return T.CohereConfig(**_KW, logit_scale=0.5)
    if name == "granite":  # embeddings times embedding_multiplier, logits divided by logits_scaling
        return T.GraniteConfig(**_KW, embedding_multiplier=3.0, logits_scaling=4.0, residual_multiplier=0.5,
                               attention_multiplier=0.25)
    if name == "gemma2":  # logits soft-capped
        return T.Gemma2Config(**_KW, head_dim=4, final_logit_softcapping=2.0, sliding_window=64)
    if name == "falcon":  # blocks that require an `alibi` argument, a fused multi-query query_key_value
        return T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    if name == "gpt_neox":  # a per-head interleaved fused query_key_value
        return T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64)
    if name == "gptj":  # rotary on part of each head, its table a buffer other than inv_freq
        return T.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    if name == "gemma3":  # one rotary table per attention layer type (local and global bases)
        return T.Gemma3TextConfig(**_KW, head_dim=4, sliding_window=64,
                                  layer_types=["sliding_attention", "full_attention"])
    if name == "opt":  # positions counted from the padding mask, projections around the blocks, its final
        # norm registered before them (word_embed_proj_dim < hidden_size: OPT-350m's project_in / project_out)
        return T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=8,
                           max_position_embeddings=64, word_embed_proj_dim=16, dropout=0.0, pad_token_id=None, bos_token_id=0,
                           eos_token_id=0)
    # found by benchmarks/hf_coverage.py: what their forwards do beyond the others'
    if name == "nanochat":  # one parameter-free norm run before the blocks and after them
        return T.NanoChatConfig(**_KW)
    if name == "doge":  # an attention that reads a materialized causal mask (is_causal would not apply)
        return T.DogeConfig(**_KW)
    if name == "olmo3":  # a rotary table per layer type, the type kept as the attention's `attention_type`
        return T.Olmo3Config(**_KW, sliding_window=64, layer_types=["sliding_attention", "full_attention"])
    if name == "openai-gpt":  # blocks that take no position_ids and return a list
        return T.OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                                 embd_pdrop=0.0, attn_pdrop=0.0)
    # refused, each with one line: a sinusoidal table the base model holds itself (CTRL), a position module of
    # its own forward (XGLM); run as it is: a norm between the embeddings and the blocks (BART's decoder)
    if name == "ctrl":
        return T.CTRLConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, dff=64, n_positions=64,
                            resid_pdrop=0.0, embd_pdrop=0.0)
    if name == "xglm":
        return T.XGLMConfig(vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
                            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    if name == "bart":
        return T.BartConfig(vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                            decoder_ffn_dim=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                            max_position_embeddings=64, dropout=0.0)
    # beyond the trainer matrix, for the forward checks: a head named `output_projection` and a position table
    # that takes the mask yet counts 0..S-1 (BioGPT), a linear-attention layer (blocks of 8 tokens) that zeroes
    # padded tokens by the 2-D mask (MiniMax), a recurrence with no attention heads (RWKV), a layer type without
    # a rotary table (DeepSeek V4: "main" / "compress")
    if name == "biogpt":
        return T.BioGptConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
    if name == "minimax":
        return T.MiniMaxConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, intermediate_size=128, num_local_experts=4,
                               num_experts_per_tok=2, max_position_embeddings=64, block_size=8,
                               layer_types=["full_attention", "linear_attention"])
    if name == "rwkv":
        return T.RwkvConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64,
                            intermediate_size=128, context_length=64)
    if name == "ergo":  # transformers >= 5.25: its full-attention layers take no position embedding (NoPE)
        return T.ErgoConfig(**_KW, first_dense_intermediate_size=64, moe_intermediate_size=32,
                            shared_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                            global_attention_every_n_layers=2, sliding_window=64)
    if name == "deepseek_v4":
        return T.DeepseekV4Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, qk_rope_head_dim=8, q_lora_rank=32,
                                  moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                  max_position_embeddings=64)
    # Gemma 4: the last layer of each type stores its keys and values in a dict the base model passes every
    # block (no layer reuses them here); per-layer inputs and reused keys and values (pp=1 only:
    # tests/test_hf_gemma4_ple.py)
    if name == "gemma4":
        return T.Gemma4TextConfig(**_KW, head_dim=4, hidden_size_per_layer_input=0, sliding_window=64,
                                  layer_types=["sliding_attention", "full_attention"])
    if name == "gemma4-per-layer-input":
        return T.Gemma4TextConfig(**_KW, head_dim=4, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
                                  sliding_window=64, layer_types=["sliding_attention", "full_attention"])
    if name == "gemma4-kv-shared":
        return T.Gemma4TextConfig(**{**_KW, "num_hidden_layers": 4}, head_dim=4, hidden_size_per_layer_input=0,
                                  num_kv_shared_layers=2, sliding_window=64,
                                  layer_types=["sliding_attention", "full_attention"] * 2)
    # latent attention (MLA) with grouped routing; DeepSeek V3.2's sparse attention, whose indexer reads the
    # materialized causal mask (asked for through a dict of mask kwargs); HY-V4's hyper-connections (refused)
    mla = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
               intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
               n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
               v_head_dim=16, first_k_dense_replace=1, max_position_embeddings=64)
    if name == "deepseek_v3":
        return T.DeepseekV3Config(**mla)
    if name == "deepseek_v32":  # 4 of the 16 keys kept: the indexer's choice decides the logits
        return T.DeepseekV32Config(**mla, index_topk=4, index_head_dim=16, index_n_heads=2)
    if name == "hy_v4":
        return T.HYV4Config(**{k: v for k, v in mla.items() if k != "first_k_dense_replace"}, head_dim=8,
                            pad_token_id=0, index_topk=4, index_head_dim=16, index_n_heads=2)
    if name == "qwen4_exp":  # hyper-connections: hidden_states.repeat(1, 1, hc_count) before the blocks
        return T.Qwen4ExpTextConfig(**_KW, head_dim=8, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8,
                                    indexer_budget=8, indexer_compress_ratio=4)
    # hybrids whose mixers read the [B, S] padding mask (transformers' "linear_attention" / "conv" layer types):
    # Qwen3.5's gated delta rule and LFM2's short convolution beside full attention, Jamba's Mamba with MoE
    if name == "qwen3_5":
        return T.Qwen3_5TextConfig(**_KW, head_dim=8, linear_num_key_heads=4, linear_num_value_heads=8,
                                   linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                                   layer_types=["linear_attention", "full_attention"])
    if name == "lfm2":
        return T.Lfm2Config(**{**_KW, "num_hidden_layers": 2}, block_ff_dim=64, block_auto_adjust_ff_dim=False,
                            layer_types=["conv", "full_attention"])
    if name == "jamba":
        return T.JambaConfig(**_KW, num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
                             attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_dt_rank=4,
                             mamba_expand=2)
    if name == "mamba2":  # Mamba-2 alone: every block a state-space mixer (the chunked scan), no attention
        return T.Mamba2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
                              expand=2, state_size=16, n_groups=1, chunk_size=8, conv_kernel=4)
    if name == "dory":  # a looped model: its middle layers run n_recurrent_loops times a forward
        return T.DoryConfig(**{**_KW, "num_hidden_layers": 4})
    if name == "marian":  # a sinusoidal position table that takes the input's shape
        return T.MarianConfig(vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                              decoder_ffn_dim=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                              max_position_embeddings=64, pad_token_id=0, decoder_start_token_id=0)
    if name == "whisper":  # a learned position table that takes the input ids first, the position ids by keyword
        return T.WhisperConfig(vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                               decoder_ffn_dim=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                               max_target_positions=64, pad_token_id=0, decoder_start_token_id=0,
                               bos_token_id=0, eos_token_id=0)
    # ALiBi, per-head position biases their base models build: BLOOM's from the attention mask (with a LayerNorm on
    # the embeddings and a per-head fused query_key_value), MPT's from max_seq_len (a [q | k | v] fused Wqkv)
    if name == "bloom":
        return T.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)
    if name == "mpt":
        return T.MptConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    if name == "trocr":  # BART's layernorm_embedding; an attention that reshapes its output to its input's width
        return T.TrOCRConfig(vocab_size=VOCAB, d_model=64, decoder_layers=2, decoder_attention_heads=4,
                             decoder_ffn_dim=128, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                             activation_dropout=0.0)
    raise KeyError(name)


def build(name: str, seed: int = 0, meta: bool = False) -> nn.Module:
    """meta: on the meta device (the trainer initializes the shards with the model's init_weights())."""
    import transformers as T

    if not meta:
        torch.manual_seed(seed)
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = T.AutoModelForCausalLM.from_config(config(name))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return model


def batches(steps: int = STEPS, masked: bool = False) -> list[dict[str, torch.Tensor]]:
    """HF batches {"input_ids", "labels"} (labels = inputs, HF shifts them). masked: rows right-padded
    by different amounts (attention_mask 0, labels -100 there) and some leading labels -100, so
    micro-batches and data slices hold different numbers of valid tokens."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
        batch = {"input_ids": ids, "labels": ids.clone()}
        if masked:
            mask = torch.ones_like(ids)
            for r in range(ROWS):
                mask[r, SEQ - r:] = 0           # r padding positions at the end of row r
                batch["labels"][r, : r // 2] = -100
            batch["labels"] = batch["labels"].masked_fill(mask == 0, -100)
            batch["attention_mask"] = mask
        out.append(batch)
    return out


# ---- plans ------------------------------------------------------------------------------------
def placements(model: nn.Module, sp: bool) -> dict[str, str]:
    """Megatron's layout derived from the model's traced operator graph (autoparallel.placements):
    what the planner hands the trainer, no per-family name table."""
    config = getattr(model, "config", None)
    key = (type(model).__name__, model_fingerprint(model), config.to_json_string() if config is not None else "")
    return _traced_placements(model, key, sp)


# A spawned rank runs ~50 configurations over a dozen architectures, and the graph is a function of the
# architecture alone (class, parameter names and shapes, config): each rank traces each architecture once,
# without the compiled blocks' partition (placements read only the graph's structure; the partition is most
# of a tiny model's trace time).
_GRAPHS: dict[tuple[str, str, str], Any] = {}


def _traced_placements(model: nn.Module, key: tuple[str, str, str], sp: bool) -> dict[str, str]:
    if key not in _GRAPHS:
        _GRAPHS[key] = trace(model, batch=1, seq_len=SEQ, compiled_saved=False)
    return megatron_placements(_GRAPHS[key], sequence_parallel=sp)


def _placements(model: nn.Module, sp: bool, replicate_all: bool) -> dict[str, str]:
    out = placements(model, sp)
    if not replicate_all:
        return out
    return {p: ("replicate" if v in ("colwise", "rowwise", "vocab") else v) for p, v in out.items()}


def make_plan(model: nn.Module, *, dp: int = 1, tp: int = 1, pp: int = 1, ep: int = 1, vpp: int = 1,
              micro_batch: int = 1, zero: int = 0, sp: bool = False, recompute: str = "none", replicate_all: bool = False,
              overrides: dict[str, str] | None = None, param_dtype: str = "fp32") -> Plan:
    """replicate_all: no module split over tp, norms still 'sequence' under SP (what the planner emits
    at tiny widths under a pinned tp). overrides: placements replacing the derived ones. param_dtype: what
    FSDP2 computes in (bf16: low-precision copies of the fp32 parameters)."""
    n = len(find_layout(model).blocks)
    return Plan(model=type(model).__name__, hardware="cpu", gpus=dp * tp * pp * ep, gpus_per_node=8,
                global_batch=ROWS, seq_len=SEQ, dp=dp, tp=tp, pp=pp, ep=ep, micro_batch=micro_batch, zero=zero,
                sequence_parallel=sp, recompute=(recompute,) * n, vpp=vpp,
                stage_layers=(n // (pp * vpp),) * (pp * vpp) if pp > 1 else (), grad_reduce_dtype="fp32",
                param_dtype=param_dtype,
                placements={**_placements(model, sp, replicate_all), **(overrides or {})} if tp > 1 or ep > 1 else {},
                model_fingerprint=model_fingerprint(model))


# ---- reference --------------------------------------------------------------------------------
def reference(name: str, masked: bool = False, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A plain single-process loop with HF's own loss: model(input_ids=..., labels=...).loss."""
    return H.adamw_loop(build(name), batches(steps, masked), lambda model, b: model(**b).loss)


def sgd_losses(model: nn.Module, token_batches: list[torch.Tensor], lr: float = 0.1) -> list[float]:
    """The model's own loop on token batches (labels = inputs, no cache), plain SGD(lr): its loss at each step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for b in token_batches:
        loss = model(input_ids=b, labels=b, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


TP2 = {"tp": 2, "dp": 1, "micro_batch": 4}


def sgd_trainer_losses(model: nn.Module, token_batches: list[torch.Tensor], fix: dict[str, Any] = TP2,
                       lr: float = 0.1) -> tuple[list[float], Any]:
    """AutoParallelTrainer on the model as passed, fp32, planned for an H100 with `fix` pinned (4 rows of 16 tokens
    a step), plain SGD(lr): its loss at each step on token batches (labels = inputs), and the trainer; what
    sgd_losses computes with the model's own loop."""
    from autoparallel.trainer import AutoParallelTrainer
    trainer = AutoParallelTrainer(model, optimizer=lambda ps: torch.optim.SGD(ps, lr=lr), global_batch_size=4,
                                  seq_len=16, fix=fix, mixed_precision="fp32", hardware="h100-sxm")
    return [trainer.step({"input_ids": b, "labels": b}) for b in token_batches], trainer


# ---- multi-process runner ---------------------------------------------------------------------
@dataclass
class Config:
    """One trainer run in the spawned group. resume: {"stop": k, "plan": {...}} saves a checkpoint
    before step k and continues in a fresh model (another seed) and trainer under that plan; "save":
    j additionally checkpoints that trainer before step j (for a third leg elsewhere). export: write a
    save_pretrained checkpoint at the end."""

    name: str
    model: str
    plan: dict[str, Any]
    masked: bool = False
    steps: int = STEPS
    resume: dict[str, Any] = field(default_factory=dict)
    export: bool = False
    meta: bool = False


def _trainer(name: str, plan: dict[str, Any], seed: int = 0, meta: bool = False):
    from autoparallel.trainer import AutoParallelTrainer

    model = build(name, seed, meta)
    return AutoParallelTrainer(model, torch.optim.AdamW(model.parameters(), lr=H.LR, eps=H.EPS),
                               plan=make_plan(model, **plan))


def train(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    if cfg.meta:
        torch.manual_seed(100 + rank)  # the ranks' RNGs differ: replicas must still come out equal
    trainer = _trainer(cfg.model, cfg.plan, meta=cfg.meta)
    losses = []
    for i, b in enumerate(batches(cfg.steps, cfg.masked)):
        if i == cfg.resume.get("stop"):
            trainer.save_checkpoint(out / f"{cfg.name}.ckpt")
            trainer = _trainer(cfg.model, cfg.resume["plan"], seed=99)
            trainer.load_checkpoint(out / f"{cfg.name}.ckpt")
            assert trainer.steps == i, (trainer.steps, i)
        if i == cfg.resume.get("save"):
            trainer.save_checkpoint(out / f"{cfg.name}.ckpt2")
        losses.append(trainer.step(b))
    torch.save(trainer.full_state_dict(), out / f"{cfg.name}.rank{rank}.pt")
    if cfg.export:
        trainer.save_pretrained(out / f"{cfg.name}.hf")
    return {"losses": losses}
