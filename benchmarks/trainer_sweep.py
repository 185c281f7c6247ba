"""AutoParallelTrainer itself against the cost model's prediction of the exact plan it runs (issue 12).

Three steps, so that the GPUs only measure and every prediction is recomputed on any machine:

    python benchmarks/trainer_sweep.py plans                    # CPU: plan every configuration -> plan files
    python3 benchmarks/trainer_sweep.py measure --gpus 1 --out $OUT/single.jsonl          # one GPU
    torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out $OUT/dist.jsonl
    autoparallel calibrate --trainer --raw $OUT/probes.jsonl                      # the host probes, same machine
    torchrun --nproc-per-node 2 $(which autoparallel) calibrate --trainer --raw $OUT/probes.jsonl
    python benchmarks/trainer_sweep.py fit --raw RAW.jsonl ... --probes probes.jsonl   # CPU: -> fitted profile
    python benchmarks/trainer_sweep.py predict --only A,B --out PRED.json          # CPU: predictions before a run
    python benchmarks/trainer_sweep.py report --raw RAW.jsonl [RAW.jsonl ...]    # CPU: predict, compare
    python benchmarks/trainer_sweep.py losses --raw RAW.jsonl [RAW.jsonl ...]    # CPU: losses vs one GPU
    python benchmarks/trainer_sweep.py noise                    # CPU: rounding noise behind the loss tolerance

`measure --passes N` runs the selection N times over (host-bound steps drift on a lent VM:
docs/trainer_sweep_notes.md); every other command reads each configuration's median over its passes.
`measure --host-probes` times calibrate's speed probes in the measuring process before and after each
configuration (`--interleave-probes`: also one step of each before each timed step), and `report --profile h200
--row-speed [steps]` predicts each row with the host terms rescaled to the host speed those probes saw.
`plans` writes benchmarks/results/trainer_sweep_plans/NAME.yaml with the planner of this checkout and
the `h200` profile (the planner's own pick where a configuration pins nothing, else its best plan
under the pins). `measure` builds each model once per process with the shared initial weights
(init_weights(seed=0), kept on the host; the 7B on the meta device instead, see SHARED_INIT_SEED), hands
it and the plan file to AutoParallelTrainer (which copies out each rank's shards and runs its default
runtime: FSDP2 mixed precision,
fused AdamW on CUDA) and times `trainer.step(batch)` on random tokens: warm-up steps, then timed steps
between device synchronizations; peak memory is torch.cuda.max_memory_allocated over the timed steps
(rank 0) above what was allocated before the configuration was built (earlier configurations of the
same process can leave tensors behind: a compiled trainer's graphs held 5 GiB). `report` predicts each plan with CostModel.estimate and writes
benchmarks/results/trainer_sweep_h200.json (one record per configuration: gpus, predicted{step_time_s,
peak_memory_gib}, measured{...}) and docs/trainer_sweep.md. `losses` compares every two-GPU
configuration's losses per step with the one-GPU run of the same model and global batch and writes
docs/loss_matching.md (tolerance and its derivation there).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from h200_memory_time import MOE_1B  # noqa: E402  (the same models as the earlier H200 benchmarks)
from h200_trainer_throughput import LLAMA_1_3B  # noqa: E402

from autoparallel.calibrate_trainer import (  # noqa: E402
    PROBES,
    REFERENCE_KEY,
    SPEED_PROBES,
    ProbeRecord,
    describe_terms,
    fit_host_speed,
    fit_host_terms,
    load_records,
    reference_times,
    rescaled,
    time_trainer_steps,
)
from cost_models.host import HOST_TERMS  # noqa: E402

PLANS = ROOT / "benchmarks" / "results" / "trainer_sweep_plans"
RESULTS = ROOT / "benchmarks" / "results" / "trainer_sweep_h200.json"
DOC = ROOT / "docs" / "trainer_sweep.md"
NOISE_RESULTS = ROOT / "benchmarks" / "results" / "loss_noise_cpu.json"
LOSS_DOC = ROOT / "docs" / "loss_matching.md"
PROFILE = "h200"
BUDGET = "140GB"

GPT_350M = {"name": "gpt-350m", "model_type": "gpt2", "vocab_size": 50304, "n_positions": 2048, "n_embd": 1024,
            "n_layer": 24, "n_head": 16}
LLAMA_7B = {"name": "llama-7b", "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 4096}
# Llama 3 8B's widths (128k vocabulary, hidden 4096, SwiGLU 14336, GQA 32/8) on 8 of its 32 layers, so that one
# H200 holds its fp32 states: the shapes of torchtitan's published 8B runs (seq 8192, local batch 2)
LLAMA3_8B_8L = {"name": "llama3-8b-8l", "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 8192, "rope_theta": 500000.0}
# other families the fits never saw (2026-12-01): Qwen3 1.7B (qk-norm, head_dim 128 over hidden 2048, tied
# 152k vocabulary), Qwen2.5 1.5B (q/k/v biases, 12/2 heads) and Qwen3-30B-A3B's MoE layers on 4 of its 48 (128
# experts of width 768, 8 routed a token)
QWEN3_1_7B = {"name": "qwen3-1.7b", "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048,
              "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1000000.0}
QWEN2_5_1_5B = {"name": "qwen2.5-1.5b", "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
                "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                "num_key_value_heads": 2, "max_position_embeddings": 32768, "tie_word_embeddings": True,
                "rope_theta": 1000000.0}
QWEN3_MOE_4L = {"name": "qwen3-30b-a3b-4l", "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
                "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 4,
                "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 40960,
                "rope_theta": 1000000.0}
# and three more (2026-12-01, tenth session), each predicted before it ran: Mixtral 8x7B's layers (8 experts of width
# 14336, 2 routed a token; 2 of its 32 layers, seq 4096), Qwen1.5-MoE-A2.7B's (60 experts of width 1408, 4 routed,
# a gated shared expert of width 5632; 4 of its 24 layers) and GPT-2 XL whole (48 layers of width 1600, 25 heads,
# the odd 50257 vocabulary, learned positions, seq 1024)
MIXTRAL_8X7B_2L = {"name": "mixtral-8x7b-2l", "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                   "max_position_embeddings": 32768, "rope_theta": 1000000.0}
QWEN1_5_MOE_4L = {"name": "qwen1.5-moe-a2.7b-4l", "model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048,
                  "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_attention_heads": 16,
                  "num_key_value_heads": 16, "max_position_embeddings": 8192, "rope_theta": 1000000.0}
GPT2_XL = {"name": "gpt2-xl", "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 1600,
           "n_layer": 48, "n_head": 25}
# and three Hugging Face models passed as they are (2026-12-01, twelfth session; "hf": transformers'
# AutoModelForCausalLM.from_config with sdpa attention, not the catalog's implementation), each predicted before
# it ran: Phi-3-mini's layers (fused qkv and gate_up projections, 32 heads of 96; 16 of its 32 layers, seq 4096),
# Gemma 2B (GeGLU of width 16384, one KV head of 256, a tied 256k vocabulary, embeddings scaled by sqrt(h)) and
# Pythia 1.4B (GPT-NeoX: parallel attention and MLP, rotary on a quarter of each head, LayerNorm with biases)
PHI3_MINI_16L = {"name": "phi3-mini-16l", "hf": True, "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
                 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "max_position_embeddings": 4096, "pad_token_id": 32000,
                 "bos_token_id": 1, "eos_token_id": 32000}
GEMMA_2B = {"name": "gemma-2b", "hf": True, "model_type": "gemma", "vocab_size": 256000, "hidden_size": 2048,
            "intermediate_size": 16384, "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1,
            "head_dim": 256, "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh"}
PYTHIA_1_4B = {"name": "pythia-1.4b", "hf": True, "model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 2048,
               "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 16,
               "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True}
# and two more, predicted before they ran with the session's final model: OLMo 2 1B (q/k norms over all heads,
# norms after each sublayer, a 100k vocabulary) and Granite 3.0 2B (embedding, residual, attention and logit
# multipliers; the odd 49155 vocabulary; 40 layers of width 2048)
OLMO2_1B = {"name": "olmo2-1b", "hf": True, "model_type": "olmo2", "vocab_size": 100352, "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
            "max_position_embeddings": 4096, "rope_theta": 500000.0, "pad_token_id": 100277, "bos_token_id": None,
            "eos_token_id": 100257}
GRANITE_3_2B = {"name": "granite-3-2b", "hf": True, "model_type": "granite", "vocab_size": 49155, "hidden_size": 2048,
                "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 4096, "rope_theta": 10000.0, "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 8.0,
                "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
# and two more, predicted before they ran with the thirteenth session's model (fp32 broadcasts a class of their
# own): Llama 3.2 1B as Hugging Face builds it (GQA 32/8, llama3 RoPE scaling, a tied 128k vocabulary, fp32
# RMSNorms) and StableLM 2 1.6B (LayerNorm, q/k/v biases, rotary on a quarter of each head, a 100k vocabulary)
LLAMA3_2_1B = {"name": "llama3.2-1b", "hf": True, "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
               "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
               "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": True,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192},
               "bos_token_id": 128000, "eos_token_id": 128001}
STABLELM_2_1_6B = {"name": "stablelm-2-1.6b", "hf": True, "model_type": "stablelm", "vocab_size": 100352,
                   "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "max_position_embeddings": 4096, "partial_rotary_factor": 0.25,
                   "use_qkv_bias": True, "rope_theta": 10000.0, "bos_token_id": 100257, "eos_token_id": 100257}
# and three more, planned from their configs as transformers builds them (the fourteenth session's CLI path)
# and predicted before they ran: Gemma 3 1B (one KV head of 256, five sliding-window layers to each global one,
# each with its own rotary base, a tied 262k vocabulary; seq 512 = its window), GPT-J 6B's widths (parallel
# attention and MLP, rotary on 64 of 256 dims of each head, biased MLP; 8 of its 28 layers) and DeepSeek-V2-Lite's
# layers (multi-head latent attention: K/V through a rank-512 bottleneck, rotary on a 64-dim split; 64 routed
# experts of width 1408, 6 routed, 2 shared; the first layer dense; 4 of its 27 layers)
GEMMA3_1B = {"name": "gemma3-1b", "hf": True, "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152,
             "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "max_position_embeddings": 32768, "sliding_window": 512, "rope_theta": 1000000.0,
             "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
             "sliding_window_pattern": 6, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
GPTJ_6B_8L = {"name": "gptj-6b-8l", "hf": True, "model_type": "gptj", "vocab_size": 50400, "n_embd": 4096, "n_layer": 8,
              "n_head": 16, "rotary_dim": 64, "n_positions": 2048, "activation_function": "gelu_new",
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": False,
              "bos_token_id": 50256, "eos_token_id": 50256,
              "attn_implementation": "eager"}  # transformers 5.17 (the device's) has no SDPA path for GPT-J
DEEPSEEK_V2_LITE_4L = {"name": "deepseek-v2-lite-4l", "hf": True, "model_type": "deepseek_v2", "vocab_size": 102400,
                       "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                       "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
                       "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
                       "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
                       "qk_rope_head_dim": 64, "v_head_dim": 128, "routed_scaling_factor": 1.0, "topk_method": "greedy",
                       "n_group": 1, "topk_group": 1, "max_position_embeddings": 4096, "rope_theta": 10000.0,
                       "tie_word_embeddings": False, "bos_token_id": 100000, "eos_token_id": 100001}
# and one more, held out from the fp32-GEMM class GPT-J's rows prompted: CodeGen 2B's widths (12 of its 32 layers;
# GPT-J's attention, scores in fp32, with a fused qkv projection cut in four model-parallel groups)
CODEGEN_2B_12L = {"name": "codegen-2b-12l", "hf": True, "model_type": "codegen", "vocab_size": 51200, "n_embd": 2560,
                  "n_layer": 12, "n_head": 32, "rotary_dim": 64, "n_positions": 2048, "n_ctx": 2048,
                  "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                  "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 50256,
                  "attn_implementation": "eager"}
# and Phi-2's widths (16 of 32 layers: parallel attention and MLP, rotary on 40% of each head, biased LayerNorms
# and projections, a 51200 vocabulary), planned from its config like the others
PHI2_16L = {"name": "phi2-16l", "hf": True, "model_type": "phi", "vocab_size": 51200, "hidden_size": 2560,
            "intermediate_size": 10240, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 32,
            "partial_rotary_factor": 0.4, "max_position_embeddings": 2048, "hidden_act": "gelu_new",
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "tie_word_embeddings": False,
            "bos_token_id": 50256, "eos_token_id": 50256}
# sixteenth session, two families never measured before, predicted before the run (FAMILIES8): OPT-1.3B as
# transformers builds it (learned positions counted from the mask, pre-LN, ReLU MLP on flattened tokens) and
# StarCoderBase-1B's widths (GPT-BigCode: multi-query attention, 24 layers, learned positions)
OPT_1_3B = {"name": "opt-1.3b", "hf": True, "model_type": "opt", "vocab_size": 50272, "hidden_size": 2048,
            "num_hidden_layers": 24, "ffn_dim": 8192, "num_attention_heads": 32, "max_position_embeddings": 2048,
            "word_embed_proj_dim": 2048, "do_layer_norm_before": True, "activation_function": "relu",
            "dropout": 0.0, "attention_dropout": 0.0, "layerdrop": 0.0, "enable_bias": True, "pad_token_id": 1,
            "bos_token_id": 2, "eos_token_id": 2}
STARCODERBASE_1B = {"name": "starcoderbase-1b", "hf": True, "model_type": "gpt_bigcode", "vocab_size": 49152,
                    "n_embd": 2048, "n_layer": 24, "n_head": 16, "n_inner": 8192, "n_positions": 8192,
                    "multi_query": True, "activation_function": "gelu_pytorch_tanh", "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0}
# and two more, predicted before the run (FAMILIES9): OLMo 3 7B's widths (8 of its 32 layers: three sliding-window
# layers to each full one, a rotary table per layer type) and SmolLM3 3B (rotary left out of every fourth layer,
# a tied 128k vocabulary), both supported on the HF path this session
OLMO3_7B_8L = {"name": "olmo3-7b-8l", "hf": True, "model_type": "olmo3", "vocab_size": 100278, "hidden_size": 4096,
               "intermediate_size": 11008, "num_hidden_layers": 8, "num_attention_heads": 32,
               "num_key_value_heads": 32, "max_position_embeddings": 65536, "sliding_window": 4096,
               "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 2,
               "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "pad_token_id": 100277, "bos_token_id": None,
               "eos_token_id": 100257}
SMOLLM3_3B = {"name": "smollm3-3b", "hf": True, "model_type": "smollm3", "vocab_size": 128256, "hidden_size": 2048,
              "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
              "max_position_embeddings": 65536, "no_rope_layer_interval": 4, "tie_word_embeddings": True,
              "rms_norm_eps": 1e-6, "pad_token_id": 128004, "bos_token_id": 128000, "eos_token_id": 128012}
# and two more, predicted before the run (FAMILIES10): StarCoder2 3B (GQA 24/2, LayerNorm with biases, a GELU MLP
# without a gate, tied embeddings) and an Arcee model of transformers' AFM-4.5B-style defaults (a ReLU-squared MLP
# without a gate, head_dim 80; 12 of its 32 layers)
STARCODER2_3B = {"name": "starcoder2-3b", "hf": True, "model_type": "starcoder2", "vocab_size": 49152,
                 "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24,
                 "num_key_value_heads": 2, "max_position_embeddings": 16384, "sliding_window": 4096,
                 "hidden_act": "gelu_pytorch_tanh", "use_bias": True, "norm_epsilon": 1e-5, "rope_theta": 999999.4420358813,
                 "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0, "tie_word_embeddings": True,
                 "bos_token_id": 0, "eos_token_id": 0}
ARCEE_12L = {"name": "arcee-afm-12l", "hf": True, "model_type": "arcee", "vocab_size": 32000, "hidden_size": 2560,
             "intermediate_size": 18432, "num_hidden_layers": 12, "num_attention_heads": 32, "num_key_value_heads": 32,
             "head_dim": 80, "hidden_act": "relu2", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
# and three more, predicted before the run (FAMILIES11) with the compiled blocks priced by their fused bytes:
# Falcon 7B's widths (8 of its 32 layers: attention and MLP in parallel off one LayerNorm, multi-query, a GELU
# MLP, 71 heads), Aya Expanse 8B's (Cohere: a LayerNorm without bias written as fp32 pointwise ops, a 256k tied
# vocabulary scaled by logit_scale; 8 of 32 layers) and OLMoE 1B-7B's (64 experts, 8 a token, qk-norm over the
# whole width; 4 of 16 layers)
FALCON_7B_8L = {"name": "falcon-7b-8l", "hf": True, "model_type": "falcon", "vocab_size": 65024, "hidden_size": 4544,
                "ffn_hidden_size": 18176, "num_hidden_layers": 8, "num_attention_heads": 71, "multi_query": True,
                "parallel_attn": True, "new_decoder_architecture": False, "bias": False, "alibi": False,
                "layer_norm_epsilon": 1e-5, "max_position_embeddings": 2048, "hidden_dropout": 0.0,
                "attention_dropout": 0.0, "tie_word_embeddings": True, "bos_token_id": 11, "eos_token_id": 11}
AYA_8B_8L = {"name": "aya-expanse-8b-8l", "hf": True, "model_type": "cohere", "vocab_size": 256000, "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 8,
             "logit_scale": 0.125, "use_qk_norm": False, "layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
             "rope_theta": 10000.0, "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 255001}
OLMOE_4L = {"name": "olmoe-1b-7b-4l", "hf": True, "model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048,
            "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
            "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "output_router_logits": False, "pad_token_id": 1, "bos_token_id": None, "eos_token_id": 50279}
# and three more, predicted before the run (FAMILIES12): Apertus 8B's widths (xIELU activation without a gate, a
# pointwise chain with learned scalars; per-head qk-norm; 8 of 32 layers), Granite 3.0 1B-A400M (32 experts, 8 a
# token, embedding and logits multipliers, an odd 49155 vocabulary) and GLM-4 9B-0414's widths (four norms a
# block, GQA 32/2 with biased q/k/v, half-width rotary; 8 of 40 layers)
APERTUS_8B_8L = {"name": "apertus-8b-8l", "hf": True, "model_type": "apertus", "vocab_size": 131072, "hidden_size": 4096,
                 "intermediate_size": 21504, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "hidden_act": "xielu", "max_position_embeddings": 65536, "rope_theta": 12000000.0, "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": False, "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 68}
GRANITEMOE_1B = {"name": "granitemoe-1b", "hf": True, "model_type": "granitemoe", "vocab_size": 49155, "hidden_size": 1024,
                 "intermediate_size": 512, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 8,
                 "num_local_experts": 32, "num_experts_per_tok": 8, "embedding_multiplier": 12.0, "logits_scaling": 6.0,
                 "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "max_position_embeddings": 4096,
                 "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "output_router_logits": False,
                 "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
GLM4_9B_8L = {"name": "glm4-9b-8l", "hf": True, "model_type": "glm4", "vocab_size": 151552, "hidden_size": 4096,
              "intermediate_size": 13696, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 2,
              "head_dim": 128, "attention_bias": True, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "pad_token_id": 151329, "eos_token_id": 151329, "bos_token_id": None}
# and three more, predicted before the run (FAMILIES13): Gemma 2 2B as Hugging Face recommends training it (eager
# attention: tanh soft-capping of the attention and output logits, local/global layers, four norms a block, a
# 256000 vocabulary), EXAONE 4.0 1.2B (norms after attention and MLP, per-head qk-norm, GQA 32/8) and ERNIE 4.5
# 21B-A3B's widths (one dense layer, then 64 experts, 6 a token, and two shared experts; 4 of 28 layers)
GEMMA2_2B = {"name": "gemma2-2b", "hf": True, "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304,
             "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
             "attn_logit_softcapping": 50.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True,
             "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, "attn_implementation": "eager"}
EXAONE4_1_2B = {"name": "exaone4-1.2b", "hf": True, "model_type": "exaone4", "vocab_size": 102400, "hidden_size": 2048,
                "intermediate_size": 4096, "num_hidden_layers": 30, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 64, "sliding_window": None, "layer_types": ["full_attention"] * 30,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 65536,
                "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 361}
ERNIE45_MOE_4L = {"name": "ernie4.5-21b-a3b-4l", "hf": True, "model_type": "ernie4_5_moe", "vocab_size": 103424,
                  "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 4, "num_attention_heads": 20,
                  "num_key_value_heads": 4, "moe_intermediate_size": 1536, "moe_k": 6, "moe_num_experts": 64,
                  "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 3,
                  "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                  "tie_word_embeddings": True, "output_router_logits": False, "pad_token_id": 0, "bos_token_id": 1,
                  "eos_token_id": 2}
# and three more, predicted before the run with per-op checkpointing's per-tensor host term (FAMILIES14): Helium 1
# 2B (Kyutai; MHA 20/20, a 48000 vocabulary), Phi-3.5-MoE's widths (16 experts, 2 a token, with the sparse mixer's
# router jitter; 2 of 32 layers) and Seed-OSS 36B's widths (GQA 80/8 with biased q/k/v, attention and residual
# dropout 0.1 as its config trains; 4 of 64 layers)
HELIUM_2B = {"name": "helium-2b", "hf": True, "model_type": "helium", "vocab_size": 48000, "hidden_size": 2560,
             "intermediate_size": 7040, "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20,
             "head_dim": 128, "rms_norm_eps": 1e-8, "rope_theta": 100000.0, "max_position_embeddings": 4096,
             "tie_word_embeddings": False, "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2}
PHIMOE_2L = {"name": "phimoe-2l", "hf": True, "model_type": "phimoe", "vocab_size": 32064, "hidden_size": 4096,
             "intermediate_size": 6400, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
             "num_local_experts": 16, "num_experts_per_tok": 2, "router_jitter_noise": 0.01, "rope_theta": 10000.0,
             "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
             "output_router_logits": False, "bos_token_id": 1, "eos_token_id": 2}
SEED_OSS_4L = {"name": "seed-oss-36b-4l", "hf": True, "model_type": "seed_oss", "vocab_size": 155136, "hidden_size": 5120,
               "intermediate_size": 27648, "num_hidden_layers": 4, "num_attention_heads": 80, "num_key_value_heads": 8,
               "head_dim": 128, "attention_bias": True, "attention_out_bias": False, "attention_dropout": 0.1,
               "residual_dropout": 0.1, "rope_theta": 10000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 524288,
               "tie_word_embeddings": False, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
# and three more, predicted before the run after the pipelined FSDP schedule (FAMILIES15): Persimmon 8B's widths
# (squared-ReLU MLP, LayerNorms with biases, q and k LayerNorms, half-rotary heads; 4 of 36 layers), BitNet b1.58
# 2B4T's in bf16 (squared ReLU, a sub-norm inside attention and MLP, GQA 20/5; 12 of 30 layers) and GLM-4.5-Air's
# (128 routed experts, 8 a token, sigmoid router with a bias, a shared expert, a dense first layer; 2 of 46
# layers). JetMoE was the third: its routing reads token counts back (.tolist()), so it traces at module level only
# (a warning; FLOPs up to that point) and its prediction would test nothing
PERSIMMON_4L = {"name": "persimmon-8b-4l", "hf": True, "model_type": "persimmon", "vocab_size": 262144,
                "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 4, "num_attention_heads": 64,
                "hidden_act": "relu2", "qk_layernorm": True, "partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5,
                "rope_theta": 25000.0, "max_position_embeddings": 16384, "tie_word_embeddings": False,
                "bos_token_id": 71013, "eos_token_id": 71013}
BITNET_12L = {"name": "bitnet-2b-12l", "hf": True, "model_type": "bitnet", "vocab_size": 128256, "hidden_size": 2560,
              "intermediate_size": 6912, "num_hidden_layers": 12, "num_attention_heads": 20, "num_key_value_heads": 5,
              "hidden_act": "relu2", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 4096,
              "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001}
GLM45_AIR_2L = {"name": "glm4.5-air-2l", "hf": True, "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096,
                "intermediate_size": 10944, "num_hidden_layers": 2, "num_attention_heads": 96, "num_key_value_heads": 8,
                "head_dim": 128, "partial_rotary_factor": 0.5, "attention_bias": True, "moe_intermediate_size": 1408,
                "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                "norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                "use_qk_norm": False, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                "max_position_embeddings": 131072, "tie_word_embeddings": False, "output_router_logits": False,
                "pad_token_id": 151329, "eos_token_id": 151329}
# and three more, predicted before the run (FAMILIES16): DiffLlama's default widths (differential attention: two
# softmax maps a head, their difference scaled by a learned lambda; 16 layers), nanochat d20 (squared ReLU, q/k
# norms, a soft-capped head; 20 layers of 1280) and Llama 4 Scout's (16 experts, 1 a token, and a shared one;
# chunked attention, 8192-token chunks, longer than these rows' 2048; 2 of 48 layers, 6.5B parameters: 2 rows)
DIFFLLAMA_16L = {"name": "diffllama-16l", "hf": True, "model_type": "diffllama", "vocab_size": 32000, "hidden_size": 2048,
                 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                 "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
NANOCHAT_D20 = {"name": "nanochat-d20", "hf": True, "model_type": "nanochat", "vocab_size": 65536, "hidden_size": 1280,
                "intermediate_size": 5120, "num_hidden_layers": 20, "num_attention_heads": 10, "num_key_value_heads": 10,
                "hidden_act": "relu2", "final_logit_softcapping": 15.0, "max_position_embeddings": 2048,
                "tie_word_embeddings": False}
LLAMA4_SCOUT_2L = {"name": "llama4-scout-2l", "hf": True, "model_type": "llama4_text", "vocab_size": 202048,
                   "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                   "num_hidden_layers": 2, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                   "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                   "attention_chunk_size": 8192, "layer_types": ["chunked_attention"] * 2, "no_rope_layers": [1, 1],
                   "use_qk_norm": True, "rope_theta": 500000.0, "max_position_embeddings": 10485760,
                   "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "output_router_logits": False,
                   "pad_token_id": 200018, "bos_token_id": 200000, "eos_token_id": 200008}
# and three more, predicted before the run (FAMILIES17), each longer than its sliding window (the forward's
# per-layer-type masks, new this session): gpt-oss-20b's widths (attention sinks, so eager attention; 128-token
# windows on every other layer; 32 biased experts, 4 a token; 4 of 24 layers), Gemma 3 1B's at 2048 tokens (its
# 512-token window on 5 of 6 layers; s33 ran it at 512) and Command R7B's (Cohere 2: attention and MLP in
# parallel off one norm, a 4096-token window on 3 of 4 layers, 256k vocabulary; 8 of 32 layers at 8192 tokens)
GPT_OSS_20B_4L = {"name": "gpt-oss-20b-4l", "hf": True, "model_type": "gpt_oss", "vocab_size": 201088,
                  "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 4, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
                  "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2,
                  "attention_bias": True, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                  "tie_word_embeddings": False, "output_router_logits": False, "pad_token_id": 199999,
                  "eos_token_id": 200002, "attn_implementation": "eager"}  # transformers has no SDPA path for sinks
COHERE2_R7B_8L = {"name": "cohere2-r7b-8l", "hf": True, "model_type": "cohere2", "vocab_size": 256000,
                  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "logit_scale": 0.25, "sliding_window": 4096,
                  "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3
                  + ["full_attention"], "layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
                  "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 255001}
# and three more, predicted before the run (FAMILIES18), each beyond its sliding window where the attention runs SDPA
# given a mask (the masked-attention terms fitted from kernel timings this session, s57): Mistral 7B v0.1's widths
# (a 4096-token window on every layer; 8 of 32 layers at 8192 tokens), OLMo 3 7B's at 8192 (s41 ran it at 2048,
# within its window) and Gemma 3 4B's (head dim 256, a 1024-token window on 5 of 6 layers; 8 of 34 at 4096)
MISTRAL_7B_8L = {"name": "mistral-7b-8l", "hf": True, "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
                 "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "sliding_window": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                 "max_position_embeddings": 32768, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
GEMMA3_4B_8L = {"name": "gemma3-4b-8l", "hf": True, "model_type": "gemma3_text", "vocab_size": 262208,
                "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 8, "num_attention_heads": 8,
                "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 1024,
                "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2,
                "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
                "hidden_activation": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
# and three more, predicted before the run (FAMILIES19, twenty-second session): GPT-Neo 1.3B (learned positions,
# biased attention output, alternate layers attending within a local 256-token window: at 2048 tokens beyond it),
# BioGPT (fairseq-style: embeddings scaled by sqrt(h), learned positions offset by 2, GELU MLP; 1024 tokens) and
# InternLM3 8B's widths (two KV heads of 128 for 32 query heads; 8 of its 48 layers at 4096 tokens)
GPT_NEO_1_3B = {"name": "gpt-neo-1.3b", "hf": True, "model_type": "gpt_neo", "vocab_size": 50257, "hidden_size": 2048,
                "num_layers": 24, "num_heads": 16, "attention_types": [[["global", "local"], 12]], "window_size": 256,
                "max_position_embeddings": 2048, "activation_function": "gelu_new", "embed_dropout": 0.0,
                "attention_dropout": 0.0, "resid_dropout": 0.0, "bos_token_id": 50256, "eos_token_id": 50256,
                "attn_implementation": "eager"}  # transformers has no SDPA path for GPT-Neo
BIOGPT = {"name": "biogpt", "hf": True, "model_type": "biogpt", "vocab_size": 42384, "hidden_size": 1024,
          "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096, "hidden_act": "gelu",
          "max_position_embeddings": 1024, "scale_embedding": True, "hidden_dropout_prob": 0.0,
          "attention_probs_dropout_prob": 0.0, "activation_dropout": 0.0, "layerdrop": 0.0, "pad_token_id": 1,
          "bos_token_id": 0, "eos_token_id": 2}
INTERNLM3_8B_8L = {"name": "internlm3-8b-8l", "hf": True, "model_type": "internlm3", "vocab_size": 128512,
                   "hidden_size": 4096, "intermediate_size": 10240, "num_hidden_layers": 8, "num_attention_heads": 32,
                   "num_key_value_heads": 2, "head_dim": 128, "rope_theta": 50000000.0, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 32768, "tie_word_embeddings": False, "bos_token_id": 1,
                   "eos_token_id": 2}
# InternLM3 is newer than the device's transformers (its rows failed to build there, s60): OLMo 7B (April 2024)'s
# widths instead, predicted before their run (FAMILIES19B): LayerNorms without weights, q/k/v clipped to +-8 (8 of
# 32 layers at 4096 tokens)
OLMO_7B_8L = {"name": "olmo-7b-8l", "hf": True, "model_type": "olmo", "vocab_size": 50304, "hidden_size": 4096,
              "intermediate_size": 11008, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 32,
              "clip_qkv": 8.0, "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
              "pad_token_id": 1, "bos_token_id": None, "eos_token_id": 50279}
# and three more, predicted before the run (FAMILIES20, twenty-third session): GPT-NeoX Japanese 2.7B (abeja's:
# 32 layers of 2560, an attention output bias added after the residual branch's projection, GELU MLP of 4h; eager
# attention, as transformers runs it), FlexOlmo 7x7B's widths (7 OLMo 2 experts of 11008, 5 a token: a block of
# mostly expert GEMMs; 4 of 32 layers) and MiniMax-Text's architecture at transformers' default widths (a
# lightning-attention layer, linear attention run block by block in PyTorch ops, and a softmax one; 8 experts of
# 14336, 2 a token; 2 layers)
GPT_NEOX_JA_2_7B = {"name": "gpt-neox-ja-2.7b", "hf": True, "model_type": "gpt_neox_japanese", "vocab_size": 32000,
                    "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
                    "intermediate_multiple_size": 4, "hidden_act": "gelu", "max_position_embeddings": 2048,
                    "attention_dropout": 0.0, "hidden_dropout": 0.0, "tie_word_embeddings": True,
                    "bos_token_id": 31996, "eos_token_id": 31999,
                    "attn_implementation": "eager"}  # transformers has no SDPA path for GPT-NeoX Japanese
FLEX_OLMO_4L = {"name": "flexolmo-4l", "hf": True, "model_type": "flex_olmo", "vocab_size": 100352, "hidden_size": 4096,
                "intermediate_size": 11008, "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 32,
                "num_experts": 7, "num_experts_per_tok": 5, "norm_topk_prob": False, "rms_norm_eps": 1e-6,
                "rope_theta": 500000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
                "output_router_logits": False, "pad_token_id": 100277, "bos_token_id": None, "eos_token_id": 100257}
MINIMAX_2L = {"name": "minimax-2l", "hf": True, "model_type": "minimax", "vocab_size": 32000, "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "num_local_experts": 8, "num_experts_per_tok": 2,
              "layer_types": ["linear_attention", "full_attention"], "block_size": 256, "rms_norm_eps": 1e-5,
              "rope_theta": 1000000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
              "output_router_logits": False, "bos_token_id": 1, "eos_token_id": 2}
# and two more, predicted before the run (FAMILIES21): GraniteMoeShared at Granite 3.0 1B-A400M's widths with a
# 1024-wide shared expert beside the 32 routed ones (8 a token), and Ministral 3 3B's (YaRN rotary with Llama 4's
# position-dependent query scaling; 8 of 26 layers at 4096 tokens)
GRANITEMOE_SHARED_1B = {**GRANITEMOE_1B, "name": "granitemoeshared-1b", "model_type": "granitemoeshared",
                        "shared_intermediate_size": 1024}
MINISTRAL3_3B_8L = {"name": "ministral3-3b-8l", "hf": True, "model_type": "ministral3", "vocab_size": 131072,
                    "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 8, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
                    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
# and three more, predicted before the run (FAMILIES22, twenty-fourth session): VaultGemma at 1B widths (Gemma 2's
# layout: logit soft-capping in attention and head, a 256k vocabulary, 512-token sliding layers alternating with
# global ones at 1024 tokens, eager attention as transformers runs it; 26 layers of 1152) and Doge at
# transformers' default widths (32 layers of 1024: its dynamic mask attention adds a mask learned from the values to
# every head's scores, an SDPA kernel with a float mask)
VAULTGEMMA_1B = {"name": "vaultgemma-1b", "hf": True, "model_type": "vaultgemma", "vocab_size": 256000,
                 "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                 "query_pre_attn_scalar": 256, "sliding_window": 512, "attn_logit_softcapping": 50.0,
                 "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
                 "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
                 "attn_implementation": "eager"}  # transformers has no SDPA path for VaultGemma
DOGE_320M = {"name": "doge-320m", "hf": True, "model_type": "doge", "vocab_size": 32768, "hidden_size": 1024,
             "intermediate_size": 2048, "num_hidden_layers": 32, "num_attention_heads": 8, "num_key_value_heads": 8,
             "hidden_act": "silu", "keep_window_size": 2048, "is_moe": False, "rms_norm_eps": 1e-6,
             "max_position_embeddings": 2048, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
             "pad_token_id": 2}
# and GLM-4 9B's widths (model_type glm: q/k/v biases, two KV heads, rotary on half of each head; 8 of 40 layers
# at 4096 tokens)
GLM_9B_8L = {"name": "glm-9b-8l", "hf": True, "model_type": "glm", "vocab_size": 151552, "hidden_size": 4096,
             "intermediate_size": 13696, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 2,
             "head_dim": 128, "attention_bias": True, "partial_rotary_factor": 0.5, "rms_norm_eps": 1.5625e-07,
             "max_position_embeddings": 131072, "tie_word_embeddings": False, "pad_token_id": 151329,
             "bos_token_id": None, "eos_token_id": 151329}
# and four more, predicted before the run (FAMILIES23, twenty-fifth session): Moonlight 16B-A3B's widths (DeepSeek
# V3's layout: latent attention without a query LoRA, sigmoid routing over 64 experts, two shared; 4 of 27 layers),
# GLM-4.7-Flash's (glm4_moe_lite: latent attention with a query LoRA, 256-wide values; 4 of 47 layers), MiniCPM3
# 4B's (dense latent attention, scaled embeddings and residuals; 8 of 62 layers) and DeepSeek V3.2's first three
# (dense) layers at its own widths: its sparse attention's indexer (no_grad) keeps 2048 of 4096 keys a query
MOONLIGHT_4L = {"name": "moonlight-16b-4l", "hf": True, "model_type": "deepseek_v3", "vocab_size": 163840,
                "hidden_size": 2048, "intermediate_size": 11264, "moe_intermediate_size": 1408, "num_hidden_layers": 4,
                "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
                "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
                "routed_scaling_factor": 2.446, "norm_topk_prob": True, "max_position_embeddings": 8192,
                "rope_theta": 50000.0, "tie_word_embeddings": False, "bos_token_id": 163584, "eos_token_id": 163585}
GLM47_FLASH_4L = {"name": "glm4.7-flash-4l", "hf": True, "model_type": "glm4_moe_lite", "vocab_size": 154880,
                  "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536,
                  "num_hidden_layers": 4, "num_attention_heads": 20, "num_key_value_heads": 20, "n_shared_experts": 1,
                  "n_routed_experts": 64, "num_experts_per_tok": 4, "first_k_dense_replace": 1, "kv_lora_rank": 512,
                  "q_lora_rank": 768, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
                  "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8, "norm_topk_prob": True,
                  "max_position_embeddings": 202752, "tie_word_embeddings": False, "bos_token_id": 0,
                  "eos_token_id": 1}
MINICPM3_4B_8L = {"name": "minicpm3-4b-8l", "hf": True, "model_type": "minicpm3", "vocab_size": 73448,
                  "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 8, "num_attention_heads": 40,
                  "num_key_value_heads": 40, "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64,
                  "qk_rope_head_dim": 32, "v_head_dim": 64, "scale_emb": 12, "scale_depth": 1.4,
                  "dim_model_base": 256, "max_position_embeddings": 32768, "tie_word_embeddings": True,
                  "bos_token_id": 1, "eos_token_id": 2}
DEEPSEEK_V32_3L = {"name": "deepseek-v3.2-3l", "hf": True, "model_type": "deepseek_v32", "vocab_size": 129280,
                   "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                   "num_hidden_layers": 3, "num_attention_heads": 128, "num_key_value_heads": 128,
                   "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                   "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128, "n_group": 8, "topk_group": 4, "index_topk": 2048, "index_head_dim": 128,
                   "index_n_heads": 64, "max_position_embeddings": 163840, "tie_word_embeddings": False,
                   "bos_token_id": 0, "eos_token_id": 1}
# and one more after the Hugging Face path learned Gemma 4's per-forward key/value store (FAMILIES24): Gemma 4's
# text layout at transformers' default widths without per-layer inputs (2304 wide, head dim 256, 512-token sliding
# layers and every sixth global, a 262k vocabulary; 12 of 30 layers at 2048 tokens, beyond the window)
GEMMA4_12L = {"name": "gemma4-12l", "hf": True, "model_type": "gemma4_text", "vocab_size": 262144,
              "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 12, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512, "hidden_size_per_layer_input": 0,
              "num_kv_shared_layers": 0, "max_position_embeddings": 131072, "tie_word_embeddings": True,
              "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
              "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
# and its MoE block (FAMILIES24B): a dense MLP beside 64 routed experts (top 8, 704 wide) in every layer, with keys
# equal to values in the global layers; widths chosen here, not a published model's (6 layers)
GEMMA4_MOE_6L = {**GEMMA4_12L, "name": "gemma4-moe-6l", "num_hidden_layers": 6, "enable_moe_block": True,
                 "num_experts": 64, "top_k_experts": 8, "moe_intermediate_size": 704, "attention_k_eq_v": True,
                 "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
# and one more after the Hugging Face path learned hybrids (FAMILIES25, twenty-sixth session): LFM2's layout at its
# 1.2B widths (2048 wide, 16 layers: gated short-convolution mixers, with grouped-query attention in 6 of them at
# 2, 5, 8, 10, 12, 14; SwiGLU 8192 after LFM2's width adjustment, a 65k vocabulary, tied)
LFM2_1_2B = {"name": "lfm2-1.2b", "hf": True, "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
             "intermediate_size": 12288, "block_ff_dim": 12288, "block_auto_adjust_ff_dim": True,
             "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "num_hidden_layers": 16,
             "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3,
             "layer_types": ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
             "max_position_embeddings": 128000, "tie_word_embeddings": True}
# and two more after hf_coverage could build them (FAMILIES26, twenty-seventh session): LFM2-MoE's layout at
# transformers' default widths (Lfm2MoeConfig: 2048 wide, two dense SwiGLU layers of 7168, then 32 experts of 1792,
# top 4 with an expert bias; 8 of 32 layers, attention in layers 2 and 6, short convolutions elsewhere) and dots1's
# first two layers at Dots1Config's default widths (4608 wide, 32 heads, one dense layer of 10944) with the released
# dots.llm1's routing (128 experts of 1408, top 6, two shared)
LFM2_MOE_8L = {"name": "lfm2-moe-8l", "hf": True, "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048,
               "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 8,
               "num_attention_heads": 32, "num_key_value_heads": 8, "num_dense_layers": 2, "num_experts": 32,
               "num_experts_per_tok": 4, "use_expert_bias": True, "norm_topk_prob": True, "conv_L_cache": 3,
               "layer_types": ["full_attention" if i in (2, 6) else "conv" for i in range(8)],
               "max_position_embeddings": 128000, "tie_word_embeddings": True}
DOTS1_2L = {"name": "dots1-2l", "hf": True, "model_type": "dots1", "vocab_size": 152064, "hidden_size": 4608,
            "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 2, "num_attention_heads": 32,
            "num_key_value_heads": 32, "n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6,
            "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "max_position_embeddings": 8192, "tie_word_embeddings": False}
# four families no fit has seen (FAMILIES27, thirty-second session), predicted before the run: Nemotron-Mini-4B's
# widths (squared-ReLU MLP without a gate, rotary on half of each head, LayerNorm1P; 8 of 32 layers), Hunyuan-7B's
# (qk-norm, 4096 wide, 14336 MLP; 8 of 32 layers), ERNIE 4.5 0.3B whole (Ernie4_5Config's defaults: 18 layers of
# 1024, heads of 128, a tied 103k vocabulary) and Qwen3-Next's layout (gated DeltaNet linear attention in three layers
# of four, gated full attention in the fourth, heads of 256; 4 layers with 64 of its 512 experts of 512, top 10, one
# shared, so that AdamW's state fits one GPU), each as transformers 5.17 builds it (the DeltaNet and its short
# convolution in their torch fallbacks: the device has neither flash-linear-attention nor causal-conv1d).
# JetMoE-8B was a candidate: its router calls expert_size.tolist(), so the meta trace stops at it (a lower bound)
NEMOTRON_MINI_8L = {"name": "nemotron-mini-8l", "hf": True, "model_type": "nemotron", "vocab_size": 256000,
                    "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 8, "num_attention_heads": 24,
                    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "relu2", "partial_rotary_factor": 0.5,
                    "max_position_embeddings": 4096, "norm_eps": 1e-5, "tie_word_embeddings": False,
                    "bos_token_id": 2, "eos_token_id": 3}
ERNIE45_0_3B = {"name": "ernie4.5-0.3b", "hf": True, "model_type": "ernie4_5", "vocab_size": 103424,
                "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16,
                "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 131072,
                "tie_word_embeddings": True}
HUNYUAN_7B_8L = {"name": "hunyuan-7b-8l", "hf": True, "model_type": "hunyuan_v1_dense", "vocab_size": 128256,
                 "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": True}
QWEN3_NEXT_4L = {"name": "qwen3-next-4l", "hf": True, "model_type": "qwen3_next", "vocab_size": 151936,
                 "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 2,
                 "head_dim": 256, "linear_num_value_heads": 32, "linear_num_key_heads": 16,
                 "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                 "full_attention_interval": 4, "num_experts": 64, "num_experts_per_tok": 10,
                 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1,
                 "norm_topk_prob": True, "intermediate_size": 5120, "max_position_embeddings": 32768,
                 "tie_word_embeddings": False}
# and three more after this session's attention and convolution terms (FAMILIES28), predicted before the run:
# StableLM-3B-4E1T's widths (heads of 80, which cuDNN runs in its 128-wide kernels; 16 of 32 layers), Gemma 7B's
# (heads of 256 without a window, the 256-wide kernels' own rate; 8 of 28 layers) and SmolLM2-360M whole (32 thin
# layers of 960: a host-paced model). Bamba-9B's layout was a candidate: its Mamba-2 mixers' torch fallback (no
# mamba_ssm on the device) was predicted at 15 s a step eager, too long for the device time left
STABLELM_3B_16L = {"name": "stablelm-3b-16l", "hf": True, "model_type": "stablelm", "vocab_size": 50304,
                   "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 16, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "max_position_embeddings": 4096,
                   "layer_norm_eps": 1e-5, "use_qkv_bias": False, "tie_word_embeddings": False}
GEMMA_7B_8L = {"name": "gemma-7b-8l", "hf": True, "model_type": "gemma", "vocab_size": 256000, "hidden_size": 3072,
               "intermediate_size": 24576, "num_hidden_layers": 8, "num_attention_heads": 16,
               "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192,
               "hidden_act": "gelu_pytorch_tanh"}
SMOLLM2_360M = {"name": "smollm2-360m", "hf": True, "model_type": "llama", "vocab_size": 49152, "hidden_size": 960,
                "intermediate_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 15,
                "num_key_value_heads": 5, "max_position_embeddings": 8192, "rope_theta": 100000.0,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
# and two after this session's in-process host probes (FAMILIES29), predicted before the run: Phi-4-mini's widths
# (a 200k vocabulary, tied: the logits and their loss dominate the activations; rotary on 3/4 of each head; 8 of 32
# layers) and Mistral-NeMo 12B's (heads of 128 where hidden / heads is 160, so the attention is 4096 wide in a
# 5120-wide model; a 131k vocabulary; 6 of 40 layers)
PHI4_MINI_8L = {"name": "phi4-mini-8l", "hf": True, "model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072,
                "intermediate_size": 8192, "num_hidden_layers": 8, "num_attention_heads": 24,
                "num_key_value_heads": 8, "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True, "pad_token_id": 199999, "bos_token_id": 199999,
                "eos_token_id": 199999}
MISTRAL_NEMO_6L = {"name": "mistral-nemo-6l", "hf": True, "model_type": "mistral", "vocab_size": 131072,
                   "hidden_size": 5120, "intermediate_size": 14336, "num_hidden_layers": 6, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "sliding_window": None,
                   "tie_word_embeddings": False}
# and two more after the thirty-third session's host probes (FAMILIES30), predicted before the run: Arcee's AFMoE
# (Trinity-Mini's config as transformers defaults it: a dense first layer, then 64 experts, top-6, and two shared
# experts a layer; sliding-window layers of 1024 with every fourth global, at 2048 tokens; a 200k vocabulary; 6 of 32
# layers) and Jais 2 8B's widths (a non-gated squared-ReLU MLP 8x the hidden size, biases, LayerNorm, 26 heads of
# 128; 8 of 32 layers)
AFMOE_6L = {"name": "afmoe-6l", "hf": True, "model_type": "afmoe", "vocab_size": 200192, "hidden_size": 2048,
            "intermediate_size": 6144, "moe_intermediate_size": 1408, "num_hidden_layers": 6, "num_dense_layers": 1,
            "num_attention_heads": 16, "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 6,
            "num_shared_experts": 2, "global_attn_every_n_layers": 4, "sliding_window": 1024,
            "max_position_embeddings": 16384, "tie_word_embeddings": False}
JAIS2_8L = {"name": "jais2-8l", "hf": True, "model_type": "jais2", "vocab_size": 150272, "hidden_size": 3328,
            "intermediate_size": 26624, "num_hidden_layers": 8, "num_attention_heads": 26,
            "max_position_embeddings": 8192, "tie_word_embeddings": False}
# and two more after the thirty-fourth session's replay measurement (FAMILIES31), predicted before the run: Laguna
# as transformers defaults it (a dense first layer, then 256 experts of 512, top-8, and a shared expert; 48 query
# heads of 128 over 8 key/value heads in a 2048-wide model, rotary on half of each head; 4 of 40 layers) and Meta's
# CWM 32B's widths (48 heads of 128, 8 key/value heads, a 21504 SwiGLU, three sliding-window layers of 8192 for each
# global one) at 16384 tokens, beyond its window (4 of 64 layers)
LAGUNA_4L = {"name": "laguna-4l", "hf": True, "model_type": "laguna", "vocab_size": 100352, "hidden_size": 2048,
             "intermediate_size": 8192, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
             "num_hidden_layers": 4, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
             "num_experts": 256, "num_experts_per_tok": 8, "max_position_embeddings": 131072,
             "tie_word_embeddings": False}
CWM_4L = {"name": "cwm-4l", "hf": True, "model_type": "cwm", "vocab_size": 128256, "hidden_size": 6144,
          "intermediate_size": 21504, "num_hidden_layers": 4, "num_attention_heads": 48, "num_key_value_heads": 8,
          "head_dim": 128, "sliding_window": 8192, "max_position_embeddings": 131072, "tie_word_embeddings": False}
# and three more after the thirty-fifth session's start (FAMILIES32), predicted before the run, each as transformers
# 5.17 defaults it: Tencent's Youtu-LLM 2B whole (32 dense layers of multi-head latent attention, q rank 1536, kv
# rank 512, tied embeddings), EXAONE MoE's widths at 8192 tokens (a dense first layer, then 64 experts of 1024 with a
# shared one, top-8; three sliding-window layers of 4096 for each global one; 4 of 32 layers) and JetBrains Mellum's
# (64 experts of 896, top-8, 32 query heads over 4 kv heads; 8 of 28 layers)
YOUTU_2B = {"name": "youtu-2b", "hf": True, "model_type": "youtu", "vocab_size": 128256, "hidden_size": 2048,
            "intermediate_size": 6144, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 16,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "qk_nope_head_dim": 128, "max_position_embeddings": 131072, "tie_word_embeddings": True}
EXAONE_MOE_4L = {"name": "exaone-moe-4l", "hf": True, "model_type": "exaone_moe", "vocab_size": 102400,
                 "hidden_size": 4096, "intermediate_size": 16384, "moe_intermediate_size": 1024,
                 "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 32, "num_experts": 64,
                 "num_experts_per_tok": 8, "num_shared_experts": 1, "sliding_window": 4096,
                 "sliding_window_pattern": 4, "max_position_embeddings": 16384, "tie_word_embeddings": False}
MELLUM_8L = {"name": "mellum-8l", "hf": True, "model_type": "mellum", "vocab_size": 98304, "hidden_size": 2304,
             "intermediate_size": 7168, "moe_intermediate_size": 896, "num_hidden_layers": 8,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_local_experts": 64,
             "num_experts_per_tok": 8, "max_position_embeddings": 131072, "tie_word_embeddings": False}
# and two more with the planner's own picks of FAMILIES32 (FAMILIES33), predicted before the run: OpenAI's GPT-1
# whole (12 post-norm layers of 768, dropout 0.1 as configured, 512 positions; eager attention, its only one) and Qwen3.5's text model as
# transformers 5.17 defaults it (three gated-DeltaNet layers for each gated full-attention one, 16 query heads of
# 256 over 4 kv heads; 8 of 32 layers) at 4096 tokens
OPENAI_GPT = {"name": "openai-gpt", "hf": True, "model_type": "openai-gpt", "vocab_size": 40478, "n_positions": 512,
              "n_embd": 768, "n_layer": 12, "n_head": 12, "attn_implementation": "eager"}
QWEN3_5_8L = {"name": "qwen3.5-8l", "hf": True, "model_type": "qwen3_5_text", "vocab_size": 248320,
              "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 32768,
              "tie_word_embeddings": False}
# and more after the thirty-sixth session's start, predicted before the run, at their published widths (FAMILIES34:
# Solar Open and MiniMax-M2; FAMILIES35, once the tracer ran its per-expert loop: DBRX): Databricks' DBRX (16
# experts of 10752 at 6144, top-4, 48 query heads over 8 kv heads, its fused Wqkv; 1 of 40 layers at 4096),
# Upstage's Solar Open (128 experts of 1280 and a shared one at 4096, top-8, 64 query heads
# over 8; 2 of 48 layers at 4096) and MiniMax-M2 (256 experts of 1536 at 3072, top-8, 48 query heads over 8 with
# per-layer q/k norms; 1 of 62 layers at 4096)
DBRX_1L = {"name": "dbrx-1l", "hf": True, "model_type": "dbrx", "vocab_size": 100352, "d_model": 6144,
           "n_heads": 48, "n_layers": 1, "max_seq_len": 32768,
           "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
           "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4},
           "tie_word_embeddings": False}
SOLAR_OPEN_2L = {"name": "solar-open-2l", "hf": True, "model_type": "solar_open", "vocab_size": 196608,
                 "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "head_dim": 128, "moe_intermediate_size": 1280, "n_routed_experts": 128, "n_shared_experts": 1,
                 "num_experts_per_tok": 8, "max_position_embeddings": 131072, "tie_word_embeddings": False}
MINIMAX_M2_1L = {"name": "minimax-m2-1l", "hf": True, "model_type": "minimax_m2", "vocab_size": 200064,
                 "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": 48,
                 "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 256, "num_experts_per_tok": 8,
                 "max_position_embeddings": 196608, "tie_word_embeddings": False}
# and two more once autoparallel's forward ran ALiBi models as passed (FAMILIES36), predicted before the run:
# BigScience's BLOOM-1b7 whole (24 layers of 2048, 16 heads, its 250880-token vocabulary tied, LayerNorm after the
# embedding, ALiBi in eager attention) and MosaicML's MPT-7B's widths (32 heads of 128, no biases, ALiBi; 8 of 32
# layers), both at 2048 tokens
BLOOM_1B7 = {"name": "bloom-1b7", "hf": True, "model_type": "bloom", "vocab_size": 250880, "hidden_size": 2048,
             "n_layer": 24, "n_head": 16, "tie_word_embeddings": True,
             "attn_implementation": "eager"}
MPT_7B_8L = {"name": "mpt-7b-8l", "hf": True, "model_type": "mpt", "vocab_size": 50432, "d_model": 4096,
             "n_heads": 32, "n_layers": 8, "expansion_ratio": 4, "max_seq_len": 2048, "no_bias": True,
             "attn_implementation": "eager"}
MODELS = {m["name"]: m for m in (LLAMA_1_3B, GPT_350M, MOE_1B, LLAMA_7B, LLAMA3_8B_8L, QWEN3_1_7B, QWEN2_5_1_5B,
                                 QWEN3_MOE_4L, MIXTRAL_8X7B_2L, QWEN1_5_MOE_4L, GPT2_XL, PHI3_MINI_16L, GEMMA_2B,
                                 PYTHIA_1_4B, OLMO2_1B, GRANITE_3_2B, LLAMA3_2_1B, STABLELM_2_1_6B, GEMMA3_1B,
                                 GPTJ_6B_8L, DEEPSEEK_V2_LITE_4L, CODEGEN_2B_12L, PHI2_16L, OPT_1_3B, STARCODERBASE_1B, OLMO3_7B_8L,
                                 SMOLLM3_3B, STARCODER2_3B, ARCEE_12L, FALCON_7B_8L, AYA_8B_8L, OLMOE_4L, APERTUS_8B_8L,
                                 GRANITEMOE_1B, GLM4_9B_8L, GEMMA2_2B, EXAONE4_1_2B,
                                 ERNIE45_MOE_4L, HELIUM_2B, PHIMOE_2L, SEED_OSS_4L, PERSIMMON_4L, BITNET_12L,
                                 GLM45_AIR_2L, DIFFLLAMA_16L, NANOCHAT_D20, LLAMA4_SCOUT_2L,
                                 MOONLIGHT_4L, GLM47_FLASH_4L, MINICPM3_4B_8L, DEEPSEEK_V32_3L, GEMMA4_12L, GEMMA4_MOE_6L,
                                 GPT_OSS_20B_4L, COHERE2_R7B_8L, MISTRAL_7B_8L, GEMMA3_4B_8L, GPT_NEO_1_3B, BIOGPT,
                                 INTERNLM3_8B_8L, OLMO_7B_8L, GPT_NEOX_JA_2_7B, FLEX_OLMO_4L, MINIMAX_2L,
                                 GRANITEMOE_SHARED_1B, MINISTRAL3_3B_8L, VAULTGEMMA_1B, DOGE_320M, GLM_9B_8L,
                                 LFM2_1_2B, LFM2_MOE_8L, DOTS1_2L, NEMOTRON_MINI_8L, ERNIE45_0_3B, HUNYUAN_7B_8L,
                                 QWEN3_NEXT_4L, STABLELM_3B_16L, GEMMA_7B_8L, SMOLLM2_360M, PHI4_MINI_8L,
                                 MISTRAL_NEMO_6L, AFMOE_6L, JAIS2_8L, LAGUNA_4L, CWM_4L,
                                 YOUTU_2B, EXAONE_MOE_4L, MELLUM_8L, OPENAI_GPT, QWEN3_5_8L,
                                 DBRX_1L, SOLAR_OPEN_2L, MINIMAX_M2_1L, BLOOM_1B7, MPT_7B_8L)}


@dataclass(frozen=True)
class SweepConfig:
    name: str
    model: str                      # key of MODELS
    gpus: int
    rows: int                       # global batch (sequences per step)
    seq: int = 2048
    # planner pins; the "-auto" configurations pin only compile=1: the planner's own plan, compiled
    fix: dict[str, Any] = field(default_factory=dict)
    profile: bool = False           # also record one profiled step's kernel time per class
    # batches with padding (an attention mask: every other row's last quarter padded, labels -100 there), planned
    # and predicted as padded (api.plan_model(padded=True)): a Hugging Face model's attention runs masked kernels
    padded: bool = False
    # the trainer clips the gradients' global norm (max_grad_norm=1.0), planned and predicted with it
    # (RuntimeVariant.clip_grad_norm)
    clip: bool = False
    # the profile its plan file is planned under (`plans`; the budget, BUDGET, is capped at its usable memory)
    hardware: str = PROFILE

    @property
    def variant(self) -> Any:
        from cost_models.estimate import RuntimeVariant
        return RuntimeVariant(clip_grad_norm=self.clip)

    @property
    def plan_file(self) -> Path:
        return PLANS / f"{self.name}.yaml"


def _c(name: str, model: str, gpus: int, rows: int, **kw: Any) -> SweepConfig:
    return SweepConfig(name, model, gpus, rows, **kw)


def _trio(prefix: str, model: str, rows: int, mb: int, third: tuple[int, str], seq: int = 2048,
          padded: bool = False) -> list[SweepConfig]:
    """A family's three rows, each profiled: eager and compiled at micro-batch `mb`, and `third` = (micro-batch,
    recompute mode) eager, named PREFIX-eager, PREFIX-compiled, PREFIX-mb{m}x{rows/m}-{mode}."""
    tmb, mode = third
    suffix = {"full": "full", "op": "op", "selective": "sel"}[mode]
    return [_c(f"{prefix}-eager", model, 1, rows, seq=seq, fix={"micro_batch": mb, "recompute": "none", "compile": 0},
               profile=True, padded=padded),
            _c(f"{prefix}-compiled", model, 1, rows, seq=seq,
               fix={"micro_batch": mb, "recompute": "none", "compile": 1}, profile=True, padded=padded),
            _c(f"{prefix}-mb{tmb}x{rows // tmb}-{suffix}", model, 1, rows, seq=seq,
               fix={"micro_batch": tmb, "recompute": mode, "compile": 0}, profile=True, padded=padded)]


CONFIGS = [
    # one GPU: micro-batching, every recompute mode, eager and compiled, three model kinds
    _c("1g-llama-auto", "llama-1.3b", 1, 8, fix={"compile": 1}, profile=True),
    _c("1g-llama-eager", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "compile": 0}, profile=True),
    _c("1g-llama-mb4x2", "llama-1.3b", 1, 8, fix={"micro_batch": 4, "compile": 0}),
    _c("1g-llama-selective", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "recompute": "selective", "compile": 0}),
    _c("1g-llama-full", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("1g-llama-mb2x4-full", "llama-1.3b", 1, 8, fix={"micro_batch": 2, "recompute": "full", "compile": 0}),
    _c("1g-llama-op", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "recompute": "op", "compile": 0}),
    _c("1g-llama-b16", "llama-1.3b", 1, 16, fix={"compile": 0}),
    _c("1g-gpt-auto", "gpt-350m", 1, 8, fix={"compile": 1}),
    _c("1g-gpt-eager", "gpt-350m", 1, 8, fix={"micro_batch": 8, "compile": 0}),
    _c("1g-gpt-selective", "gpt-350m", 1, 8, fix={"micro_batch": 8, "recompute": "selective", "compile": 0}),
    _c("1g-moe-eager", "moe-1.2b-8e", 1, 8, fix={"micro_batch": 8, "compile": 0}, profile=True),
    _c("1g-moe-full", "moe-1.2b-8e", 1, 8, fix={"micro_batch": 4, "recompute": "full", "compile": 0}),
    _c("1g-moe-auto", "moe-1.2b-8e", 1, 8, fix={"compile": 1}),
    # two GPUs: dp with ZeRO 0-3, tp2 + SP, pp2 1F1B and interleaved, ep2, eager and compiled
    _c("2g-llama-auto", "llama-1.3b", 2, 16, fix={"compile": 1}, profile=True),
    _c("2g-llama-eager", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "compile": 0}),
    _c("2g-llama-zero0", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 0, "micro_batch": 8, "compile": 0}),
    _c("2g-llama-zero1", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 1, "micro_batch": 4, "compile": 0}),
    _c("2g-llama-zero3", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 3, "micro_batch": 8, "compile": 0}),
    _c("2g-llama-op", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "recompute": "op", "compile": 0}),
    _c("2g-llama-zero2-full", "llama-1.3b", 2, 16,
       fix={"dp": 2, "zero": 2, "micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("2g-llama-tp2sp", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 1, "compile": 0}, profile=True),
    _c("2g-llama-tp2", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 0, "micro_batch": 4, "compile": 0}),
    _c("2g-llama-tp2sp-compiled", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 1, "compile": 1}),
    _c("2g-llama-pp2", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 1, "micro_batch": 2, "compile": 0}),
    _c("2g-llama-pp2-vpp2", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 2, "micro_batch": 2, "compile": 0}),
    _c("2g-gpt-auto", "gpt-350m", 2, 16, fix={"compile": 1}),
    _c("2g-gpt-tp2sp", "gpt-350m", 2, 16, fix={"tp": 2, "sp": 1, "compile": 0}),
    _c("2g-moe-ep2", "moe-1.2b-8e", 2, 16, fix={"ep": 2, "micro_batch": 8, "compile": 0}),
    _c("2g-moe-dp2", "moe-1.2b-8e", 2, 16, fix={"dp": 2, "micro_batch": 8, "compile": 0}),
    # added with the trainer's host terms (2026-11-30, second session): more micro-batches and stages
    _c("1g-llama-mb2x4", "llama-1.3b", 1, 8, fix={"micro_batch": 2, "recompute": "none", "compile": 0}),
    _c("1g-gpt-mb2x4-op", "gpt-350m", 1, 8, fix={"micro_batch": 2, "recompute": "op", "compile": 0}),
    _c("2g-llama-pp2-mb4", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 1, "micro_batch": 4, "compile": 0}),
    _c("2g-llama-zero3-mb2x4-full", "llama-1.3b", 2, 16,
       fix={"dp": 2, "zero": 3, "micro_batch": 2, "recompute": "full", "compile": 0}),
    _c("2g-moe-ep2-mb4x2", "moe-1.2b-8e", 2, 16, fix={"ep": 2, "micro_batch": 4, "compile": 0}),
    _c("2g-gpt-dp2-eager", "gpt-350m", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "compile": 0}),
    # one-GPU references at the two-GPU global batch of 16 rows, eager (docs/loss_matching.md)
    _c("1g-gpt-b16", "gpt-350m", 1, 16, fix={"micro_batch": 16, "compile": 0}),
    _c("1g-moe-b16", "moe-1.2b-8e", 1, 16, fix={"micro_batch": 16, "compile": 0}),
    # one-GPU runs equal to those references in exact arithmetic (other micro-batch splits, recompute,
    # compiled kernels): their spread from the reference is rounding alone, the null the loss tolerance
    # is measured from at scale (docs/loss_matching.md); listed after the references, which stay first
    _c("1g-llama-b16-mb8x2", "llama-1.3b", 1, 16, fix={"micro_batch": 8, "compile": 0}),
    _c("1g-llama-b16-mb4x4", "llama-1.3b", 1, 16, fix={"micro_batch": 4, "compile": 0}),
    _c("1g-llama-b16-full", "llama-1.3b", 1, 16, fix={"micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("1g-llama-b16-compiled", "llama-1.3b", 1, 16, fix={"micro_batch": 8, "compile": 1}),
    _c("1g-gpt-b16-mb8x2", "gpt-350m", 1, 16, fix={"micro_batch": 8, "compile": 0}),
    _c("1g-gpt-b16-compiled", "gpt-350m", 1, 16, fix={"micro_batch": 8, "compile": 1}),
    _c("1g-moe-b16-mb8x2", "moe-1.2b-8e", 1, 16, fix={"micro_batch": 8, "compile": 0}),
    _c("1g-moe-b16-compiled", "moe-1.2b-8e", 1, 16, fix={"micro_batch": 8, "compile": 1}),
    # added with the per-tensor FSDP host term (s6, one GPU only): the GPT, whose blocks hold 16 parameter
    # tensors to the llama's 9, at more micro-batches and recomputed, and the compiled llama micro-batched
    _c("1g-gpt-mb4x2", "gpt-350m", 1, 8, fix={"micro_batch": 4, "compile": 0}),
    _c("1g-gpt-mb4x2-compiled", "gpt-350m", 1, 8, fix={"micro_batch": 4, "compile": 1}),
    # the same plans at 64 tokens a row (timelines only: does FSDP2's host time per unit follow the tokens?)
    _c("1g-gpt-s64-mb4x2", "gpt-350m", 1, 8, seq=64, fix={"micro_batch": 4, "recompute": "none", "compile": 0}),
    _c("1g-llama-s64-mb4x2", "llama-1.3b", 1, 8, seq=64, fix={"micro_batch": 4, "recompute": "none", "compile": 0}),
    _c("1g-gpt-full", "gpt-350m", 1, 8, fix={"micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("1g-llama-mb4x2-compiled", "llama-1.3b", 1, 8, fix={"micro_batch": 4, "compile": 1}),
    # a ~7B llama at seq 4096, 8 rows per step: a scale none of the fits saw
    # zero-bubble pipelines (issue 14)
    _c("2g-llama-pp2-zb", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 1, "micro_batch": 4, "compile": 0,
                                                     "schedule": "zero_bubble"}),
    _c("2g-llama-pp2-vpp2-zb", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 2, "micro_batch": 4, "compile": 0,
                                                          "schedule": "zero_bubble"}),
    # the planner's two-GPU picks under the pooled h200 profile (2026-12-01): the GPT's moved from pp2 vpp6
    # (2g-gpt-auto, as measured before) to dp2 ZeRO-2 compiled; the MoE's (no auto row: pinning compile=1
    # alone makes the planner pick ep2 instead), the same
    _c("2g-gpt-dp2-compiled", "gpt-350m", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "compile": 1}),
    _c("2g-moe-dp2-compiled", "moe-1.2b-8e", 2, 16, fix={"dp": 2, "zero": 2, "micro_batch": 8, "compile": 1}),
    _c("2g-llama7b-eager", "llama-7b", 2, 8, seq=4096, fix={"compile": 0}),
    _c("2g-llama7b-compiled", "llama-7b", 2, 8, seq=4096, fix={"compile": 1}),
    # the 7B's one-GPU loss reference (full recompute: only that fits one H200 with unsharded optimizer
    # state) and its exact-arithmetic equal, the null for the 7B's loss tolerance (docs/loss_matching.md)
    _c("1g-llama7b-b8", "llama-7b", 1, 8, seq=4096, fix={"micro_batch": 1, "recompute": "full", "compile": 0}),
    _c("1g-llama7b-b8-mb2x4", "llama-7b", 1, 8, seq=4096, fix={"micro_batch": 2, "recompute": "full", "compile": 0}),
    _c("1g-llama7b-b8-compiled", "llama-7b", 1, 8, seq=4096,
       fix={"micro_batch": 1, "recompute": "full", "compile": 1}),
    _c("1g-llama7b-b8-mb2x4-compiled", "llama-7b", 1, 8, seq=4096,
       fix={"micro_batch": 2, "recompute": "full", "compile": 1}),
    # Llama 3 8B's widths at seq 8192 and two rows a step, torchtitan's per-op SAC among them (2026-12-01): widths,
    # vocabulary and sequence none of the fits saw, where the published 8B runs on H100 are predicted 57-81% fast
    _c("1g-l3w-op", "llama3-8b-8l", 1, 2, seq=8192, fix={"micro_batch": 2, "recompute": "op", "compile": 0}),
    _c("1g-l3w-op-compiled", "llama3-8b-8l", 1, 2, seq=8192, fix={"micro_batch": 2, "recompute": "op", "compile": 1}),
    _c("1g-l3w-none", "llama3-8b-8l", 1, 2, seq=8192, fix={"micro_batch": 2, "recompute": "none", "compile": 0}),
    _c("1g-l3w-compiled", "llama3-8b-8l", 1, 2, seq=8192, fix={"micro_batch": 2, "recompute": "none", "compile": 1}),
    _c("1g-l3w-full-mb1", "llama3-8b-8l", 1, 2, seq=8192, fix={"micro_batch": 1, "recompute": "full", "compile": 0}),
    _c("1g-qwen3-eager", "qwen3-1.7b", 1, 4, seq=4096, fix={"micro_batch": 4, "recompute": "none", "compile": 0}),
    _c("1g-qwen3-compiled", "qwen3-1.7b", 1, 4, seq=4096, fix={"micro_batch": 4, "recompute": "none", "compile": 1}),
    _c("1g-qwen3-mb2x2-op", "qwen3-1.7b", 1, 4, seq=4096, fix={"micro_batch": 2, "recompute": "op", "compile": 0}),
    _c("1g-qwen25-eager", "qwen2.5-1.5b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-qwen25-compiled", "qwen2.5-1.5b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-qwen3moe-eager", "qwen3-30b-a3b-4l", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-qwen3moe-compiled", "qwen3-30b-a3b-4l", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-qwen3moe-full", "qwen3-30b-a3b-4l", 1, 8, fix={"micro_batch": 4, "recompute": "full", "compile": 0}),
    _c("1g-mixtral-eager", "mixtral-8x7b-2l", 1, 4, seq=4096, fix={"micro_batch": 4, "recompute": "none", "compile": 0}),
    _c("1g-mixtral-compiled", "mixtral-8x7b-2l", 1, 4, seq=4096,
       fix={"micro_batch": 4, "recompute": "none", "compile": 1}),
    _c("1g-mixtral-mb2x2-op", "mixtral-8x7b-2l", 1, 4, seq=4096, fix={"micro_batch": 2, "recompute": "op", "compile": 0}),
    _c("1g-qwen15moe-eager", "qwen1.5-moe-a2.7b-4l", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-qwen15moe-compiled", "qwen1.5-moe-a2.7b-4l", 1, 8,
       fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-gpt2xl-eager", "gpt2-xl", 1, 16, seq=1024, fix={"micro_batch": 16, "recompute": "none", "compile": 0}),
    _c("1g-gpt2xl-compiled", "gpt2-xl", 1, 16, seq=1024, fix={"micro_batch": 16, "recompute": "none", "compile": 1}),
    _c("1g-gpt2xl-mb8x2-full", "gpt2-xl", 1, 16, seq=1024, fix={"micro_batch": 8, "recompute": "full", "compile": 0}),
    _c("1g-phi3-eager", "phi3-mini-16l", 1, 4, seq=4096, fix={"micro_batch": 4, "recompute": "none", "compile": 0}),
    _c("1g-phi3-compiled", "phi3-mini-16l", 1, 4, seq=4096, fix={"micro_batch": 4, "recompute": "none", "compile": 1}),
    _c("1g-phi3-mb2x2-op", "phi3-mini-16l", 1, 4, seq=4096, fix={"micro_batch": 2, "recompute": "op", "compile": 0}),
    _c("1g-gemma-mb4x2", "gemma-2b", 1, 8, fix={"micro_batch": 4, "recompute": "none", "compile": 0}),
    _c("1g-gemma-mb4x2-compiled", "gemma-2b", 1, 8, fix={"micro_batch": 4, "recompute": "none", "compile": 1}),
    _c("1g-pythia-eager", "pythia-1.4b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-pythia-compiled", "pythia-1.4b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-pythia-mb4x2-full", "pythia-1.4b", 1, 8, fix={"micro_batch": 4, "recompute": "full", "compile": 0}),
    _c("1g-olmo2-eager", "olmo2-1b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-olmo2-compiled", "olmo2-1b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-olmo2-mb4x2-op", "olmo2-1b", 1, 8, fix={"micro_batch": 4, "recompute": "op", "compile": 0}),
    _c("1g-granite-eager", "granite-3-2b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-granite-compiled", "granite-3-2b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-granite-mb4x2-full", "granite-3-2b", 1, 8, fix={"micro_batch": 4, "recompute": "full", "compile": 0}),
    _c("1g-llama32-eager", "llama3.2-1b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-llama32-compiled", "llama3.2-1b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-llama32-mb4x2-sel", "llama3.2-1b", 1, 8, fix={"micro_batch": 4, "recompute": "selective", "compile": 0}),
    _c("1g-stablelm-eager", "stablelm-2-1.6b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}),
    _c("1g-stablelm-compiled", "stablelm-2-1.6b", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 1}),
    _c("1g-stablelm-mb2x4-full", "stablelm-2-1.6b", 1, 8, fix={"micro_batch": 2, "recompute": "full", "compile": 0}),
    # "selective" on Hugging Face blocks (per-op checkpointing in the trainer), predicted after the fix s30 prompted
    _c("1g-stablelm-mb4x2-sel", "stablelm-2-1.6b", 1, 8, fix={"micro_batch": 4, "recompute": "selective", "compile": 0}),
    _c("1g-olmo2-mb4x2-sel", "olmo2-1b", 1, 8, fix={"micro_batch": 4, "recompute": "selective", "compile": 0}),
    _c("1g-pythia-mb4x2-sel", "pythia-1.4b", 1, 8, fix={"micro_batch": 4, "recompute": "selective", "compile": 0}),
    _c("1g-granite-mb8-sel", "granite-3-2b", 1, 8, fix={"micro_batch": 8, "recompute": "selective", "compile": 0}),
    # fourteenth session, predicted before the run (FAMILIES6): models the CLI now plans from their configs
    *_trio("1g-gemma3", "gemma3-1b", 32, 16, (4, "full"), seq=512),
    *_trio("1g-gptj", "gptj-6b-8l", 8, 8, (2, "op")),
    *_trio("1g-dsv2", "deepseek-v2-lite-4l", 8, 4, (2, "full")),
    *_trio("1g-codegen", "codegen-2b-12l", 8, 8, (4, "full")),
    *_trio("1g-phi2", "phi2-16l", 8, 8, (2, "op")),
    # sixteenth session, predicted before the run (FAMILIES8)
    *_trio("1g-opt", "opt-1.3b", 8, 8, (2, "op")),
    *_trio("1g-bigcode", "starcoderbase-1b", 8, 8, (4, "full")),
    *_trio("1g-olmo3", "olmo3-7b-8l", 8, 8, (2, "op")),
    *_trio("1g-smollm3", "smollm3-3b", 8, 4, (2, "full")),
    *(_c(f"1g-smollm3-s64-mb2x4{'-' + mode if mode != 'none' else ''}", "smollm3-3b", 1, 8, seq=64,
         fix={"micro_batch": 2, "recompute": mode, "compile": 0}) for mode in ("none", "full", "op")),
    # seventeenth session, predicted before the run (FAMILIES10)
    *_trio("1g-starcoder2", "starcoder2-3b", 8, 4, (2, "full")),
    *_trio("1g-arcee", "arcee-afm-12l", 8, 8, (2, "op")),
    # eighteenth session, predicted before the run (FAMILIES11)
    *_trio("1g-falcon", "falcon-7b-8l", 8, 4, (2, "op")),
    *_trio("1g-aya", "aya-expanse-8b-8l", 8, 4, (2, "full")),
    *_trio("1g-olmoe", "olmoe-1b-7b-4l", 8, 8, (4, "op")),
    # eighteenth session, predicted before the run (FAMILIES12)
    *_trio("1g-apertus", "apertus-8b-8l", 8, 4, (2, "op")),
    *_trio("1g-granitemoe", "granitemoe-1b", 8, 8, (4, "op")),
    *_trio("1g-glm4", "glm4-9b-8l", 8, 4, (2, "full")),
    *_trio("1g-gemma2", "gemma2-2b", 8, 2, (2, "op")),
    *_trio("1g-exaone4", "exaone4-1.2b", 8, 8, (2, "full")),
    *_trio("1g-ernie45", "ernie4.5-21b-a3b-4l", 8, 4, (2, "op")),
    *_trio("1g-helium", "helium-2b", 8, 4, (2, "op")),
    *_trio("1g-phimoe", "phimoe-2l", 8, 4, (2, "op")),
    *_trio("1g-seedoss", "seed-oss-36b-4l", 8, 2, (2, "op")),
    # twentieth session, predicted before the run (FAMILIES15)
    *_trio("1g-persimmon", "persimmon-8b-4l", 8, 2, (2, "full")),
    *_trio("1g-bitnet", "bitnet-2b-12l", 8, 4, (2, "op")),
    *_trio("1g-glm45air", "glm4.5-air-2l", 8, 4, (2, "op")),
    # twentieth session, predicted before the run (FAMILIES16)
    *_trio("1g-diffllama", "diffllama-16l", 8, 4, (2, "op")),
    *_trio("1g-nanochat", "nanochat-d20", 16, 8, (4, "full")),
    *_trio("1g-llama4", "llama4-scout-2l", 2, 2, (1, "op")),
    # twenty-first session, predicted before the run (FAMILIES17)
    *_trio("1g-gptoss", "gpt-oss-20b-4l", 8, 2, (2, "full")),
    *_trio("1g-gemma3-s2k", "gemma3-1b", 8, 4, (2, "op")),
    *_trio("1g-cohere2", "cohere2-r7b-8l", 4, 1, (2, "full"), seq=8192),
    # twenty-first session, predicted before the run (FAMILIES18)
    *_trio("1g-mistral-s8k", "mistral-7b-8l", 4, 2, (1, "op"), seq=8192),
    *_trio("1g-olmo3-s8k", "olmo3-7b-8l", 4, 2, (1, "full"), seq=8192),
    *_trio("1g-gemma3-4b", "gemma3-4b-8l", 8, 4, (2, "full"), seq=4096),
    *_trio("1g-gptneo", "gpt-neo-1.3b", 8, 4, (2, "op")),
    *_trio("1g-biogpt", "biogpt", 16, 8, (4, "full"), seq=1024),
    *_trio("1g-internlm3", "internlm3-8b-8l", 4, 2, (1, "op"), seq=4096),
    *_trio("1g-olmo7", "olmo-7b-8l", 4, 2, (1, "op"), seq=4096),
    # twenty-third session, predicted before the run (FAMILIES20)
    *_trio("1g-neoxja", "gpt-neox-ja-2.7b", 8, 2, (4, "full")),
    *_trio("1g-flexolmo", "flexolmo-4l", 4, 2, (1, "op")),
    *_trio("1g-minimax", "minimax-2l", 4, 2, (2, "full")),
    *_trio("1g-granitemoesh", "granitemoeshared-1b", 8, 4, (2, "op")),
    *_trio("1g-ministral3", "ministral3-3b-8l", 4, 2, (1, "full"), seq=4096),
    # twenty-fourth session, predicted before the run (FAMILIES22)
    *_trio("1g-vaultgemma", "vaultgemma-1b", 8, 4, (2, "op"), seq=1024),
    *_trio("1g-doge", "doge-320m", 16, 8, (4, "full")),
    *_trio("1g-glm9b", "glm-9b-8l", 4, 2, (1, "op"), seq=4096),
    # twenty-fifth session, predicted before the run (FAMILIES23)
    *_trio("1g-moonlight", "moonlight-16b-4l", 8, 4, (2, "full")),
    *_trio("1g-glm47flash", "glm4.7-flash-4l", 8, 4, (2, "op")),
    *_trio("1g-minicpm3", "minicpm3-4b-8l", 8, 4, (2, "full")),
    *_trio("1g-dsv32", "deepseek-v3.2-3l", 4, 2, (1, "op"), seq=4096),
    *_trio("1g-gemma4", "gemma4-12l", 8, 4, (2, "op")),
    *_trio("1g-gemma4moe", "gemma4-moe-6l", 8, 4, (2, "full")),
    *_trio("1g-lfm2", "lfm2-1.2b", 8, 4, (2, "op")),
    *_trio("1g-lfm2moe", "lfm2-moe-8l", 8, 4, (2, "full")),
    *_trio("1g-dots1", "dots1-2l", 8, 2, (1, "op")),
    *_trio("1g-nemotron", "nemotron-mini-8l", 8, 4, (2, "op")),
    *_trio("1g-ernie45d", "ernie4.5-0.3b", 8, 8, (2, "full")),
    *_trio("1g-hunyuan", "hunyuan-7b-8l", 8, 4, (2, "op")),
    *_trio("1g-qwen3next", "qwen3-next-4l", 8, 4, (2, "full")),
    *_trio("1g-stablelm3b", "stablelm-3b-16l", 8, 4, (2, "op")),
    *_trio("1g-gemma7b", "gemma-7b-8l", 8, 4, (2, "op")),
    *_trio("1g-smollm2", "smollm2-360m", 8, 8, (2, "full")),
    *_trio("1g-phi4mini", "phi4-mini-8l", 8, 4, (2, "op")),
    *_trio("1g-nemo", "mistral-nemo-6l", 8, 4, (2, "full")),
    *_trio("1g-afmoe", "afmoe-6l", 8, 4, (2, "full")),
    *_trio("1g-jais2", "jais2-8l", 8, 4, (2, "op")),
    *_trio("1g-laguna", "laguna-4l", 8, 4, (2, "full")),
    *_trio("1g-cwm", "cwm-4l", 2, 1, (1, "op"), seq=16384),
    *_trio("1g-youtu", "youtu-2b", 8, 4, (2, "op")),
    *_trio("1g-exaonemoe", "exaone-moe-4l", 4, 2, (1, "op"), seq=8192),
    *_trio("1g-mellum", "mellum-8l", 8, 4, (2, "full")),
    *_trio("1g-gpt1", "openai-gpt", 32, 16, (8, "full"), seq=512),
    *_trio("1g-qwen35", "qwen3.5-8l", 4, 2, (1, "op"), seq=4096),
    # the planner's own picks (compile pinned on, the rest its choice) of FAMILIES32 and FAMILIES33
    _c("1g-youtu-auto", "youtu-2b", 1, 8, fix={"compile": 1}), _c("1g-exaonemoe-auto", "exaone-moe-4l", 1, 4, seq=8192, fix={"compile": 1}),
    _c("1g-mellum-auto", "mellum-8l", 1, 8, fix={"compile": 1}), _c("1g-gpt1-auto", "openai-gpt", 1, 32, seq=512, fix={"compile": 1}),
    _c("1g-qwen35-auto", "qwen3.5-8l", 1, 4, seq=4096, fix={"compile": 1}),
    # thirty-sixth session, predicted before the run (FAMILIES34)
    *_trio("1g-dbrx", "dbrx-1l", 4, 2, (1, "op"), seq=4096),
    *_trio("1g-solaropen", "solar-open-2l", 4, 2, (1, "full"), seq=4096),
    *_trio("1g-minimaxm2", "minimax-m2-1l", 4, 2, (1, "op"), seq=4096),
    _c("1g-solaropen-auto", "solar-open-2l", 1, 4, seq=4096, fix={"compile": 1}),
    _c("1g-minimaxm2-auto", "minimax-m2-1l", 1, 4, seq=4096, fix={"compile": 1}),
    # and DBRX once the tracer ran its per-expert loop (FAMILIES35)
    _c("1g-dbrx-auto", "dbrx-1l", 1, 4, seq=4096, fix={"compile": 1}),
    # and BLOOM and MPT once they ran as passed (FAMILIES36)
    *_trio("1g-bloom", "bloom-1b7", 8, 4, (2, "full")),
    *_trio("1g-mpt", "mpt-7b-8l", 8, 4, (2, "op")),
    _c("1g-bloom-auto", "bloom-1b7", 1, 8, fix={"compile": 1}), _c("1g-mpt-auto", "mpt-7b-8l", 1, 8, fix={"compile": 1}),
    # twenty-first session, predicted before the run (PADDED): batches with padding, planned as padded (every
    # attention a masked kernel), three families whose unpadded rows ran earlier
    *_trio("1g-apertus-padded", "apertus-8b-8l", 4, 2, (1, "op"), seq=8192, padded=True),
    *_trio("1g-smollm3-padded", "smollm3-3b", 4, 2, (1, "full"), seq=4096, padded=True),
    *_trio("1g-llama32-padded", "llama3.2-1b", 8, 4, (2, "op"), seq=4096, padded=True),
    # thirty-eighth session, predicted before the run (CLIP38): the trainer's gradient clipping (max_grad_norm=1.0)
    # beside the same plans without it, profiled (the norm's and the scaling's kernels against the 12 B per
    # gradient entry priced at the fused AdamW's fraction); one micro-batch, ZeRO-0 on one GPU, as update-rates reads
    _c("1g-llama-eager-clip", "llama-1.3b", 1, 8, fix={"micro_batch": 8, "compile": 0}, profile=True, clip=True),
    _c("1g-llama-auto-clip", "llama-1.3b", 1, 8, fix={"compile": 1}, profile=True, clip=True),
    _c("1g-gpt-eager-clip", "gpt-350m", 1, 8, fix={"micro_batch": 8, "compile": 0}, profile=True, clip=True),
    _c("1g-moe-eager-clip", "moe-1.2b-8e", 1, 8, fix={"micro_batch": 8, "recompute": "none", "compile": 0}, profile=True,
       clip=True),
    _c("2g-llama-zero3-clip", "llama-1.3b", 2, 16, fix={"dp": 2, "zero": 3, "micro_batch": 8, "compile": 0},
       clip=True),
    _c("2g-llama-tp2sp-clip", "llama-1.3b", 2, 16, fix={"tp": 2, "sp": 1, "compile": 0}, profile=True, clip=True),
    _c("2g-llama-pp2-clip", "llama-1.3b", 2, 16, fix={"pp": 2, "vpp": 1, "micro_batch": 2, "compile": 0}, clip=True),
    _c("2g-moe-ep2-clip", "moe-1.2b-8e", 2, 16, fix={"ep": 2, "micro_batch": 8, "compile": 0}, clip=True),
    _c("2g-llama-auto-clip", "llama-1.3b", 2, 16, fix={"compile": 1}, clip=True),
    # the planner's two-GPU pick of the catalog MoE once it searched compiled plans on their own (_solve_both):
    # ep2 compiled, where the eager-then-compile post-pass picked dp2 compiled (2g-moe-dp2-compiled)
    _c("2g-moe-ep2-compiled", "moe-1.2b-8e", 2, 16, fix={"ep": 2, "micro_batch": 8, "zero": 0, "compile": 1}),
    # the planner's own picks on an H100 (nothing pinned, h100-sxm: its 80 GB), at the batches whose picks no
    # sweep had run (16 rows, one micro-batch of 16 compiled; Llama 3 8B's widths at 8192 tokens)
    *(_c(f"1g-{short}-b16-h100auto", model, 1, 16, hardware="h100-sxm")
      for short, model in (("llama", "llama-1.3b"), ("gpt", "gpt-350m"), ("moe", "moe-1.2b-8e"))),
    _c("1g-l3w-h100auto", "llama3-8b-8l", 1, 2, seq=8192, hardware="h100-sxm"),
]


def _meta_model(cfg: SweepConfig):
    return _meta(cfg.model)


def _meta(model: str):
    """MODELS[model] built on the meta device."""
    import torch
    with torch.device("meta"):
        return _build(model)


@functools.cache
def _parameters(model: str) -> tuple[int, int]:
    """MODELS[model]'s parameter count and parameter tensors (tied ones once, as parameters() yields them)."""
    params = list(_meta(model).parameters())
    return sum(p.numel() for p in params), len(params)


def _build(model: str) -> Any:
    """MODELS[model] on the current default device (`build_spec`)."""
    return build_spec(MODELS[model])


def build_spec(spec: dict[str, Any]) -> Any:
    """A MODELS entry on the current default device: the catalog's implementation, or for an "hf" entry the
    Hugging Face model a user builds from that config (sdpa attention unless the entry names another,
    transformers' own initialization)."""
    from autoparallel.models import build_model, load_model_spec
    if not spec.get("hf"):
        return build_model(load_model_spec(spec))
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(**{k: v for k, v in spec.items() if k not in ("name", "hf", "attn_implementation")})
    return AutoModelForCausalLM.from_config(config, attn_implementation=spec.get("attn_implementation", "sdpa"))


# ============================================================================ plans (CPU)
def cmd_plans(args: argparse.Namespace) -> int:
    from autoparallel.api import plan_model
    PLANS.mkdir(parents=True, exist_ok=True)
    for cfg in _selected(args.only):
        model = _meta_model(cfg)
        t = time.perf_counter()
        plan = plan_model(model, hardware=cfg.hardware, gpus=cfg.gpus, gpus_per_node=cfg.gpus, global_batch=cfg.rows,
                          seq_len=cfg.seq, max_memory_per_gpu=BUDGET, fix=cfg.fix or None, padded=cfg.padded,
                          variant=cfg.variant)
        plan.save(cfg.plan_file)
        print(f"{cfg.name:28s} {_describe(plan)}  ({time.perf_counter() - t:.1f} s)", flush=True)
    return 0


def _describe(plan: Any) -> str:
    rec = sorted(set(plan.recompute))
    return (f"dp{plan.dp} tp{plan.tp} pp{plan.pp} vpp{plan.vpp} ep{plan.ep} mb{plan.micro_batch}x"
            f"{plan.num_micro_batches} zero{plan.zero}{' sp' if plan.sequence_parallel else ''} "
            f"recompute {'/'.join(rec)}")


def _selected(only: str | None, skip: str | None = None) -> list[SweepConfig]:
    names = set(only.split(",")) if only else {c.name for c in CONFIGS}
    names -= set(skip.split(",")) if skip else set()
    return [c for c in CONFIGS if c.name in names]


# ============================================================================ measure (GPU)
def _kernel_class(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "adam" in n:
        return "optimizer"
    if "nccl" in n:
        return "comm"
    if any(k in n for k in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "sm90_", "sm80_", "cublas")):
        return "gemm"
    if "copy" in n or "cast" in n or "to_copy" in n:
        return "copy"
    if "reduce" in n or "norm" in n or "softmax" in n:
        return "reduce"
    return "elementwise"


def _profiled_step(trainer: Any, batch: Any) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        trainer.step(batch)
        torch.cuda.synchronize()
    averages = prof.key_averages()  # aggregating the events is the slow part: once
    kernels: dict[str, float] = {}
    for e in averages:
        if e.device_type is not None and str(e.device_type).endswith("CUDA"):
            t = getattr(e, "self_device_time_total", 0.0) * 1e-6
            if t > 0:
                kernels[e.key[:120]] = kernels.get(e.key[:120], 0.0) + t
    classes: dict[str, float] = {}
    for name, t in kernels.items():
        classes[_kernel_class(name)] = classes.get(_kernel_class(name), 0.0) + t
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
    # device time of the kernels each aten op launched itself (self), its call count and host time: the
    # per-op comparison with the cost model's per-op times
    ops = {e.key: [e.count, getattr(e, "self_device_time_total", 0.0) * 1e-6, e.self_cpu_time_total * 1e-6]
           for e in averages if e.key.startswith(("aten::", "c10d::", "_c10d", "FSDP", "fsdp"))}
    return {"classes_s": classes, "kernel_s": sum(kernels.values()), "top_kernels_s": dict(top), "ops": ops}


# Every plan of a model starts from the same weights, so that their losses compare (docs/loss_matching.md):
# the catalog init (init_weights) with each parameter drawn from its own generator seeded by (seed, its
# name), built once per model and process, then handed to the trainer as a materialized model, which
# copies each rank's slice out of it (rank 0's values broadcast). The weights live on the host during the
# timed steps: no device memory. The 7B too (since the fourth session): its one-GPU reference fits one
# H200 with full recompute (fp32 master weights and Adam state take 108 GiB; 1g-llama7b-b8), and its host
# copy (27 GiB per rank, plus the trainer's broadcast copy) fits the lent machines' 256 GB. Its records
# measured before that ran the trainer's own meta-device init under a seed drawn per run ("per-run").
SHARED_INIT_SEED = 0
PER_RUN_INIT: set[str] = set()


def init_label(model: str) -> str:
    """What a record's "init" says: "seed0" for the shared init, "per-run" for a seed drawn per run."""
    return "per-run" if model in PER_RUN_INIT else f"seed{SHARED_INIT_SEED}"


def _shared_init_model(model: str, cache: dict[str, Any]) -> Any:
    """`model` with the shared initial weights, on the host. Drawn on the GPU when there is one (the
    1.3B's init_weights took 18 s on two host cores, 2026-11-30; every measurement draws on the GPU, so
    all plans see the same numbers), then moved to the host before the configuration's memory baseline
    is taken (the device copy is freed by the empty_cache before it)."""
    import torch
    if model not in cache:
        # this process's own GPU (LOCAL_RANK: before the trainer sets the device, "cuda" is GPU 0, where
        # every rank would then create a context)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else "cpu"
        if MODELS[model].get("hf"):  # transformers initializes it as it builds it, from the global generator
            torch.manual_seed(SHARED_INIT_SEED)
            with torch.device(device):
                m = _build(model)
        else:
            m = _meta(model)
            m.to_empty(device=device)
            with torch.no_grad():
                m.init_weights(seed=SHARED_INIT_SEED)
        cache[model] = m.to("cpu")
        del m
    return cache[model]


def sweep_trainer(cfg: SweepConfig, shared: dict[str, Any]) -> tuple[Any, list[Any], int]:
    """AutoParallelTrainer on `cfg`'s plan file (compiled as planned) with the shared initial weights, four
    random batches, and the bytes an earlier configuration left allocated (peaks are taken above them)."""
    import torch

    from autoparallel import AutoParallelTrainer
    source = None if cfg.model in PER_RUN_INIT else _shared_init_model(cfg.model, shared)
    gc.collect()  # the previous configuration's trainer (and compiled graphs holding its tensors)
    torch._dynamo.reset()  # each compiled configuration compiles afresh, within the recompile limit
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    trainer = AutoParallelTrainer(_meta_model(cfg) if source is None else source, optimizer=None, plan=cfg.plan_file,
                                  max_grad_norm=1.0 if cfg.clip else None)
    # the source's broadcast buckets (2 x 256 MiB on the device) are freed: not kept reserved
    torch.cuda.empty_cache()
    gen = torch.Generator().manual_seed(0)
    vocab = MODELS[cfg.model]["vocab_size"]
    tokens = [torch.randint(0, vocab, (cfg.rows, cfg.seq + 1), generator=gen) for _ in range(4)]
    return trainer, [_padded(t[:, :-1]) for t in tokens] if cfg.padded else tokens, base


def _padded(ids: Any) -> dict[str, Any]:
    """A Hugging Face batch (labels aligned with the inputs) whose odd rows end in a quarter of padding."""
    mask = ids.new_ones(ids.shape)
    mask[1::2, -ids.shape[1] // 4:] = 0
    return {"input_ids": ids, "labels": ids.masked_fill(mask == 0, -100), "attention_mask": mask}


def host_tick(repeats: int = 3) -> dict[str, float]:
    """The host's speed now, in about 0.3 s: microseconds per eager op (a tiny CUDA tensor's in-place add,
    queued without a sync: the GPU keeps up, so the loop is the host's dispatch), per tiny Linear forward and
    backward (autograd's engine, as a host-paced trainer step runs it), and per pure-Python loop iteration;
    each the median of `repeats`. A host-paced step moved 20-90% between three measurements of one VM within
    seven minutes (s73), with its steps' own spread 3-5%: the host's speed drifts over minutes, and the
    `--host-ticks` records say how far it had drifted around each configuration."""
    import torch

    def timed(fn: Any, n: int) -> float:
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn(n)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) / n * 1e6)
        return statistics.median(times)

    x = torch.zeros(16, device="cuda")
    lin = torch.nn.Linear(16, 16, device="cuda")
    inp = torch.randn(4, 16, device="cuda")

    def ops(n: int) -> None:
        for _ in range(n):
            x.add_(1.0)

    def autograd(n: int) -> None:
        for _ in range(n):
            lin(inp).sum().backward()

    def python(n: int) -> None:
        total = 0
        for i in range(n):
            total += i % 7

    ops(200), autograd(20)  # warm: the first calls pay for lazy initialization
    return {"op_us": timed(ops, 3000), "autograd_us": timed(autograd, 300), "python_us": timed(python, 300_000)}


def cpu_stats() -> dict[str, list[int]]:
    """/proc/stat's cpu lines by name ("cpu": the aggregate, "cpu0", ...: each CPU), each (user nice system idle
    iowait irq softirq steal ...) in ticks; empty where there is no /proc/stat."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    return {name: [int(v) for v in vals] for name, *vals in (line.split() for line in lines if line.startswith("cpu"))}


def _cpu_stat() -> list[int]:
    """The aggregate cpu line of /proc/stat (cpu_stats)."""
    return cpu_stats().get("cpu", [])


def cmd_host_tick(args: argparse.Namespace) -> int:
    with Path(args.out).open("a") as f:
        f.write(json.dumps({"label": args.label, "host_tick": host_tick(), "time": time.time()}) + "\n")
    return 0


class HostProbes:
    """`calibrate --trainer --rescale`'s speed probes (SPEED_PROBES: tiny host-bound trainer steps), built once in
    the measuring process and timed again around each configuration (`measure --host-probes`). The host's speed
    drifts over minutes on a lent VM (s73-s75: bimodal, switching between configurations and within one; s99's
    factor 0.679 before its sweep, 0.548 after): probes around a row say how fast the host was while it ran,
    which a factor taken before the sweep cannot. `report --row-speed` rescales the base profile per row by them."""

    def __init__(self, warmup: int = 1, steps: int = 5) -> None:
        from autoparallel.calibrate_trainer import probe_plan, probe_trainer
        self.warmup, self.steps = warmup, steps
        self.runs = {p.name: probe_trainer(p, probe_plan(p, PROFILE)) for p in PROBES if p.name in SPEED_PROBES}
        self.time()  # warm: each probe's first steps pay for lazy initialization

    def time(self) -> dict[str, float]:
        """probe -> its median step time now, in ms (time_trainer_steps, as calibrate times them)."""
        return {name: time_trainer_steps(trainer, batches, self.warmup, self.steps).step_time_s * 1e3
                for name, (trainer, batches) in self.runs.items()}

    def once(self) -> dict[str, float]:
        """probe -> one step's time now, in ms, between device synchronizations; unlike `time`, it leaves the
        device's peak-memory statistics alone, so it can run between a configuration's timed steps."""
        import torch
        out = {}
        for name, (trainer, batches) in self.runs.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            trainer.step(batches[0])
            torch.cuda.synchronize()
            out[name] = (time.perf_counter() - t) * 1e3
        return out


def _append_probes(into: list[dict[str, float]], probes: HostProbes) -> None:
    into.append(probes.once())


def row_speed(rec: dict, base: Any, sides: Sequence[str] = ("before", "after")) -> float | None:
    """The host factor against `base` while a measured record ran: fit_host_speed over its `host_probes_ms`
    (each probe's geometric mean over the times at `sides` -- "before" and "after" the configuration, or
    "steps": interleaved with its timed steps -- and over its passes); None without them."""
    probes = rec.get("host_probes_ms") or []
    times: dict[str, list[float]] = {}
    for around in probes:
        for side in sides:
            for name, ms in around.get(side, {}).items():
                times.setdefault(name, []).append(ms)
    if not times:
        return None
    by_name = {p.name: p for p in PROBES}
    records = [ProbeRecord(by_name[n], None, statistics.geometric_mean(v) / 1e3) for n, v in times.items()]
    return fit_host_speed(records, base).factor


def _measure_isolated(args: argparse.Namespace) -> int:
    """`measure --isolate`: each configuration and pass in a fresh interpreter, as a user runs one trainer
    per process (in one process, an earlier configuration's state -- compiled graphs, allocator segments,
    a larger heap for the collector to walk -- can slow a later host-paced step; s39, s71). The record gets
    "isolated": true; the pass index is the parent's."""
    import subprocess
    failed = 0
    for n_pass in range(args.passes):
        for cfg in _selected(args.only, args.skip):
            if cfg.gpus != args.gpus:
                continue
            cmd = [sys.executable, str(Path(__file__).resolve()), "measure", "--gpus", str(args.gpus),
                   "--out", args.out, "--only", cfg.name, "--warmup", str(args.warmup), "--steps", str(args.steps),
                   "--pass-index", str(n_pass)] + (["--host-ticks"] if args.host_ticks else [])
            failed += subprocess.run(cmd, check=False).returncode != 0
    return 1 if failed else 0


def cmd_measure(args: argparse.Namespace) -> int:
    import torch

    if args.isolate:
        return _measure_isolated(args)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out)
    shared: dict[str, Any] = {}
    probes = HostProbes() if args.host_probes else None
    # passes over the whole selection, so that a slow phase of the VM lands on one pass of each
    # configuration rather than on whole configurations (the report takes each one's median, `_measured`)
    for n_pass, cfg in ((k, c) for k in range(args.passes) for c in _selected(args.only, args.skip)):
        if cfg.gpus != args.gpus:
            continue
        rec: dict[str, Any] = {"name": cfg.name, "gpus": cfg.gpus, "init": init_label(cfg.model),
                               "pass": n_pass if args.pass_index is None else args.pass_index}
        if args.pass_index is not None:  # a child of --isolate
            rec["isolated"] = True
        try:
            trainer, batches, base = sweep_trainer(cfg, shared)
            if args.host_ticks:
                rec["host_tick_before"], stat0 = host_tick(), _cpu_stat()
            before = probes.time() if probes else None
            steps_probed: list[dict[str, float]] = []
            between = (functools.partial(_append_probes, steps_probed, probes) if probes and args.interleave_probes
                       else None)
            t0 = time.perf_counter()
            timing = time_trainer_steps(trainer, batches, args.warmup, args.steps, base, between=between)
            rec["wall_s"] = time.perf_counter() - t0
            if probes:  # a list, as `_measured` merges several passes' records into one
                rec["host_probes_ms"] = [{"before": before, "after": probes.time()}]
            if steps_probed:  # each probe's median over the steps: the host while the timed steps ran
                rec["host_probes_ms"][0]["steps"] = {n: statistics.median(p[n] for p in steps_probed)
                                                     for n in steps_probed[0]}
            if args.host_ticks:
                rec["cpu_stat_delta"] = [b - a for a, b in zip(stat0, _cpu_stat())]
                rec["host_tick_after"] = host_tick()
            rec["measured"] = {"step_time_s": timing.step_time_s, "step_times_s": timing.step_times_s,
                               "peak_memory_gib": timing.peak_memory_gib,
                               "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                               "allocated_before_gib": base / 2**30,
                               # the caching allocator's cache flushes (each synchronizes the device) since start
                               "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}
            rec["losses"] = timing.losses
            if (cfg.profile and args.profile) or args.profile_all:
                rec["profile"] = _profiled_step(trainer, batches[0])
            del trainer
        except Exception as ex:  # one configuration's failure must not lose the others
            rec["error"] = repr(ex)[:500]
            rec["traceback"] = traceback.format_exc()[-2000:]
        if rank == 0:
            print(json.dumps({k: v for k, v in rec.items() if k not in ("traceback", "losses")})[:600], flush=True)
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


# ============================================================================ update-rates (CPU)
# The trainer's per-parameter update, read from its own profiled steps (`measure --profile-all`: one-GPU,
# one-micro-batch, ZeRO-0 plans, so one unshard and one reduction of every parameter; compute.fsdp_update_time):
# the fused AdamW kernel's device time (aten::_fused_adamw_) and the device spans of FSDP2's unshard and
# reduction ranges (FSDP::pre_forward*, FSDP::post_backward_reduce*: casts, concatenations, one-rank
# collectives, copy-outs). A span also holds the device's idle time while the host runs FSDP's per-tensor
# work (host_us_per_fsdp_tensor, priced as host time): only models whose mean tensor outlasts that work at
# full bandwidth, mean size >= 0.5 * host_us_per_fsdp_tensor * BW / gather bytes, give the copies' rate.
UPDATE_RATES_DOC = ROOT / "docs" / "trainer_update_rates.md"


def update_rates(records: list[dict], profile: Any) -> tuple[list[dict], dict[str, float]]:
    """Per profiled record: its model's parameters and tensors, and the AdamW and copy time per parameter
    [s]; and the calibration entries they give: memory_fraction.adamw (median over every model) and
    fsdp_copy_fraction (median over the large-tensor models), fractions of the profile's bandwidth."""
    from cost_models.compute import ADAM_BYTES, FSDP_GATHER_BYTES, FSDP_REDUCE_BYTES
    from cost_models.host import HostTerms
    bw = profile.memory_bandwidth
    gather, reduce = sum(FSDP_GATHER_BYTES), sum(FSDP_REDUCE_BYTES)  # one rank: d = 1
    min_tensor = 0.5 * HostTerms.of(profile).fsdp_tensor_s * bw / gather
    rows = []
    for r in records:
        cfg = next(c for c in CONFIGS if c.name == r["name"])
        plan = _plan(cfg.plan_file, cfg.plan_file.stat().st_mtime_ns)
        if cfg.gpus != 1 or plan.num_micro_batches != 1:  # the byte counts below are those of one unshard and reduction
            continue
        ops = r["profile"]["ops"]
        n, tensors = _parameters(cfg.model)
        span = {k: sum(v[1] for name, v in ops.items() if name.startswith(k))
                for k in ("FSDP::pre_forward", "FSDP::post_backward_reduce")}
        rows.append({"name": r["name"], "model": cfg.model, "params": n, "tensors": tensors,
                     "adamw_s": ops["aten::_fused_adamw_"][1] / n, "gather_s": span["FSDP::pre_forward"] / n,
                     "reduce_s": span["FSDP::post_backward_reduce"] / n, "large": n / tensors >= min_tensor})
        rows[-1]["copy_fraction"] = (gather + reduce) / (bw * (rows[-1]["gather_s"] + rows[-1]["reduce_s"]))
    large = [x for x in rows if x["large"]]
    if not large:
        raise SystemExit(f"update-rates: no profiled model has a mean tensor of >= {min_tensor / 1e6:.1f}M parameters")
    fractions = {"adamw": statistics.median(ADAM_BYTES / (bw * x["adamw_s"]) for x in rows),
                 "fsdp_copy_fraction": statistics.median(x["copy_fraction"] for x in large),
                 "min_tensor": min_tensor}
    return rows, fractions


def cmd_update_rates(args: argparse.Namespace) -> int:
    from hardware_profiles import load_profile
    profile = load_profile(args.profile)
    records = [r for path in args.raw for line in Path(path).read_text().splitlines() if line.strip()
               for r in (json.loads(line),) if "profile" in r]
    rows, fr = update_rates(records, profile)
    lines = ["| configuration | parameters | tensors | mean tensor | fused AdamW | unshard | reduction | copies' fraction |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in rows:
        lines.append(f"| {x['name']}{'' if x['large'] else ' (small tensors)'} | {x['params'] / 1e9:.2f}B | "
                     f"{x['tensors']} | {x['params'] / x['tensors'] / 1e6:.1f}M | {x['adamw_s'] * 1e12:.2f} ps | "
                     f"{x['gather_s'] * 1e12:.2f} ps | {x['reduce_s'] * 1e12:.2f} ps | "
                     f"{x['copy_fraction']:.3f} |")
    entries = f"memory_fraction.adamw: {fr['adamw']:.3f}, fsdp_copy_fraction: {fr['fsdp_copy_fraction']:.3f}"
    print("\n".join(lines))
    print(entries)
    raws = " ".join(_rel(r) for r in args.raw)
    UPDATE_RATES_DOC.write_text(
        "# The trainer's update rates, from its own profiled steps\n\n"
        f"Command: `python benchmarks/trainer_sweep.py update-rates --raw {raws}` (CPU; the records' `profile`: one "
        "profiled step each, `measure --profile-all` on a lent H200).\n\n"
        "Per parameter of one-GPU, one-micro-batch steps (one unshard and one reduction of every parameter; records of "
        "other plans are skipped): "
        "the device time of the fused AdamW kernel, and the device spans of FSDP2's unshard (`FSDP::pre_forward*`) and "
        "reduction (`FSDP::post_backward_reduce*`) ranges. The copies' fraction is 28 B a parameter (an unshard's 10 "
        "and a reduction's 18 at d = 1: cost_models/compute.py `FSDP_GATHER_BYTES`, `FSDP_REDUCE_BYTES`) over "
        f"{profile.memory_bandwidth / 1e12:g} TB/s times their time. A span also holds the device's idle time while "
        "the host runs FSDP's per-tensor work (`host_us_per_fsdp_tensor`, which the cost model prices as host time), "
        f"so only the models whose mean tensor holds >= {fr['min_tensor'] / 1e6:.1f}M parameters (that work at full "
        "bandwidth) give the copies' rate; the others are marked.\n\n" + "\n".join(lines) +
        f"\n\nThe calibration entries (medians; AdamW over every model, the copies over the large-tensor ones): "
        f"{entries}. `hardware_profiles/h200.yaml` carries them.\n")
    print(f"wrote {_rel(str(UPDATE_RATES_DOC))}")
    return 0


# ============================================================================ report (CPU)
# The trainer's runtime terms are fitted on these configurations only (`fit`); every other one is held out.
# In this order, each fit using the ones before it: (calibration key, configuration, search range).
# The host terms come first, from the small probes of `autoparallel calibrate --trainer` measured on the
# same machine (none of them is a configuration of the sweep).
# host_us_per_compiled_call: from 1g-gpt-auto only for probe files without a compiled probe (s2, s3)
# (fsdp_copy_fraction was fitted here, from 1g-llama-eager, until the twelfth session: it now comes from the
# trainer's profiled kernels, `update-rates`, as memory_fraction.adamw does.)
FIT = {"compiled_fused_fraction": "1g-llama-auto", "host_us_per_compiled_call": "1g-gpt-auto"}
FIT_RANGE = {"compiled_fused_fraction": (0.05, 1.0), "host_us_per_compiled_call": (0.0, 10000.0)}
# Host terms the probes cannot pin, each anchored on one real-width configuration the trainer ran: the tiny
# probes' two TP steps (with and without SP) leave the per-collective term free to trade against the DTensor
# per-op one, and the 1.3B TP rows of s5 and s18 both came out 25-38% slow under it (docs/trainer_sweep_notes.md)
HOST_ANCHOR = {"host_us_per_tp_collective": ("2g-llama-tp2sp", (0.0, 5000.0))}
SWEEP_FIT_KEY = "sweep_fit_configs"  # in fit's profile: the configurations it fitted from
# what a profile without that entry (the shipped h200's, rescaled or not) took from sweeps: its pooled probes
# include compiled ones, which fit host_us_per_compiled_call (host_transfer.pooled_profile)
SWEEP_FIT_DEFAULT = (*(name for name, _ in HOST_ANCHOR.values()), FIT["compiled_fused_fraction"])
FITTED_PROFILE = ROOT / "benchmarks" / "results" / "h200_trainer_fit.yaml"


# The fits price the same plans of the same models under hundreds of trial profiles: each model's graph (and
# its segment analyses, which read no profile) and each plan file are read once per process.
@functools.cache
def _graph(model: str, seq: int, padded: bool = False) -> tuple[Any, Any]:
    from autoparallel.api import trace_model
    from cost_models.segments import SegmentCache
    graph = trace_model(_meta(model), seq_len=seq, padded=padded)
    return graph, SegmentCache(graph)


@functools.cache
def _plan(path: Path, mtime_ns: int) -> Any:
    from autoparallel.plan import Plan
    return Plan.load(path)


def predict(cfg: SweepConfig, profile: Any = PROFILE, raw: dict | None = None) -> tuple[dict[str, float], Any]:
    """Predicted step time and rank-0 allocated peak (stage 0; without the allocator reserve, which
    torch.cuda.max_memory_allocated does not see) of the configuration's plan; `raw`: the measured
    record, whose `compile` says how it ran when that differs from the plan file (older runs)."""
    import dataclasses

    from autoparallel.api import make_cluster
    from autoparallel.sharding import cost_model
    from autoparallel.units import parse_bytes
    plan = _plan(cfg.plan_file, cfg.plan_file.stat().st_mtime_ns)
    if raw is not None and "compile" in raw:
        plan = dataclasses.replace(plan, compile=bool(raw["compile"]))
    graph, segments = _graph(cfg.model, cfg.seq, cfg.padded)
    cm = cost_model(graph, make_cluster(profile, cfg.gpus, cfg.gpus), segment_cache=segments, variant=cfg.variant)
    est = cm.estimate(plan, cm._budget(parse_bytes(BUDGET)))
    stage0 = est.memory_breakdown_gib[0]
    allocated = sum(v for k, v in stage0.items() if k != "allocator")
    return {"step_time_s": est.step_time_s, "peak_memory_gib": allocated}, est


H200_BF16_PEAK = 989e12


def mfu(cfg: SweepConfig, step_s: float) -> float:
    """(6N + 12 L h s) tokens/s / (GPUs x 989 TFLOP/s): the MFU definition of the two-GPU issue (N the
    parameters a token runs through: of a layer's routed experts the top_k of num_experts; L layers, h hidden
    size, s the sequence length; attention counted without the causal halving, as PaLM does)."""
    m = MODELS[cfg.model]
    # GPT-Neo: num_layers; DBRX: n_layers and d_model
    layers = m.get("num_hidden_layers", m.get("n_layer", m.get("num_layers", m.get("n_layers"))))
    hidden = m.get("hidden_size", m.get("n_embd", m.get("d_model")))
    n, _ = _parameters(cfg.model)
    graph, _ = _graph(cfg.model, cfg.seq)
    for g in graph.expert_groups.values():  # a Hugging Face group's top_k is its config's
        k = g.top_k or m.get("num_experts_per_tok") or m.get("moe_k") or g.num_experts
        n -= g.param_count * (1 - k / g.num_experts)
    if "ffn_config" in m:  # DBRX's experts are stacked 2-D weights, not an expert group: three E*f x h each
        f = m["ffn_config"]
        n -= 3 * f["moe_num_experts"] * f["ffn_hidden_size"] * hidden * layers * (1 - f["moe_top_k"] / f["moe_num_experts"])
    tokens_per_s = cfg.rows * cfg.seq / step_s
    return (6 * n + 12 * layers * hidden * cfg.seq) * tokens_per_s / (cfg.gpus * H200_BF16_PEAK)


def _raw_records(raws: list[str]) -> Any:
    """Every record of `measure`'s JSONL files, in order."""
    for raw in raws:
        for line in Path(raw).read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def _measured(raws: list[str]) -> dict[str, dict]:
    """One record per configuration name: the last one measured, its step time the median over every
    pass that measured the configuration (`measure --passes`; "passes" lists them) and its peak memory the
    largest; a failed pass counts only when no pass measured."""
    out: dict[str, dict] = {}
    runs: dict[str, list[dict]] = {}
    probes: dict[str, list[dict]] = {}  # the host probes around each pass (measure --host-probes)
    for rec in _raw_records(raws):
        if "measured" in rec:
            runs.setdefault(rec["name"], []).append(rec["measured"])
            probes.setdefault(rec["name"], []).extend(rec.get("host_probes_ms", []))
            out[rec["name"]] = rec
        elif rec["name"] not in runs:
            out[rec["name"]] = rec
    for name, ms in runs.items():
        if len(ms) > 1:
            merged = dict(out[name]["measured"], step_time_s=statistics.median(m["step_time_s"] for m in ms),
                          peak_memory_gib=max(m["peak_memory_gib"] for m in ms),
                          passes=[m["step_time_s"] for m in ms])
            out[name] = dict(out[name], measured=merged)
            if probes[name]:
                out[name]["host_probes_ms"] = probes[name]
    return out


def repeat_rows(raws: list[str], profile: Any) -> tuple[list[str], dict[str, float]]:
    """Each configuration measured more than once in `raws` (passes, in one process or isolated): every
    measurement, its error against the prediction, and its distance from the configuration's own mean (what
    no prediction of one number can do better than on one measurement). Markdown rows and the totals."""
    runs: dict[str, list[dict]] = {}
    for rec in _raw_records(raws):
        if "measured" in rec:
            runs.setdefault(rec["name"], []).append(rec)
    lines = ["| configuration | predicted ms | measured ms, in order (i: its own process; op us: host_tick before/after) "
             "| median | error of the median | spread (max/min - 1) | mean distance from its mean |",
             "|---|---:|---|---:|---:|---:|---:|"]
    dist, errs, medians = [], [], []
    for cfg in CONFIGS:
        recs = runs.get(cfg.name, [])
        if len(recs) < 2:
            continue
        pred = predict(cfg, profile, raw=recs[-1])[0]["step_time_s"]
        times = [r["measured"]["step_time_s"] for r in recs]
        mean, median = statistics.mean(times), statistics.median(times)
        own = [abs(t / mean - 1) for t in times]
        dist += own
        errs += [abs(pred / t - 1) for t in times]
        medians.append(abs(pred / median - 1))

        def one(r: dict) -> str:
            tick = (f" ({r['host_tick_before']['op_us']:.1f}/{r['host_tick_after']['op_us']:.1f})"
                    if "host_tick_before" in r else "")
            return f"{r['measured']['step_time_s'] * 1e3:.1f}{' i' if r.get('isolated') else ''}{tick}"
        lines.append(f"| {cfg.name} | {pred * 1e3:.1f} | {' / '.join(one(r) for r in recs)} | {median * 1e3:.1f} | "
                     f"{pred / median - 1:+.1%} | {max(times) / min(times) - 1:.0%} | {statistics.mean(own):.1%} |")
    totals = {"measurements": len(errs), "error_mean": statistics.mean(errs), "within_10": sum(e <= 0.1 for e in errs),
              "median_error_mean": statistics.mean(medians), "medians_within_10": sum(e <= 0.1 for e in medians),
              "rows": len(medians), "own_mean_distance": statistics.mean(dist),
              "own_within_10": sum(d <= 0.1 for d in dist)}
    return lines, totals


def cmd_repeats(args: argparse.Namespace) -> int:
    from hardware_profiles import load_profile
    lines, t = repeat_rows(args.raw, load_profile(args.profile))
    command = " ".join(["python benchmarks/trainer_sweep.py repeats --raw", *args.raw, "--profile", args.profile])
    summary = (f"{t['measurements']} measurements of {t['rows']} configurations: each against the prediction "
               f"{t['error_mean']:.1%} mean |error|, {t['within_10']} within 10%; each configuration's median "
               f"{t['median_error_mean']:.1%}, {t['medians_within_10']} of {t['rows']} within 10%; each measurement "
               f"against its configuration's own mean {t['own_mean_distance']:.1%}, {t['own_within_10']} within 10%")
    print(summary)
    if args.doc:
        Path(args.doc).write_text(f"# Repeated measurements on one VM\n\nCommand: `{command}`\n\n"
                                  + "\n".join(lines) + f"\n\n{summary}\n")
    return 0


def _bisect(g: Any, lo: float, hi: float) -> float:
    """The root of `g`, monotone on [lo, hi], after 30 halvings, rounded to 3 decimals (a profile's precision)."""
    rising = g(hi) > g(lo)
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (g(mid) < 0) == rising else (lo, mid)
    return round((lo + hi) / 2, 3)


def fit_sweep_terms(base: Any, measured: dict[str, dict], skip: list[str] = (),
                    say: Any = print) -> tuple[dict[str, float], list[str]]:
    """FIT's runtime terms over `base` (host terms in place), each by bisection so that its one fitting
    configuration (measured: `_measured`'s records) is predicted exactly -- the step time is monotone in each
    term; `skip`: keys the probes identified. Returns the fitted entries and the configurations used."""
    import dataclasses
    fitted: dict[str, float] = {}
    fit_configs: list[str] = []
    for key, name in FIT.items():
        if key in skip:
            continue
        cfg = next(c for c in CONFIGS if c.name == name)
        target = measured[name]["measured"]["step_time_s"]
        lo, hi = FIT_RANGE[key]

        def step_time(value: float, key: str = key, cfg: SweepConfig = cfg, raw: dict = measured[name]) -> float:
            prof = dataclasses.replace(base, calibration={**base.calibration, **fitted, key: value})
            return predict(cfg, prof, raw)[0]["step_time_s"]

        fitted[key] = _bisect(lambda v, step_time=step_time, target=target: step_time(v) - target, lo, hi)
        fit_configs.append(name)
        say(f"{key}: {fitted[key]}  (from {name}: measured {target * 1e3:.1f} ms)")
    return fitted, fit_configs


def fit_host_anchors(base: Any, runs: list[tuple[float, dict[str, dict]]],
                     say: Any = print) -> tuple[dict[str, float], list[str]]:
    """HOST_ANCHOR's terms over `base`, each by bisection so that its configuration's step time, predicted
    with every host term rescaled to each machine that measured it, matches the measurements in geometric
    mean. `runs`: (the machine's host factor against `base`, `_measured`'s records there) per machine; the
    term is in `base`'s units. A term no machine measured keeps its probe fit. Returns the fitted entries
    and the configurations used."""
    import dataclasses

    from autoparallel.calibrate_trainer import rescaled
    fitted: dict[str, float] = {}
    used: list[str] = []
    for key, (name, (lo, hi)) in HOST_ANCHOR.items():
        cfg = next(c for c in CONFIGS if c.name == name)
        seen = [(f, m[name]) for f, m in runs if "measured" in m.get(name, {})]
        if not seen:
            continue

        def log_error(value: float, key: str = key, cfg: SweepConfig = cfg, seen: list = seen) -> float:
            prof = dataclasses.replace(base, calibration={**base.calibration, **fitted, key: value})
            return sum(math.log(predict(cfg, rescaled(prof, f), raw)[0]["step_time_s"]
                                / raw["measured"]["step_time_s"]) for f, raw in seen)

        fitted[key] = _bisect(log_error, lo, hi)
        used.append(name)
        say(f"{key}: {fitted[key]}  (from {name} on {len(seen)} machine(s))")
    return fitted, used


def cmd_fit(args: argparse.Namespace) -> int:
    """Each runtime term by bisection so that its one fitting configuration is predicted exactly (the
    step time is monotone in each term); prints the calibration entries for the profile."""
    import dataclasses

    from hardware_profiles import load_profile, profile_to_yaml
    base = load_profile(PROFILE)
    records = load_records(args.probes)
    host = fit_host_terms(records, base)
    for name, r in host.residuals.items():
        print(f"  probe {name}: model {r:+.1%}")
    print("host terms: " + ", ".join(f"{k} {v}" for k, v in host.terms.items() if k not in HOST_TERMS)
          + ", " + describe_terms(host), flush=True)
    base = dataclasses.replace(base, calibration={**base.calibration, **host.terms,
                                                  REFERENCE_KEY: reference_times(records)})
    measured = _measured(args.raw)
    anchors, anchor_configs = fit_host_anchors(base, [(1.0, measured)])
    base = dataclasses.replace(base, calibration={**base.calibration, **anchors})
    fitted, fit_configs = fit_sweep_terms(base, measured, skip=[k for k in FIT if host.terms.get(k)])
    fitted, fit_configs = {**anchors, **fitted}, anchor_configs + fit_configs
    # which configurations the fit used, for `report` to leave out of the held-out ones
    Path(args.output).write_text(profile_to_yaml(base, extra={"calibration": {**fitted,
                                                                               SWEEP_FIT_KEY: fit_configs}}))
    print(f"wrote {args.output}")
    return 0


def shipped_text(text: str, fitted: dict[str, Any]) -> str:
    """h200.yaml's `text` with the fitted trainer terms of a `fit` profile's calibration `fitted` written in place
    (comments and every other value kept): the fractions, the host terms (HELD_TERMS included: the fit scales
    them with its per-op rates) and per-op rates; a host term the profile no longer reads is dropped."""
    import re

    from cost_models.host import HELD_TERMS, HOST_TERMS
    keys = ("compiled_fused_fraction", *HOST_TERMS, *HELD_TERMS, "host_us_per_op", "host_us_per_op_moe",
            "host_us_per_op_fwd_bwd", "host_us_per_op_moe_fwd_bwd", REFERENCE_KEY)
    for key in keys:
        value = fitted[key]
        if isinstance(value, dict):  # REFERENCE_KEY: probe -> ms
            line = f"  {key}:\n" + "".join(f"    {k}: {v}\n" for k, v in value.items())
        elif isinstance(value, list):
            line = f"  {key}:\n" + "".join(f"  - {v}\n" for v in value)
        else:
            line = f"  {key}: {value}\n"
        pattern = re.compile(rf"^  {key}:(?: [^\n]*\n|\n(?:  (?:- |  )[^\n]*\n)+)", re.M)
        if pattern.search(text):
            text = pattern.sub(lambda _, line=line: line, text, count=1)
        else:  # a new term: after the fitted fractions
            text = re.sub(r"^(  compiled_memory_fraction: [^\n]*\n)", lambda m, line=line: m.group(1) + line, text, count=1,
                          flags=re.M)
    for stale in re.findall(r"^  (host_us_per_[a-z_]+):", text, re.M):
        if stale not in keys and stale not in ("host_us_per_new_gemm_shape", "host_us_per_seen_gemm_shape"):
            text = re.sub(rf"^  {stale}: [^\n]*\n", "", text, flags=re.M)
    return text


def cmd_ship(args: argparse.Namespace) -> int:
    """Write the fitted trainer terms of `fit`'s profile into hardware_profiles/h200.yaml in place
    (`shipped_text`)."""
    import yaml

    path = ROOT / "hardware_profiles" / f"{PROFILE}.yaml"
    path.write_text(shipped_text(path.read_text(), yaml.safe_load(Path(args.profile).read_text())["calibration"]))
    print(f"wrote the fitted terms of {args.profile} into {path}")
    return 0


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def cmd_predict(args: argparse.Namespace) -> int:
    """The shipped profile's predictions of the selected plan files, written before the run that measures
    them (held-out evidence: trainer_sweep_predicted_sN.json; the run's report rescales the host terms)."""
    records = [{"name": cfg.name, "predicted": predict(cfg, args.profile)[0]} for cfg in _selected(args.only)]
    out = {"profile": f"{args.profile} as shipped (host factor 1.0; the run's report rescales it to the VM)",
           "records": records}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in records:
        print(f"{r['name']:28s} {r['predicted']['step_time_s'] * 1e3:8.1f} ms {r['predicted']['peak_memory_gib']:6.1f} GiB")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import dataclasses

    from hardware_profiles import load_profile
    profile = load_profile(args.profile)
    overrides = dict(_calibration_override(text) for text in args.calibration or ())
    if overrides:  # a what-if: the profile with some calibration entries replaced (said in the doc's command)
        profile = dataclasses.replace(profile, calibration={**profile.calibration, **overrides})
    fit_configs = set(profile.calibration.get(SWEEP_FIT_KEY, SWEEP_FIT_DEFAULT))
    measured = _measured(args.raw)
    records = []
    for cfg in CONFIGS:
        m = measured.get(cfg.name)
        if m is None or "measured" not in m:
            continue
        factor = row_speed(m, profile, args.row_speed.split(",")) if args.row_speed else None
        if args.row_speed and factor is None:
            raise SystemExit(f"report --row-speed: {cfg.name} has no host_probes_ms; measure it with --host-probes")
        pred, est = predict(cfg, rescaled(profile, factor) if factor is not None else profile, raw=m)
        from autoparallel.plan import Plan
        rec = {"name": cfg.name, "gpus": cfg.gpus, "model": cfg.model, "compile": est.plan.compile,
               "fitted": cfg.name in fit_configs,
               "plan": _describe(Plan.load(cfg.plan_file)), "predicted": pred,
               "measured": {k: m["measured"][k] for k in ("step_time_s", "peak_memory_gib")},
               "breakdown": est.breakdown}
        if factor is not None:
            rec["host_factor"] = factor
        rec["time_error"] = pred["step_time_s"] / m["measured"]["step_time_s"] - 1
        rec["memory_error"] = pred["peak_memory_gib"] / m["measured"]["peak_memory_gib"] - 1
        if "profile" in m:
            rec["profile"] = m["profile"]
        records.append(rec)
    failed = sorted(n for n, m in measured.items() if "error" in m)
    row_factors = [r["host_factor"] for r in records if "host_factor" in r]
    # the planner's picks under the sweep's typical host (per-row factors: their geometric mean)
    picks = planner_picks(records, rescaled(profile, statistics.geometric_mean(row_factors)) if row_factors else profile)
    Path(args.results).write_text(json.dumps({"profile": PROFILE, "records": records, "failed": failed,
                                              "planner_picks": picks}, indent=1) + "\n")
    lines = ["| configuration | gpus | plan | predicted ms | measured ms | error | predicted GiB | measured GiB | error "
             "| measured MFU |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        cfg = next(c for c in CONFIGS if c.name == r["name"])
        r["measured"]["mfu"] = mfu(cfg, r["measured"]["step_time_s"])
        lines.append(f"| {r['name']}{' (fit)' if r['fitted'] else ''} | {r['gpus']} | {r['plan']}"
                     f"{' compiled' if r['compile'] else ''} | "
                     f"{r['predicted']['step_time_s'] * 1e3:.1f} | {r['measured']['step_time_s'] * 1e3:.1f} | "
                     f"{r['time_error']:+.1%} | {r['predicted']['peak_memory_gib']:.1f} | "
                     f"{r['measured']['peak_memory_gib']:.1f} | {r['memory_error']:+.1%} | "
                     f"{r['measured']['mfu']:.1%} |")
    held = [r for r in records if not r["fitted"]]
    te = [abs(r["time_error"]) for r in held]
    me = [abs(r["memory_error"]) for r in held]
    summary = (f"{len(held)} held-out configurations (the {len(records) - len(held)} fitting ones excluded); time: mean "
               f"|error| {statistics.mean(te):.1%}, max {max(te):.1%}, {sum(e <= 0.10 for e in te)} within 10%; "
               f"memory: mean |error| {statistics.mean(me):.1%}, max {max(me):.1%}, "
               f"{sum(e <= 0.05 for e in me)} within 5%" if held else "no records")
    print("\n".join(lines))
    print(summary)
    if failed:
        print("failed:", ", ".join(failed))
    raws = " ".join(_rel(r) for r in args.raw)
    # the keys fit took from a configuration (host_us_per_compiled_call only where the probes lack the compiled one)
    fitted = ", ".join(f"`{k}` from {v}" for k, v in FIT.items() if v in fit_configs) or "nothing from the sweep"
    outputs = "".join(f" --{k} {_rel(v)}" for k, v, default in (("doc", args.doc, DOC), ("results", args.results, RESULTS))
                      if Path(v).resolve() != default.resolve())
    outputs += "".join(f" --calibration {k}={v}" for k, v in overrides.items())
    outputs += "" if not args.row_speed else " --row-speed" if args.row_speed == "before,after" else f" --row-speed {args.row_speed}"
    Path(args.doc).write_text(
        f"# AutoParallelTrainer against the cost model ({profile.model.split()[0]})\n\n"
        f"Command: `python benchmarks/trainer_sweep.py report --raw {raws} --profile {_rel(args.profile)}{outputs}` "
        f"(measured with the `measure` commands in the script's docstring on a lent {profile.model.split()[0]} machine, "
        "one or two GPUs; plans from `plans`).\n\n"
        + (f"Each row's profile is {profile.name}'s with its host terms rescaled by the speed probes timed in the "
           f"measuring process just before and after that row (`measure --host-probes`, `row_speed`: the "
           f"geometric mean of the probes' ratios to {REFERENCE_KEY}; factors {min(row_factors):.3f}-{max(row_factors):.3f} "
           "here); nothing of this machine's sweep was fitted, and the rows marked (fit) gave the base profile its "
           "two fractions on another VM. Predicted memory " if args.row_speed else
           f"The profile is `autoparallel calibrate --trainer --rescale`'s, run on the same machine before the "
           f"sweep: {profile.calibration['host_speed']} (three host-bound probes; autoparallel/calibrate_trainer.py "
           "`fit_host_speed`); nothing of this machine's sweep was fitted, and the rows marked (fit) gave the base "
           "profile its two fractions on another VM. Predicted memory " if "host_speed" in profile.calibration else
           "The profile is `fit`'s: the trainer's host terms fitted from the small probes of `autoparallel "
           "calibrate --trainer` measured on the same machine (autoparallel/calibrate_trainer.py; none is a "
           f"configuration below), then {fitted}; every other row is held out. Predicted memory ")
        + "is rank 0's allocated peak (stage 0, without the allocator reserve) against "
        "torch.cuda.max_memory_allocated.\n\n" + "\n".join(lines) + f"\n\n{summary}\n\n" + _picks_doc(picks) +
        "What the errors say, mechanism by mechanism, and what is left: docs/trainer_sweep_notes.md.\n")
    return 0


def _calibration_override(text: str) -> tuple[str, float]:
    key, _, value = text.partition("=")
    try:
        if key.strip():
            return key.strip(), float(value)
    except ValueError:
        pass
    raise SystemExit(f"--calibration {text!r}: give KEY=NUMBER, e.g. fsdp_copy_fraction=0.6")


def planner_picks(records: list[dict], profile: Any) -> list[dict]:
    """Per model, GPU count and batch with two or more measured plans: the plan the planner picks now under
    `profile` (plan_model with nothing pinned, as AutoParallelTrainer plans on a GPU), the measured
    configurations that ran exactly that plan, and the fastest measured plan of the group."""
    from autoparallel.api import plan_model
    by_name = {c.name: c for c in CONFIGS}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        c = by_name[r["name"]]
        groups.setdefault((c.model, c.gpus, c.rows, c.seq, c.clip), []).append(r)
    out = []
    for (model, gpus, rows, seq, _), recs in groups.items():
        if len(recs) < 2:
            continue
        cfg = by_name[recs[0]["name"]]
        plan = plan_model(_meta_model(cfg), hardware=profile, gpus=gpus, gpus_per_node=gpus, global_batch=rows,
                          seq_len=seq, max_memory_per_gpu=BUDGET, variant=cfg.variant)
        pick = _describe(plan) + (" compiled" if plan.compile else "")
        ran = [r for r in recs if r["plan"] + (" compiled" if r["compile"] else "") == pick]
        fastest = min(recs, key=lambda r: r["measured"]["step_time_s"])
        pick_s = min((r["measured"]["step_time_s"] for r in ran), default=None)
        out.append({"model": model, "gpus": gpus, "rows": rows, "seq": seq, "pick": pick,
                    "pick_configs": [r["name"] for r in ran], "pick_measured_s": pick_s,
                    "fastest": fastest["name"], "fastest_s": fastest["measured"]["step_time_s"],
                    "pick_over_fastest": None if pick_s is None else pick_s / fastest["measured"]["step_time_s"] - 1,
                    "plans_measured": len(recs)})
    return out


def _picks_doc(picks: list[dict]) -> str:
    if not picks:
        return ""
    def ms(x: float | None) -> str:
        return "" if x is None else f"{x * 1e3:.1f}"

    rows = [f"| {p['model']} | {p['gpus']} | {p['rows']} x {p['seq']} | {p['pick']} | "
            f"{', '.join(p['pick_configs']) or 'not measured'} | {ms(p['pick_measured_s'])} | "
            f"{p['fastest']} {ms(p['fastest_s'])} | "
            + ("" if p["pick_over_fastest"] is None else f"{p['pick_over_fastest']:+.1%}") + f" | {p['plans_measured']} |"
            for p in picks]
    return ("The planner's pick against the measured plans (`planner_picks`: plan_model with nothing pinned under "
            "the profile above, as the trainer plans on a GPU; a pick is measured when a configuration ran exactly "
            "its plan):\n\n| model | GPUs | batch | pick | ran as | pick ms | fastest measured ms | pick / fastest "
            "| plans measured |\n|---|---:|---|---|---|---:|---|---:|---:|\n" + "\n".join(rows) + "\n\n")


# ============================================================================ losses (CPU)
# Every two-GPU configuration's loss per step against the one-GPU run of the same model and global batch
# (same init, same batches, same steps), within a tolerance derived in docs/loss_matching.md: the first
# step's from rounding analysis (step1_rtol), the later steps' from the null measured at scale: one-GPU runs
# equal to the reference in exact arithmetic (null_runs_of), whose differences from it are rounding alone.
BF16_UNIT_ROUNDOFF = 2.0**-8
INIT_STD = 0.02  # init_weights' std of every weight that is not a residual output, the LM head's included
# Confidence of the first step's bound: the mean of N independent per-token rounding errors, each within
# +-B, exceeds B sqrt(2 ln(2 / delta) / N) with probability at most delta (Hoeffding).
STEP1_DELTA = 1e-6
# Later steps: the probability, under the null model (NullFit), that a sweep whose plans differ from their
# references by rounding alone fails at least one of its later-step comparisons (plan x step >= 2). Split
# evenly over those comparisons (Bonferroni: valid whatever their dependence; they share the null's fit).
FALSE_ALARM = 0.01
NULL_FIRST_STEP = 2  # the fit starts after the forward-only first step, which has its own bound
# The null's growth law: log s_k linear in NULL_LAW's covariate of the step k (null_covariate): "power"
# (ln(k - 1): s_k = s_2 (k - 1)^p) or "exponential" (k - 1: chaotic divergence's asymptote). Power, from the
# data (docs/loss_matching.md, "Which growth law?"): on the sixteen committed two-GPU llama plans (if
# rounding-only, null draws) it fits better by likelihood, and with every 4 of them as the null the other
# 12 fail in 2 of 1820 subsets under it, in 434 under the exponential law (FALSE_ALARM = 0.01)
NULL_LAW = "power"
# Monte Carlo of the tolerance's pivot (pivot_quantiles): draws, seed, and the standard errors added to its
# estimate of the false-alarm probability, so that the simulation's own error cannot tighten the tolerance
NULL_MC_DRAWS = 40000
NULL_MC_SEED = 0
NULL_MC_SE = 3.0
# Fallback for a model without null runs in the raw files (the rule before the null existed): the growth
# of rounding noise per step from `noise` (CPU, small scale, benchmarks/results/loss_noise_cpu.json: the
# largest d_k / (k - 1) over its runs and steps k >= 2) times SCALE_MARGIN for the transfer to 1B
# parameters, a judgement, not derived; docs/loss_matching.md says which models it judged.
NOISE_GROWTH_CPU = 1.5e-5
SCALE_MARGIN = 10.0
LOSS_GROWTH_PER_STEP = SCALE_MARGIN * NOISE_GROWTH_CPU


def _shape(spec: dict[str, Any]) -> tuple[int, int, int]:
    """(width, vocabulary, layers) of a MODELS spec (llama / qwen2_moe or gpt2 keys)."""
    return (int(spec.get("hidden_size", spec.get("n_embd"))), int(spec["vocab_size"]),
            int(spec.get("num_hidden_layers", spec.get("n_layer"))))


def logit_rel_error(layers: int) -> float:
    """Bound on the relative difference of one logit between two plans: each plan's logit is within
    sqrt(1 + 2 L) u of the exact one (the head's bf16 rounding, plus the two bf16 residual additions per
    block accumulating as a random walk: probabilistic rounding analysis, Higham and Mary 2019; the final
    norm rescales the stream, so its relative error is what reaches the head), two plans: twice that."""
    return 2 * BF16_UNIT_ROUNDOFF * math.sqrt(1 + 2 * layers)


def step1_rtol(spec: dict[str, Any], tokens: int) -> float:
    """Bound on |loss / reference - 1| at the first step (forward-only rounding: same weights, same batch;
    derivation in docs/loss_matching.md). A token's cross entropy logsumexp(z) - z_y has gradient p - e_y
    of l1 norm <= 2, so it moves by at most B = 2 max_i |dz_i| <= 2 eps z_max (eps: logit_rel_error); at the
    shared init the logits are N(0, sigma^2 = INIT_STD^2 d) (the final norm's output has squared norm d),
    z_max = sqrt(2 ln V) sigma, and the loss L0 = ln V + sigma^2 / 2. The mean over `tokens` independent
    token errors within +-B is within B sqrt(2 ln(2 / STEP1_DELTA) / tokens) (Hoeffding); relative: / L0."""
    d, vocab, layers = _shape(spec)
    sigma = INIT_STD * math.sqrt(d)
    per_token = 2 * logit_rel_error(layers) * math.sqrt(2 * math.log(vocab)) * sigma
    return per_token * math.sqrt(2 * math.log(2 / STEP1_DELTA) / tokens) / (math.log(vocab) + sigma**2 / 2)


def loss_rtol(spec: dict[str, Any], tokens: int, step: int) -> float:
    """The fallback tolerance at `step` (1-based), for a model without null runs: the first step's bound
    plus LOSS_GROWTH_PER_STEP per later step."""
    return step1_rtol(spec, tokens) + (step - 1) * LOSS_GROWTH_PER_STEP


def rel_diffs(losses: list[float], ref: list[float]) -> list[float]:
    """|loss / reference - 1| per step, over the steps both have."""
    return [abs(a / b - 1) for a, b in zip(losses, ref, strict=False)]


# ---------------------------------------------------------------------------- the null model
# A run equal to the reference in exact arithmetic differs from it at step k by e_k ~ N(0, s_k^2), with
# log s_k = log s0 + b x_k, x_k = null_covariate(k) (NULL_LAW: a power law of k - 1 or exponential growth),
# draws of different runs and steps independent; d_k = |e_k| is what the records give. Fitted by maximum
# likelihood on the pooled draws.
def null_covariate(steps: Any, law: str | None = None) -> np.ndarray:
    """x_k of the growth law (default NULL_LAW) for 1-based steps k >= 2: k - 1 (exponential) or ln(k - 1)
    (power law)."""
    law = law or NULL_LAW
    k = np.asarray(steps, dtype=float)
    if law == "exponential":
        return k - 1
    if law == "power":
        return np.log(k - 1)
    raise ValueError(f"NULL_LAW {law!r}: 'exponential' or 'power'")


def erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function, elementwise (numpy has none and scipy is no dependency): Numerical
    Recipes' erfcc Chebyshev fit, fractional error below 1.2e-7 for every x."""
    z = np.abs(x)
    t = 1 / (1 + 0.5 * z)
    coef = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
            1.48851587, -0.82215223, 0.17087277)
    poly = np.zeros_like(t)
    for c in reversed(coef[1:]):
        poly = t * (c + poly)
    r = t * np.exp(-z * z + coef[0] + poly)
    return np.where(x >= 0, r, 2 - r)


def halfnormal_fit(x: np.ndarray, d: np.ndarray, iters: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood (log s0, b) of d_i = |e_i|, e_i ~ N(0, s_i^2), log s_i = log s0 + b x_i, for each
    row of `d` (shape (..., n); x: shape (n,)). Profiling s0 out (s0^2 = mean d^2 e^(-2 b x)) leaves the
    score mean_w(x) - mean(x) with weights w ~ d^2 e^(-2 b x); mean_w(x) falls with b (its derivative is
    -2 var_w(x)), so bisection finds the one root. A zero draw (equal losses at fp32 resolution) weighs
    nothing, as in the likelihood; the caller makes sure two distinct x carry nonzero draws."""
    x = np.asarray(x, dtype=float)
    d = np.asarray(d, dtype=float)
    with np.errstate(divide="ignore"):
        logd2 = 2 * np.log(d)
    lo = np.full(d.shape[:-1], -20.0)
    hi = np.full(d.shape[:-1], 20.0)
    for _ in range(iters):
        mid = (lo + hi) / 2
        lw = logd2 - 2 * mid[..., None] * x
        w = np.exp(lw - lw.max(axis=-1, keepdims=True))
        above = (w * x).sum(axis=-1) / w.sum(axis=-1) > x.mean()  # b too small: the weights lean to large x
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    b = (lo + hi) / 2
    log_s0 = 0.5 * np.log(np.mean(d * d * np.exp(-2 * b[..., None] * x), axis=-1))
    return log_s0, b


def halfnormal_loglik(x: np.ndarray, d: np.ndarray, log_s0: float, b: float) -> float:
    """The model's log-likelihood of draws `d` (to compare fits with different covariates x)."""
    x, d = np.asarray(x, dtype=float), np.asarray(d, dtype=float)
    log_s = log_s0 + b * x
    return float(np.sum(0.5 * math.log(2 / math.pi) - log_s - d * d / (2 * np.exp(2 * log_s))))


def pivot_quantiles(steps: list[int], targets: list[int], alpha: float, draws: int = NULL_MC_DRAWS,
                    seed: int = NULL_MC_SEED, law: str | None = None) -> dict[int, tuple[float, float]]:
    """For each target step k: (q_k, the Monte Carlo standard error of the false-alarm estimate there) with
    P(|e_k| > q_k s^_k) <= alpha for a new draw e_k of the null and s^_k the fit to null draws at `steps`.
    |e_k| / s^_k is a pivot: its distribution does not depend on the true s0 and b (the fit is equivariant
    under scaling and tilting), only on the steps of the draws, so it is simulated with s0 = 1, b = 0.
    Given the fit, the new draw exceeds q s^_k with probability erfc(q R_k / sqrt 2), R_k = s^_k / s_k;
    averaging that over simulated fits (conditional Monte Carlo: no rare-event counting) gives the
    false-alarm probability, estimate + NULL_MC_SE standard errors, solved for q by bisection."""
    rng = np.random.default_rng(seed)
    x = null_covariate(steps, law)
    log_s0, b = halfnormal_fit(x, np.abs(rng.standard_normal((draws, len(x)))))
    out = {}
    for k in targets:
        r = np.exp(log_s0 + b * null_covariate(k, law))
        lo, hi = math.log(0.1), math.log(1e4)
        for _ in range(60):
            q = math.exp((lo + hi) / 2)
            p = erfc(q * r / math.sqrt(2))
            over = p.mean() + NULL_MC_SE * p.std() / math.sqrt(draws) > alpha
            lo, hi = (math.log(q), hi) if over else (lo, math.log(q))
        q = math.exp(hi)
        p = erfc(q * r / math.sqrt(2))
        out[k] = (q, float(p.std() / math.sqrt(draws)))
    return out


@dataclass
class NullFit:
    """The null of one model: its one-GPU runs equal to the reference in exact arithmetic, their relative
    differences from it, and the model fitted to those of steps >= NULL_FIRST_STEP. problem: why there is
    no fit ("" when there is one; the model's plans then fall back to loss_rtol)."""
    model: str
    reference: str
    runs: dict[str, list[float]] = field(default_factory=dict)  # run -> relative difference per step
    excluded: dict[str, str] = field(default_factory=dict)      # run -> why it is no draw
    problem: str = ""
    steps: list[int] = field(default_factory=list)   # step of each pooled draw
    draws: list[float] = field(default_factory=list)
    law: str = field(default_factory=lambda: NULL_LAW)
    scale: float = 0.0                               # fitted s0 = e^(log s0): s_k at the covariate's zero
    growth: float = 1.0                              # e^b: s_(k+1) / s_k (exponential); b: the exponent (power)
    alpha: float = 0.0                               # false-alarm probability per comparison
    quantiles: dict[int, float] = field(default_factory=dict)  # step -> q_k (tolerance / fitted s_k)
    mc_se: dict[int, float] = field(default_factory=dict)      # step -> the Monte Carlo's standard error

    @property
    def fitted(self) -> bool:
        return not self.problem

    def sd(self, step: int) -> float:
        x = float(null_covariate(step, self.law))
        return self.scale * (self.growth ** x if self.law == "exponential" else math.exp(self.growth * x))

    @property
    def formula(self) -> str:
        if self.law == "exponential":
            return f"{self.scale:.2e} x {self.growth:.2f}^(k - 1) (the sd grows {self.growth:.2f}x a step)"
        return f"{self.scale:.2e} x (k - 1)^{self.growth:.2f} (power law)"

    def calibrate(self, alpha: float, targets: list[int]) -> None:
        self.alpha = alpha
        qs = pivot_quantiles(self.steps, targets, alpha, law=self.law)
        self.quantiles = {k: q for k, (q, _) in qs.items()}
        self.mc_se = {k: se for k, (_, se) in qs.items()}

    def tolerance(self, floor: float, step: int) -> float:
        """The tolerance at `step`: the step-1 bound `floor` at every step, the null's band after step 1."""
        return floor if step < NULL_FIRST_STEP else max(floor, self.quantiles[step] * self.sd(step))


def reference_of(cfg: SweepConfig, configs: list[SweepConfig]) -> SweepConfig | None:
    """The one-GPU eager configuration of the same model, global batch and sequence (first in CONFIGS)."""
    return next((c for c in configs if c.gpus == 1 and c.model == cfg.model and c.rows == cfg.rows
                 and c.seq == cfg.seq and not c.fix.get("compile")), None)


def null_runs_of(ref: SweepConfig, configs: list[SweepConfig]) -> list[SweepConfig]:
    """The one-GPU configurations equal to the reference `ref` in exact arithmetic: the same model, global
    batch and sequence on one GPU, other than `ref` (other micro-batch splits, recompute, compiled kernels).
    Their differences from `ref` are rounding alone: the null the later-step tolerance is measured from."""
    return [c for c in configs if c.gpus == 1 and c.model == ref.model and c.rows == ref.rows
            and c.seq == ref.seq and c.name != ref.name]


def _unusable(rec: dict | None) -> str | None:
    """Why a raw record cannot be compared, or None."""
    if rec is None:
        return "not measured"
    if "error" in rec:
        return "error"
    if not rec.get("losses"):
        return "no losses"
    if not str(rec.get("init", "per-run")).startswith("seed"):
        return "per-run init"
    return None


def fit_null(ref: SweepConfig, records: dict[str, dict], configs: list[SweepConfig]) -> NullFit:
    """The null runs of `ref` found in `records`, pooled and fitted (not yet calibrated: that needs the
    number of comparisons). A run with the reference's exact losses, or another run's, is no extra draw
    (the same arithmetic); one that cannot be compared is listed with the reason."""
    ref_rec = records[ref.name]
    null = NullFit(ref.model, ref.name)
    seen: dict[tuple[float, ...], str] = {}
    for cfg in null_runs_of(ref, configs):
        rec = records.get(cfg.name)
        why = _unusable(rec)
        if why == "not measured":
            continue
        if why is None and rec["init"] != ref_rec["init"]:
            why = f"init {rec['init']}, reference {ref_rec['init']}"
        if why is None and not all(math.isfinite(x) for x in rec["losses"]):
            why = "non-finite loss"
        if why is None and tuple(rec["losses"]) in seen:
            why = f"losses identical to {seen[tuple(rec['losses'])]}"
        diffs = rel_diffs(rec["losses"], ref_rec["losses"]) if why is None else []
        if why is None and not any(diffs[NULL_FIRST_STEP - 1:]):
            why = "losses identical to the reference"
        if why:
            null.excluded[cfg.name] = why
            continue
        seen[tuple(rec["losses"])] = cfg.name
        null.runs[cfg.name] = diffs
        for k, dk in enumerate(diffs[NULL_FIRST_STEP - 1:], start=NULL_FIRST_STEP):
            null.steps.append(k)
            null.draws.append(dk)
    if not null.runs:
        null.problem = "no null runs in the raw files" + (" usable" if null.excluded else "")
    elif len({k for k, dk in zip(null.steps, null.draws, strict=True) if dk > 0}) < 2:
        null.problem = "the null's nonzero differences lie at fewer than two steps: no growth to fit"
    else:
        log_s0, b = halfnormal_fit(null_covariate(null.steps, null.law), np.array(null.draws))
        null.scale = math.exp(float(log_s0))
        null.growth = math.exp(float(b)) if null.law == "exponential" else float(b)
    return null


@dataclass
class LossMatch:
    """One two-GPU configuration against its one-GPU reference. status: "pass", "fail" or why it was not
    compared ("no reference", "not measured", "error", "per-run init", ...). rule: what set the later
    steps' tolerance ("null" or "CPU-noise fallback")."""
    name: str
    model: str
    reference: str | None
    status: str
    losses: list[float] = field(default_factory=list)
    reference_losses: list[float] = field(default_factory=list)
    rel_diffs: list[float] = field(default_factory=list)
    tolerances: list[float] = field(default_factory=list)
    note: str = ""
    rule: str = ""

    @property
    def max_rel_diff(self) -> float | None:
        return max(self.rel_diffs) if self.rel_diffs else None

    @property
    def worst_ratio(self) -> float | None:
        """max over steps of |relative difference| / tolerance (pass: <= 1)."""
        return max(d / t for d, t in zip(self.rel_diffs, self.tolerances, strict=True)) if self.rel_diffs else None


@dataclass
class LossReport:
    matches: list[LossMatch]
    nulls: dict[str, NullFit]  # model -> its null (every model with a compared configuration)
    comparisons: int = 0       # later-step comparisons judged by a null: FALSE_ALARM is split over them


def _pair(cfg: SweepConfig, records: dict[str, dict], configs: list[SweepConfig]) -> LossMatch:
    """The configuration's record against its reference's: differences set, tolerances not yet."""
    ref = reference_of(cfg, configs)
    m = LossMatch(cfg.name, cfg.model, ref.name if ref else None, "no reference")
    if ref is None:
        return m
    rec, ref_rec = records.get(cfg.name), records.get(ref.name)
    why, ref_why = _unusable(rec), _unusable(ref_rec)
    if why or ref_why:
        m.status = why or f"reference: {ref_why}"
        return m
    if rec["init"] != ref_rec["init"]:
        m.status, m.note = "init differs", f"{rec['init']} vs {ref_rec['init']}"
        return m
    m.status = "compared"
    m.losses, m.reference_losses = list(rec["losses"]), list(ref_rec["losses"])
    m.rel_diffs = rel_diffs(m.losses, m.reference_losses)
    if len(m.losses) != len(m.reference_losses):
        m.note = f"{len(m.losses)} steps against {len(m.reference_losses)}: the common {len(m.rel_diffs)} compared"
    return m


def judge_losses(records: dict[str, dict], configs: list[SweepConfig] | None = None) -> LossReport:
    """Every multi-GPU configuration of `configs` (default CONFIGS) against its one-GPU reference, the later
    steps within its model's null band (FALSE_ALARM split over all such comparisons), or, for a model
    without null runs, within the CPU-noise fallback (loss_rtol)."""
    configs = CONFIGS if configs is None else configs
    matches = [_pair(cfg, records, configs) for cfg in configs if cfg.gpus > 1]
    compared = [m for m in matches if m.status == "compared"]
    nulls = {m.model: fit_null(next(c for c in configs if c.name == m.reference), records, configs)
             for m in compared}
    later = {model: [max(len(m.rel_diffs) - NULL_FIRST_STEP + 1, 0) for m in compared if m.model == model]
             for model in nulls}
    comparisons = sum(sum(later[model]) for model, null in nulls.items() if null.fitted)
    for model, null in nulls.items():
        if null.fitted and comparisons:
            top = max(len(m.rel_diffs) for m in compared if m.model == model)
            null.calibrate(FALSE_ALARM / comparisons, list(range(NULL_FIRST_STEP, top + 1)))
    for m in compared:
        cfg = next(c for c in configs if c.name == m.name)
        spec, tokens, null = MODELS[cfg.model], cfg.rows * cfg.seq, nulls[m.model]
        floor = step1_rtol(spec, tokens)
        m.rule = "null" if null.fitted else "CPU-noise fallback"
        m.tolerances = [null.tolerance(floor, k) if null.fitted else loss_rtol(spec, tokens, k)
                        for k in range(1, len(m.rel_diffs) + 1)]
        m.status = "pass" if all(d <= t for d, t in zip(m.rel_diffs, m.tolerances, strict=True)) else "fail"
    return LossReport(matches, nulls, comparisons)


def match_losses(records: dict[str, dict], configs: list[SweepConfig] | None = None) -> list[LossMatch]:
    """judge_losses' per-configuration results."""
    return judge_losses(records, configs).matches


def noise_growth(runs: dict[str, list[float]]) -> tuple[float, str, int]:
    """(largest d_k / (k - 1) over the non-reference runs and steps k >= 2, its run, its step)."""
    ref = runs["ref"]
    return max(((d / k, name, k + 1) for name, ls in runs.items() if name != "ref"
                for k, d in enumerate(rel_diffs(ls, ref)) if k >= 1), default=(0.0, "", 0))


def growth_check(runs: dict[str, list[float]], ref: list[float]) -> dict[str, float]:
    """The null model's growth law tested on a set of equivalent runs (distinct loss curves only):
    the log-linear fit (s_k ~ g^k) against a power law (s_k ~ (k - 1)^p, the linear growth the fallback
    assumes is p = 1), both with two parameters, by their maximum log-likelihoods."""
    distinct = {tuple(v): n for n, v in runs.items()}
    steps, draws = [], []
    for v in distinct:
        for k, dk in enumerate(rel_diffs(list(v), ref)[NULL_FIRST_STEP - 1:], start=NULL_FIRST_STEP):
            steps.append(k)
            draws.append(dk)
    d = np.array(draws)
    x_exp, x_pow = null_covariate(steps, "exponential"), null_covariate(steps, "power")
    a_exp, b_exp = halfnormal_fit(x_exp, d)
    a_pow, p_pow = halfnormal_fit(x_pow, d)
    return {"runs": len(distinct), "draws": len(d), "growth": math.exp(float(b_exp)), "power": float(p_pow),
            "loglik_exp": halfnormal_loglik(x_exp, d, float(a_exp), float(b_exp)),
            "loglik_pow": halfnormal_loglik(x_pow, d, float(a_pow), float(p_pow))}


def subset_check(diffs: dict[str, list[float]], runs: int, floor: float, law: str) -> tuple[int, int]:
    """The null's calibration on measured data: every `runs`-subset of the configurations' relative
    differences taken as the null, the others judged against it (FALSE_ALARM split over their later-step
    comparisons, the step-1 bound `floor` as everywhere). (subsets, subsets where one or more fail)."""
    import itertools
    steps = list(range(NULL_FIRST_STEP, min(len(v) for v in diffs.values()) + 1))
    d = np.array([v[NULL_FIRST_STEP - 1:len(steps) + NULL_FIRST_STEP - 1] for v in diffs.values()])
    x = null_covariate(steps, law)
    judged = len(diffs) - runs
    qs = pivot_quantiles(steps * runs, steps, FALSE_ALARM / (judged * len(steps)), law=law)
    q = np.array([qs[k][0] for k in steps])
    subsets = list(itertools.combinations(range(len(diffs)), runs))
    idx = np.array(subsets)
    log_s0, b = halfnormal_fit(np.tile(x, runs), d[idx].reshape(len(subsets), -1))
    tol = np.maximum(floor, q * np.exp(log_s0[:, None] + b[:, None] * x))  # subsets x steps
    out = np.ones((len(subsets), len(diffs)), dtype=bool)  # subsets x configurations: judged, not in the null
    out[np.arange(len(subsets))[:, None], idx] = False
    failing = ((d[None, :, :] > tol[:, None, :]).any(axis=2) & out).any(axis=1)
    return len(subsets), int(failing.sum())


def _planned_null_runs(reference: str) -> int:
    """How many null runs CONFIGS plans for `reference` (0 if it is not one of CONFIGS)."""
    ref = next((c for c in CONFIGS if c.name == reference), None)
    return len(null_runs_of(ref, CONFIGS)) if ref else 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _result(m: LossMatch) -> str:
    extra = [m.note] if m.note else []
    if m.rule == "CPU-noise fallback":
        extra.append("later steps by the CPU-noise fallback (no null)")
    return m.status + "".join("; " + e for e in extra)


def loss_doc(report: LossReport, command: str, noise: dict | None) -> str:
    """docs/loss_matching.md: the generated tables, the null, then the tolerance's derivation with its numbers."""
    matches = report.matches
    compared = [m for m in matches if m.status in ("pass", "fail")]
    passed = sum(m.status == "pass" for m in compared)
    by_null = sorted(model for model, n in report.nulls.items() if n.fitted)
    by_cpu = sorted(model for model, n in report.nulls.items() if not n.fitted)
    rules = "; ".join(([f"later steps judged by the null measured at scale for {', '.join(by_null)}"] if by_null else [])
                      + ([f"later steps judged by the CPU-noise fallback for {', '.join(by_cpu)} (no null runs)"]
                         if by_cpu else []))
    lines = ["# Losses under every plan against a one-GPU run", "",
             f"Command: `{command}` (CPU; the raw files come from the `measure` commands in "
             "benchmarks/trainer_sweep.py's docstring).", "",
             f"{passed} of {len(compared)} compared two-GPU configurations within the tolerance; "
             f"{len(matches) - len(compared)} not compared (reason in the table); {rules}. Relative difference: "
             "|loss / one-GPU loss - 1| at the same step; the tolerance grows with the step (derivation below).",
             "", "| configuration | one-GPU reference | steps | max rel. diff (step) | tolerance there | "
             "worst diff / tolerance | result |", "|---|---|---:|---:|---:|---:|---|"]
    for m in matches:
        if m.rel_diffs:
            k = max(range(len(m.rel_diffs)), key=lambda i: m.rel_diffs[i])
            lines.append(f"| {m.name} | {m.reference} | {len(m.rel_diffs)} | {m.rel_diffs[k]:.1e} ({k + 1}) | "
                         f"{m.tolerances[k]:.1e} | {m.worst_ratio:.2f} | {_result(m)} |")
        else:
            lines.append(f"| {m.name} | {m.reference or '-'} | - | - | - | - | {_result(m)} |")
    if compared:
        steps = max(len(m.rel_diffs) for m in compared)
        head = " | ".join(str(k + 1) for k in range(steps))
        lines += ["", "Relative difference per step (tolerance in the last row per model):", "",
                  f"| configuration | {head} |", "|---|" + "---:|" * steps]
        for m in compared:
            lines.append(f"| {m.name} | " + " | ".join(_fmt(d) for d in m.rel_diffs) + " |")
        for model in sorted({m.model for m in compared}):
            m = max((x for x in compared if x.model == model), key=lambda x: len(x.tolerances))
            lines.append(f"| *tolerance, {model}* | " + " | ".join(_fmt(t) for t in m.tolerances) + " |")
        lines += ["", "The two-GPU plans of one model against each other (largest |l_a / l_b - 1| over their pairs, "
                  "per step): when this spread is as large as the difference to the one-GPU run, the plans "
                  "drift apart from one another as much as from it (rounding noise the dynamics amplify), "
                  "not from a plan's arithmetic.", "", f"| model | plans | {head} |", "|---|---:|" + "---:|" * steps]
        for model in sorted({m.model for m in compared}):
            runs = [m.losses for m in compared if m.model == model]
            spread = [max((abs(a[k] / b[k] - 1) for a in runs for b in runs if len(a) > k and len(b) > k), default=0.0)
                      for k in range(steps)]
            lines.append(f"| {model} | {len(runs)} | " + " | ".join(_fmt(x) for x in spread) + " |")
        lines += ["", "Losses per step:", "", f"| configuration | {head} |", "|---|" + "---:|" * steps]
        shown: set[str] = set()
        for m in compared:
            if m.reference not in shown:
                shown.add(m.reference)
                lines.append(f"| **{m.reference}** | " + " | ".join(f"{x:.4f}" for x in m.reference_losses) + " |")
            lines.append(f"| {m.name} | " + " | ".join(f"{x:.4f}" for x in m.losses) + " |")
        lines += ["", *null_section(report, steps)]
    return "\n".join(lines) + "\n\n" + tolerance_section(report, noise) + "\n"


def _worst(diffs: dict[str, list[float]]) -> tuple[float, str, int]:
    """(largest relative difference at steps >= NULL_FIRST_STEP, whose, at which step)."""
    return max(((d, name, k) for name, ds in diffs.items()
                for k, d in enumerate(ds[NULL_FIRST_STEP - 1:], start=NULL_FIRST_STEP)), default=(0.0, "-", 0))


def null_section(report: LossReport, steps: int) -> list[str]:
    """The null runs per model: their differences per step, the fit, and the two-GPU plans' worst against
    the null's worst."""
    head = " | ".join(str(k + 1) for k in range(steps))
    lines = ["## The null: one-GPU runs equal to the reference in exact arithmetic", "",
             "Each reference's one-GPU equals (same model, global batch, sequence, init, batches and steps; other "
             "micro-batch splits, recompute, compiled kernels) against it: rounding alone, at the sweep's scale. "
             "Their relative differences at steps >= 2 are pooled into the fit of the tolerance (derivation below)."]
    for model, null in sorted(report.nulls.items()):
        plans = {m.name: m.rel_diffs for m in report.matches if m.model == model and m.status in ("pass", "fail")}
        pw, pname, pk = _worst(plans)
        lines.append("")
        if not null.fitted:
            lines.append(f"**{model}** (reference {null.reference}): {null.problem}"
                         + "".join(f"; {n}: {why}" for n, why in null.excluded.items())
                         + f". Its later steps are judged by the CPU-noise fallback. Worst two-GPU difference "
                         f"{pw:.1e} ({pname}, step {pk}); no null to set it against.")
            continue
        nw, nname, nk = _worst(null.runs)
        lines += [f"**{model}** (reference {null.reference}): {len(null.runs)} runs, {len(null.draws)} draws at "
                  f"steps {min(null.steps)}-{max(null.steps)}; fitted s_k = {null.formula}; false-alarm probability per comparison "
                  f"{null.alpha:.1e}, q_k {min(null.quantiles.values()):.2f} to {max(null.quantiles.values()):.2f}"
                  + "".join(f"; {n} is no draw: {why}" for n, why in null.excluded.items()) + ".", "",
                  f"| null run | {head} |", "|---|" + "---:|" * steps]
        for name, ds in null.runs.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(d) for d in ds) + " |")
        rms = []
        for k in range(1, steps + 1):
            at = [d for s, d in zip(null.steps, null.draws, strict=True) if s == k]
            rms.append(f"{math.sqrt(sum(d * d for d in at) / len(at)) / null.sd(k):.2f}" if at else "-")
        lines += ["| *fitted s_k* | " + " | ".join("-" if k < NULL_FIRST_STEP else _fmt(null.sd(k))
                                                  for k in range(1, steps + 1)) + " |",
                  "| *null RMS / fitted s_k* | " + " | ".join(rms) + " |",
                  "| *q_k* | " + " | ".join(f"{null.quantiles[k]:.2f}" if k in null.quantiles else "-"
                                           for k in range(1, steps + 1)) + " |", "",
                  f"Worst two-GPU difference {pw:.1e} ({pname}, step {pk}) against the null's worst {nw:.1e} "
                  f"({nname}, step {nk}): {pw / nw:.1f}x." if nw > 0 else "The null's differences are all zero."]
    return lines


def _growth_line(label: str, g: dict[str, float]) -> str:
    better = "exponential" if g["loglik_exp"] >= g["loglik_pow"] else "power law"
    return (f"{label}: {g['runs']} distinct runs, {g['draws']} draws; exponential growth {g['growth']:.2f}x a step, "
            f"power law exponent {g['power']:.2f}; log-likelihood exponential {g['loglik_exp']:.1f}, power law "
            f"{g['loglik_pow']:.1f} ({better} fits better, by {abs(g['loglik_exp'] - g['loglik_pow']):.1f}).")


def tolerance_section(report: LossReport, noise: dict | None) -> str:
    """The derivation, with the constants, the null's fits and the CPU experiment's numbers filled in."""
    rows = ["| model | d | V | L | logit rel. error | step-1 tolerance (16 x 2048 tokens) | later steps from | "
            "at step 2 | at step 9 |", "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for name in ("llama-1.3b", "gpt-350m", "moe-1.2b-8e"):
        spec = MODELS[name]
        d, vocab, layers = _shape(spec)
        floor = step1_rtol(spec, 16 * 2048)
        null = report.nulls.get(name)
        if null is not None and null.fitted and null.quantiles:
            rule = f"null ({len(null.runs)} runs)"
            at = [_fmt(null.tolerance(floor, k)) if k in null.quantiles else "-" for k in (2, 9)]
        else:
            rule = "CPU-noise fallback: " + (null.problem if null else "no plan compared")
            at = [_fmt(loss_rtol(spec, 16 * 2048, k)) for k in (2, 9)]
        rows.append(f"| {name} | {d} | {vocab} | {layers} | {logit_rel_error(layers):.3f} | {floor:.1e} | {rule} | "
                    f"{at[0]} | {at[1]} |")
    checks = []
    for model, null in sorted(report.nulls.items()):
        m0 = next(m for m in report.matches if m.model == model and m.reference_losses)
        plans = {m.name: m.losses for m in report.matches if m.model == model and m.status in ("pass", "fail")}
        if null.fitted:
            ref = m0.reference_losses
            runs = {n: [r * (1 + dd) for r, dd in zip(ref, ds, strict=False)] for n, ds in null.runs.items()}
            checks.append(_growth_line(f"{model} null", growth_check(runs, ref)))
        if len({tuple(v) for v in plans.values()}) >= 2:
            checks.append(_growth_line(f"{model} two-GPU plans (as if all null)", growth_check(plans, m0.reference_losses)))
        runs = len(null.runs) if null.fitted else _planned_null_runs(null.reference)
        diffs = {m.name: m.rel_diffs for m in report.matches if m.model == model and m.status in ("pass", "fail")}
        if runs and len(diffs) >= runs + 2:
            floor = step1_rtol(MODELS[model], 16 * 2048)
            res = {law: subset_check(diffs, runs, floor, law) for law in ("power", "exponential")}
            checks.append(f"{model} leave-out check: every {runs} of its {len(diffs)} two-GPU plans as the null, the "
                          f"other {len(diffs) - runs} judged: at least one fails in "
                          + ", ".join(f"{res[law][1]} of {res[law][0]} subsets under the {law} law" for law in res)
                          + f" (FALSE_ALARM = {FALSE_ALARM:g}).")
    exp = ""
    if noise is not None:
        runs = noise["runs"]["bf16"]
        growth, run, step = noise_growth(runs)
        first = max(rel_diffs(ls[:1], runs["ref"][:1])[0] for n, ls in runs.items() if n != "ref")
        spec = noise_model_spec()
        worst9 = max(max(rel_diffs(ls[:9], runs["ref"][:9])) for n, ls in runs.items() if n != "ref")
        exp = (f"The experiment (`python benchmarks/trainer_sweep.py noise`, {noise['model']} "
               f"{_shape(spec)}, {noise['rows']} rows x {noise['seq']} tokens, {len(runs['ref'])} steps, runs "
               f"{', '.join(n for n in runs if n != 'ref')} against a one-process `ref`; "
               "benchmarks/results/loss_noise_cpu.json): step-1 difference at most "
               f"{first:.1e} (its step-1 bound: {step1_rtol(spec, noise['rows'] * noise['seq']):.1e}); largest "
               f"difference over the first 9 steps {worst9:.1e}; largest growth d_k / (k - 1) {growth:.2e} "
               f"({run}, step {step}), rounded up to NOISE_GROWTH_CPU = {NOISE_GROWTH_CPU:.1e}.")
        if "fp32" in noise["runs"]:
            f32 = noise["runs"]["fp32"]
            worst = max(max(rel_diffs(ls, f32["ref"])) for n, ls in f32.items() if n != "ref")
            exp += (f" The same runs in fp32 differ by at most {worst:.1e} over all steps: the bf16 differences "
                    "are rounding, not a plan's arithmetic.")
        others = {n: ls for n, ls in runs.items() if n != "ref"}
        checks.append(_growth_line("CPU `noise` experiment (bf16, steps 2-" + str(len(runs["ref"])) + ")",
                                   growth_check(others, runs["ref"])))
    return TOLERANCE_DOC.format(u=BF16_UNIT_ROUNDOFF, delta=STEP1_DELTA, growth=NOISE_GROWTH_CPU,
                                margin=SCALE_MARGIN, per_step=LOSS_GROWTH_PER_STEP, table="\n".join(rows),
                                alpha=FALSE_ALARM, comparisons=report.comparisons,
                                alpha_c=_fmt(FALSE_ALARM / report.comparisons) if report.comparisons else "-",
                                draws=NULL_MC_DRAWS, seed=NULL_MC_SEED, se=NULL_MC_SE, law=NULL_LAW,
                                checks="\n".join(f"- {c}" for c in checks) or "(no runs to check)",
                                experiment=exp or "(no noise results: run `noise`)")


TOLERANCE_DOC = """## The tolerance (hand-written derivation; numbers from the code's constants and the fits)

The plans compute the same mathematics from the same weights (every configuration of a model starts from
`init_weights(seed=0)`, handed to the trainer as a materialized model, records say `"init": "seed0"`) on
the same batches (4 random-token batches from `torch.Generator().manual_seed(0)`, cycled; 3 warm-up + 6
timed steps, all 9 losses compared). What differs is rounding: every run is FSDP2 mixed precision (one GPU
included: a one-process group), so parameters, activations and the residual stream are bf16 (unit roundoff
u = 2^-8 = {u:.2e}), matmuls accumulate in fp32, gradients are reduced in fp32; tp and dp change fp32
summation orders (negligible against bf16), micro-batching changes which rows share a kernel, compiled
kernels fuse and round elementwise chains differently. The reference is the one-GPU eager configuration of
the same model, global batch and sequence length.

**Step 1** (forward-only rounding: the first loss is computed before any update). A token's cross entropy
logsumexp(z) - z_y has gradient p - e_y, whose l1 norm is at most 2, so it moves by at most
2 max_i |dz_i|. Each plan's logit carries the head's bf16 rounding plus the rounding of the bf16 residual
stream, two additions per block, which accumulate as a random walk (probabilistic rounding-error analysis,
Higham and Mary 2019): relative error sqrt(1 + 2L) u per plan, twice that between two plans (eps). At the
shared init the final norm's output has squared norm d and the head's weights are N(0, 0.02^2), so the
logits are N(0, sigma^2 = 0.02^2 d), their maximum over the vocabulary is z_max = sqrt(2 ln V) sigma and the
loss is L0 = ln V + sigma^2 / 2 (10.78 for the llama, 11.03 for the GPT, 10.58 for the MoE: what every run
measured at step 1). A token's loss thus moves by at most B = 2 eps z_max. Rounding errors of different
tokens (different values rounded) are taken as independent, so the mean over N tokens is within B sqrt(2 ln(2 / delta) / N) except with
probability delta = {delta:g} (Hoeffding); relative: divided by L0. Summing B over the tokens instead (all
errors aligned) would be 180 times looser at N = 16 x 2048 (0.2 for the llama: nothing would fail).
Step 1 alone does not tell two inits apart (different seeds gave step-1 losses up to 1.4e-3 apart in the
earlier sweeps); the later steps do (below). The step-1 bound is the tolerance's floor at every step
(forward rounding does not shrink after step 1); where the null's band is narrower (the first few later
steps), the floor is what a plan is held to, and a difference smaller than it goes unseen there.

**Later steps: the null, measured at scale.** After step 1 the weights differ, and AdamW divides each
gradient by its running RMS: a parameter whose gradient is at the rounding-noise level gets an update of
order lr = 3e-4 whose sign is noise. The differences then grow chaotically; the only a-priori bound (every
update's sign random) is twice the loss's progress, which tests nothing. The later-step tolerance is
therefore measured: each reference has one-GPU runs equal to it in exact arithmetic (other micro-batch
splits, full recompute, compiled kernels; same init, batches and steps: `null_runs_of`), whose relative
differences from it are draws of rounding-only divergence at the sweep's own scale, kernels and hardware:
the null.

- Model: a null run's relative difference at step k is |e_k|, e_k ~ N(0, s_k^2), log s_k = log s0 + b x_k,
  draws of different runs and steps independent. The growth law (NULL_LAW = "{law}") is the power law
  x_k = ln(k - 1), s_k = s_2 (k - 1)^p, or the exponential x_k = k - 1, s_k = s_1 g^(k - 1), what chaotic
  divergence does asymptotically; the data pick the power law ("Which growth law?" below). A run whose
  losses equal the reference's or another run's exactly is the same arithmetic, no extra draw.
- Fit: the few runs per model are pooled; (s0, b) by maximum likelihood over all their draws at steps
  k >= 2 (step 1 is forward-only rounding with its own bound; there the runs differ by an fp32 ulp or not
  at all). A zero draw (losses equal to fp32 resolution) carries no weight, as in the likelihood.
- Tolerance at step k: q_k s^_k, s^_k the fitted sd. The fit's sampling error is accounted for exactly
  under the model: for a new draw, |e_k| / s^_k is a pivot (its law does not depend on the unknown s0 and
  b, only on the steps the null drew: the fit is equivariant under scaling and tilting), the role
  Student's t plays for one scale estimated from n draws (here the growth is estimated too). Its tail is
  computed by conditional Monte Carlo: {draws} simulated null fits (seed {seed}); given a fit, a new draw
  exceeds q s^_k with probability erfc(q R / sqrt 2), R = s^_k / s_k; the average over fits plus {se:g}
  Monte Carlo standard errors is set equal to alpha_c and solved for q_k. q_k is larger at the ends of
  the step range, where the fitted growth extrapolates most, as a regression's prediction band widens.
- False alarms: FALSE_ALARM = {alpha:g} is the probability that a sweep whose plans are rounding-only
  fails at least one of its M = {comparisons} later-step comparisons (plans x steps >= 2 of the models with
  a null), split evenly: alpha_c = {alpha_c} per comparison (Bonferroni, valid whatever their dependence;
  they share one fit per model). Step 1 adds at most delta per plan.

tolerance(step 1) = step-1 bound;  tolerance(step k >= 2) = max(step-1 bound, q_k s^_k)

{table}

**Which growth law?** Exponential growth (chaotic divergence) against a power law s_k ~ (k - 1)^p (p = 1
is the linear growth the fallback assumes), both two parameters, by maximum log-likelihood, on the null
runs, on the two-GPU plans as if they were all rounding-only, and on the CPU `noise` runs; then the
calibration on measured data: each subset of the two-GPU plans, as many as the reference has null runs,
taken as the null and the other plans judged (meaningful if the plans are rounding-only, the premise
the spread among them supports); a calibrated law fails at least one in about FALSE_ALARM of the subsets.
Steps differ in how much they amplify the difference beyond any smooth law (the null RMS / fitted s_k rows
above: the batches cycle with period 4, and the same step's sensitivity is shared by every run and plan),
so a law that misses a step's level raises the false alarms there; the leave-out check measures that.
NULL_LAW was set from the committed two-GPU plans before any null run existed, so the null's own fit and
calibration are not conditioned on a choice made from the null.

{checks}

**Fallback (a model without null runs in the raw files).** Its later steps keep the rule from before the
null existed: the growth per step of an experiment on rounding-order noise, not the GPU plans: the same
trainer, precision (FSDP2 bf16 in a gloo group), optimizer, init and data regime at small scale on CPU,
equivalent plans against a one-process run. {experiment} That rule adds SCALE_MARGIN x NOISE_GROWTH_CPU =
{margin:g} x {growth:.1e} = {per_step:.1e} per step after the first; the margin covers the transfer to 1B
parameters and is a judgement, not derived (which is why the null replaces it wherever it exists):
tolerance(step k) = step-1 bound + (k - 1) x {per_step:.1e}.

**Caveats.** The null model takes the draws of different runs and steps as independent; the batches cycle
with period 4, so a step's sensitivity to rounding is shared by every run at that step (the null RMS / fitted
s_k row shows how far single steps sit from the line), and it is shared by the plans compared at that step
too. The MoE's top-2 routing is discontinuous: a rounding difference can send a token whose two best
experts nearly tie to the other one, a change not covered by the smooth step-1 bound (rare at step 1; later
it is part of the chaotic growth the null measures). A configuration that fails is a finding to look at,
not a reason to widen the tolerance: a wrong shard or a missing gradient reduction moves the loss by far
more (tests/test_loss_matching.py: a loss 1% off fails the null band). A different start: the earlier
sweep's twelve two-GPU llama records (benchmarks/results/raw/trainer_sweep_dist_final.jsonl, each from its
own per-run init), compared as if they shared the reference's, all fail the CPU-noise fallback (up to 2%
apart by step 8); against a null as wide as the sixteen committed two-GPU llama plans' spread (those plans
standing in as null runs, tests/test_loss_matching.py) eleven fail and the twelfth (tp2sp) stays within
0.9 of the band: against a null that wide, a different init is not always seen in 9 steps.
"""


# ============================================================================ noise (CPU)
# Rounding-order noise of mathematically equivalent runs at small scale, in the precision the sweep runs:
# AutoParallelTrainer in a gloo process group (1 or 2 processes), so FSDP2 mixed precision as on the GPUs
# (bf16 parameters and activations, fp32 gradient reduction), the default AdamW(lr=3e-4), 4 random-token
# batches cycled, every plan from the same init_weights(seed=0). Differences between its runs are rounding
# alone: it characterises the mechanism (and checks the null's growth law, docs/loss_matching.md); `losses`
# takes the later-step tolerance from it only for a model without null runs at scale (NOISE_GROWTH_CPU).
NOISE_ROWS, NOISE_SEQ = 8, 128
NOISE_STEPS = 20
# name -> (processes, planner pins); "ref" is the one-process reference every other run is compared with
NOISE_RUNS: dict[str, tuple[int, dict[str, Any]]] = {
    "ref": (1, {"micro_batch": 8}),
    "mb2x4": (1, {"micro_batch": 2}),
    "dp2-zero2": (2, {"dp": 2, "zero": 2, "micro_batch": 4}),
    "dp2-zero3-mb2x2": (2, {"dp": 2, "zero": 3, "micro_batch": 2}),
    "tp2": (2, {"tp": 2, "micro_batch": 8}),  # (the planner refuses sp at this width)
    "pp2": (2, {"pp": 2, "vpp": 1, "micro_batch": 2}),
}


def noise_model_spec() -> dict[str, Any]:
    from autoparallel.calibrate_trainer import TINY_LLAMA
    return TINY_LLAMA


def noise_run(name: str, world: int, pins: dict[str, Any], steps: int, precision: str = "bf16") -> list[float]:
    """One run of the experiment inside an initialized process group of `world` processes: per-step losses."""
    import dataclasses

    import torch

    from autoparallel import AutoParallelTrainer
    from autoparallel.api import plan_model
    from autoparallel.models import build_model, load_model_spec
    spec = noise_model_spec()
    with torch.device("meta"):
        model = build_model(load_model_spec(spec))
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(seed=SHARED_INIT_SEED)
    plan = plan_model(model, hardware=PROFILE, gpus=world, gpus_per_node=world, global_batch=NOISE_ROWS,
                      seq_len=NOISE_SEQ, max_memory_per_gpu=BUDGET, fix={**pins, "compile": 0})
    plan = dataclasses.replace(plan, param_dtype=precision, grad_reduce_dtype="fp32")
    trainer = AutoParallelTrainer(model, optimizer=None, plan=plan)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, spec["vocab_size"], (NOISE_ROWS, NOISE_SEQ + 1), generator=gen) for _ in range(4)]
    return [trainer.step(batches[i % len(batches)]) for i in range(steps)]


def _noise_worker(rank: int, world: int, port: int, out: str, runs: dict[str, dict[str, Any]], steps: int,
                  precision: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    for name, pins in runs.items():
        losses = noise_run(name, world, pins, steps, precision)
        if rank == 0:
            (Path(out) / f"{name}.json").write_text(json.dumps(losses))
        gc.collect()  # the run's trainer (FSDP2 / DTensor state over the group) goes before the next
        # every rank done with the group before any tears it down: a rank that destroyed it while the
        # other still had gloo work in flight aborted the process ("terminate called without an active
        # exception"), once in a CI run of tests/test_loss_matching.py; tests/trainer_helpers.worker waits too
        dist.barrier()
    dist.destroy_process_group()


def noise_losses(runs: dict[str, tuple[int, dict[str, Any]]], steps: int, precision: str = "bf16"
                 ) -> dict[str, list[float]]:
    """Per-step losses of each run (spawned gloo groups, one per world size)."""
    import socket
    import tempfile

    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        for world in sorted({w for w, _ in runs.values()}):
            group = {n: pins for n, (w, pins) in runs.items() if w == world}
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            # forkserver: ranks fork from a server that has imported torch once (in the test suite, the one
            # tests/trainer_helpers.run_spawned started with the trainer preloaded), not a fresh interpreter each
            mp.start_processes(_noise_worker, args=(world, port, tmp, group, steps, precision), nprocs=world,
                               start_method="forkserver")
        return {n: json.loads((Path(tmp) / f"{n}.json").read_text()) for n in runs}


def cmd_noise(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"model": noise_model_spec()["name"], "rows": NOISE_ROWS, "seq": NOISE_SEQ, "runs": {}}
    for precision in args.precision:
        t = time.perf_counter()
        losses = noise_losses(NOISE_RUNS, args.steps, precision)
        ref = losses["ref"]
        out["runs"][precision] = losses
        print(f"{precision}: {time.perf_counter() - t:.0f} s; ref losses " + " ".join(f"{x:.4f}" for x in ref))
        for name, ls in losses.items():
            if name != "ref":
                print(f"  {name:18s} |rel diff| per step: " + " ".join(f"{d:.1e}" for d in rel_diffs(ls, ref)))
        growth, run, step = noise_growth(losses)
        print(f"  largest growth d_k / (k - 1): {growth:.2e} ({run}, step {step})")
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


def cmd_losses(args: argparse.Namespace) -> int:
    report = judge_losses(_measured(args.raw))
    noise = json.loads(NOISE_RESULTS.read_text()) if NOISE_RESULTS.exists() else None
    command = "python benchmarks/trainer_sweep.py losses --raw " + " ".join(_rel(r) for r in args.raw)
    Path(args.output).write_text(loss_doc(report, command, noise))
    for model, null in sorted(report.nulls.items()):
        print(f"{model}: " + (f"null of {len(null.runs)} runs, s_k = {null.formula}" if null.fitted
                              else f"CPU-noise fallback ({null.problem})"))
    matches = report.matches
    for m in matches:
        print(f"{m.name:28s} {m.status:14s} max rel diff {_fmt(m.max_rel_diff)}  vs {m.reference}")
    print(f"wrote {args.output}")
    return 0 if all(m.status != "fail" for m in matches) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plans")
    p.add_argument("--only", default=None)
    m = sub.add_parser("measure")
    m.add_argument("--gpus", type=int, required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--only", default=None)
    m.add_argument("--skip", default=None, help="comma-separated configurations to leave out")
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--steps", type=int, default=8)
    m.add_argument("--passes", type=int, default=1, help="passes over the selection (the report takes medians)")
    m.add_argument("--profile", action="store_true", help="profile one step of the configurations marked so")
    m.add_argument("--profile-all", action="store_true", help="profile one step of every configuration")
    m.add_argument("--host-ticks", action="store_true",
                   help="time the host's dispatch (host_tick) before and after each configuration")
    m.add_argument("--host-probes", action="store_true",
                   help="time the speed probes (HostProbes, built once) before and after each configuration")
    m.add_argument("--interleave-probes", action="store_true",
                   help="with --host-probes: also one step of each probe before each timed step (its median "
                        "over the steps: host_probes_ms 'steps')")
    m.add_argument("--isolate", action="store_true",
                   help="one fresh process per configuration and pass (one GPU), as users run one trainer")
    m.add_argument("--pass-index", type=int, default=None, help=argparse.SUPPRESS)  # set by --isolate for its children
    rp = sub.add_parser("repeats", help="CPU: configurations measured more than once, against the prediction")
    rp.add_argument("--raw", nargs="+", required=True)
    rp.add_argument("--profile", required=True)
    rp.add_argument("--doc", default=None)
    ht = sub.add_parser("host-tick", help="GPU: append one host_tick record (beside the speed probes)")
    ht.add_argument("--out", required=True)
    ht.add_argument("--label", required=True)
    pr = sub.add_parser("predict", help="CPU: the shipped profile's predictions of plan files, before their run")
    pr.add_argument("--only", required=True, help="comma-separated configuration names")
    pr.add_argument("--out", required=True)
    pr.add_argument("--profile", default=PROFILE, help="the shipped profile to predict with (default: %(default)s; "
                    "h100-sxm for a run on an H100)")
    r = sub.add_parser("report")
    r.add_argument("--raw", nargs="+", required=True)
    r.add_argument("--profile", default=str(FITTED_PROFILE), help="the profile `fit` wrote (default: %(default)s)")
    r.add_argument("--doc", default=str(DOC), help="the report (default: %(default)s)")
    r.add_argument("--results", default=str(RESULTS), help="the pairs as JSON (default: %(default)s)")
    r.add_argument("--calibration", action="append", metavar="KEY=NUMBER",
                   help="a what-if: replace this calibration entry of the profile (repeatable)")
    r.add_argument("--row-speed", nargs="?", const="before,after", default=None, metavar="SIDES",
                   help="--profile is the base (h200): each row's host terms rescaled by the speed probes timed "
                        "around it (measure --host-probes; row_speed): 'before,after' (the default) or 'steps' "
                        "(--interleave-probes)")
    sh = sub.add_parser("ship", help="write fit's terms into hardware_profiles/h200.yaml")
    sh.add_argument("--profile", default=str(FITTED_PROFILE))
    f = sub.add_parser("fit")
    f.add_argument("--raw", nargs="+", required=True)
    f.add_argument("--probes", nargs="+", required=True, help="`autoparallel calibrate --trainer --raw` files")
    f.add_argument("--output", default=str(FITTED_PROFILE))
    nz = sub.add_parser("noise", help="CPU: rounding-order noise of equivalent runs (loss tolerance)")
    nz.add_argument("--steps", type=int, default=NOISE_STEPS)
    nz.add_argument("--precision", nargs="+", default=["bf16", "fp32"])
    nz.add_argument("--output", default=str(NOISE_RESULTS))
    ur = sub.add_parser("update-rates", help="CPU: the AdamW and FSDP copy rates of profiled steps -> docs")
    ur.add_argument("--raw", nargs="+", required=True, help="measure --profile-all files")
    ur.add_argument("--profile", default=PROFILE)
    lo = sub.add_parser("losses", help="CPU: two-GPU losses against the one-GPU references -> docs/loss_matching.md")
    lo.add_argument("--raw", nargs="+", required=True)
    lo.add_argument("--output", default=str(LOSS_DOC))
    args = ap.parse_args(argv)
    return {"plans": cmd_plans, "measure": cmd_measure, "predict": cmd_predict, "report": cmd_report, "fit": cmd_fit,
            "ship": cmd_ship, "noise": cmd_noise, "losses": cmd_losses,
            "update-rates": cmd_update_rates, "host-tick": cmd_host_tick,
            "repeats": cmd_repeats}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
