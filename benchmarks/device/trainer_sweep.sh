#!/usr/bin/env bash
# The trainer sweep of record on a lent two-H200 machine (device tool), in two calls of <= 10 minutes
# on the same machine (the host terms describe its CPU):
#   bash benchmarks/device/trainer_sweep.sh probes-single   # host probes (1 and 2 GPUs) + the 1-GPU sweep
#   bash benchmarks/device/trainer_sweep.sh dist            # the 2-GPU sweep (1.3B, 350M GPT, MoE; 7B alone)
#   bash benchmarks/device/trainer_sweep.sh rescale-single  # one GPU: the shipped profile rescaled to this machine
#                                                           # (calibrate --trainer --rescale), the sweep without the
#                                                           # 7B, then the full one-GPU probes to compare
#   bash benchmarks/device/trainer_sweep.sh single-check-h100  # the one-GPU sweep on an H100, shipped h100-sxm
#   bash benchmarks/device/trainer_sweep.sh hf-h100         # an H100's kernel families, then Hugging Face rows
#   bash benchmarks/device/trainer_sweep.sh picks-h100      # the planner's picks on an H100 and their alternatives
#   bash benchmarks/device/trainer_sweep.sh rescale-drift   # the same, but --rescale again after the sweep
#                                                           # (speed_after.jsonl: how far the VM drifted)
#   bash benchmarks/device/trainer_sweep.sh dist-rescale    # two GPUs: the shipped profile rescaled to this machine,
#                                                           # then the 2-GPU sweep without the 7B (the next one,
#                                                           # s116, predicted before it ran by the model as of
#                                                           # 2026-12-04: trainer_sweep_predicted_s116_dist.json)
#   bash benchmarks/device/trainer_sweep.sh moe             # the MoE rows only (1 GPU; with two GPUs also 2-GPU),
#                                                           # after the expert-unit change, and one compiled timeline
#   bash benchmarks/device/trainer_sweep.sh attention-drift # causal SDPA timed two ways across shapes
#                                                           # (attention_timing.py), then rescale-drift
#   bash benchmarks/device/trainer_sweep.sh wide            # one GPU: host factor, Llama 3 8B's widths at seq 8192
#                                                           # (the WIDE rows), then two host-paced timelines
#   bash benchmarks/device/trainer_sweep.sh families        # one GPU: host factor, Qwen3, Qwen2.5 and Qwen3-MoE
#                                                           # rows (the FAMILIES: model families no fit saw)
#   bash benchmarks/device/trainer_sweep.sh families2       # one GPU: host factor, Mixtral, Qwen1.5-MoE and GPT-2 XL
#                                                           # rows (FAMILIES2), the host factor again after them
#   bash benchmarks/device/trainer_sweep.sh families3       # one GPU: host factor, Phi-3-mini, Gemma 2B and Pythia
#                                                           # 1.4B as Hugging Face builds them (FAMILIES3), one
#                                                           # profiled step each, the host factor again after them
#   bash benchmarks/device/trainer_sweep.sh families4       # one GPU: the same for OLMo 2 1B and Granite 3.0 2B
#                                                           # (FAMILIES4)
#   bash benchmarks/device/trainer_sweep.sh families5       # one GPU: the same for Llama 3.2 1B and StableLM 2 1.6B
#                                                           # (FAMILIES5)
#   bash benchmarks/device/trainer_sweep.sh selective-hf    # one GPU: "selective" on four Hugging Face families
#                                                           # (SELECTIVE_HF: per-op checkpointing in the trainer)
#   bash benchmarks/device/trainer_sweep.sh families6       # one GPU: the same for Gemma 3 1B, GPT-J 6B's widths and
#                                                           # DeepSeek-V2-Lite's layers (FAMILIES6: planned from their
#                                                           # configs as transformers builds them)
#   bash benchmarks/device/trainer_sweep.sh families6b      # the rows of families6 that did not run: GPT-J with eager
#                                                           # attention, Gemma 3 under full recompute (after its fix)
#   bash benchmarks/device/trainer_sweep.sh families7       # one GPU: CodeGen 2B's and Phi-2's widths (FAMILIES7), held
#                                                           # out from the fp32-GEMM class
#   bash benchmarks/device/trainer_sweep.sh families10      # one GPU: StarCoder2 3B and an Arcee AFM-style model
#                                                           # (FAMILIES10), held out, predicted before the run;
#                                                           # families10-fsdp: then timelines at 2048 and 64 tokens
#   bash benchmarks/device/trainer_sweep.sh families11      # one GPU: Falcon 7B's, Aya Expanse 8B's and OLMoE's widths
#                                                           # (FAMILIES11), held out, predicted before the run with
#                                                           # compiled blocks priced by their fused bytes;
#                                                           # families12: Apertus 8B's, Granite 3.0 1B-A400M and
#                                                           # GLM-4 9B's widths (FAMILIES12), likewise;
#                                                           # families13: Gemma 2 2B (eager attention), EXAONE 4.0
#                                                           # 1.2B and ERNIE 4.5 21B-A3B's widths (FAMILIES13);
#                                                           # families14: Helium 1 2B, Phi-3.5-MoE's and Seed-OSS
#                                                           # 36B's widths (FAMILIES14), a per-op row each
#   bash benchmarks/device/trainer_sweep.sh families15      # Persimmon 8B's, BitNet b1.58 2B4T's and GLM-4.5-Air's
#                                                           # widths (FAMILIES15)
#   bash benchmarks/device/trainer_sweep.sh families16      # DiffLlama's, nanochat d20 and Llama 4 Scout's widths
#                                                           # (FAMILIES16)
#   bash benchmarks/device/trainer_sweep.sh families17      # gpt-oss-20b's, Gemma 3 1B's at 2048 tokens and Command
#                                                           # R7B's at 8192, each beyond its sliding window (FAMILIES17)
#   bash benchmarks/device/trainer_sweep.sh families18      # Mistral 7B's and OLMo 3 7B's at 8192 tokens, Gemma 3 4B's
#                                                           # at 4096, each beyond its window (FAMILIES18)
#   bash benchmarks/device/trainer_sweep.sh padded          # Apertus 8B's (8192), SmolLM3 3B and Llama 3.2 1B (4096)
#                                                           # on batches with padding, planned as padded (PADDED)
#   bash benchmarks/device/trainer_sweep.sh families19      # GPT-Neo 1.3B (local attention beyond its window), BioGPT
#                                                           # and InternLM3 8B's widths at 4096 (FAMILIES19)
#   bash benchmarks/device/trainer_sweep.sh families19b     # OLMo 7B's widths at 4096 (FAMILIES19B)
#   bash benchmarks/device/trainer_sweep.sh families20      # GPT-NeoX Japanese 2.7B (eager attention), FlexOlmo
#                                                           # 7x7B's widths and MiniMax's lightning attention (FAMILIES20)
#   bash benchmarks/device/trainer_sweep.sh families20b     # MiniMax's three rows again, its buffers now bf16 (FAMILIES20B)
#   bash benchmarks/device/trainer_sweep.sh families21      # those, GraniteMoeShared 1B and Ministral 3 3B's widths
#   bash benchmarks/device/trainer_sweep.sh families22      # VaultGemma 1B's (eager attention, soft-capping), Doge
#                                                           # (dynamic mask attention), GLM-4 9B's widths (FAMILIES22)
#   bash benchmarks/device/trainer_sweep.sh families23a     # Moonlight 16B-A3B's widths (DeepSeek V3), GLM-4.7-Flash's
#   bash benchmarks/device/trainer_sweep.sh families23b     # MiniCPM3 4B's, DeepSeek V3.2's first layers (sparse attention)
#   bash benchmarks/device/trainer_sweep.sh families24      # Gemma 4's text layout (12 layers, beyond its window)
#   bash benchmarks/device/trainer_sweep.sh families24b     # Gemma 4's MoE block (6 layers, widths chosen here)
#   bash benchmarks/device/trainer_sweep.sh families25      # LFM2 1.2B (short-convolution hybrid, all 16 layers)
#   bash benchmarks/device/trainer_sweep.sh families26      # LFM2-MoE (8 layers), dots1's first two layers
#   bash benchmarks/device/trainer_sweep.sh families27a     # Nemotron-Mini-4B's and Hunyuan-7B's widths (FAMILIES27A)
#   bash benchmarks/device/trainer_sweep.sh families27b     # ERNIE 4.5 0.3B, Qwen3-Next's layout (FAMILIES27B)
#   bash benchmarks/device/trainer_sweep.sh families28      # host_op_kinds.py, then StableLM-3B's, Gemma 7B's widths
#                                                           # and SmolLM2-360M (FAMILIES28)
#   bash benchmarks/device/trainer_sweep.sh families29      # Phi-4-mini's and Mistral-NeMo's widths (FAMILIES29)
#   bash benchmarks/device/trainer_sweep.sh families30      # AFMoE (Trinity-Mini's layout), Jais 2's widths
#   bash benchmarks/device/trainer_sweep.sh families31      # Laguna (256 experts of 512), CWM 32B's widths at 16384
#   bash benchmarks/device/trainer_sweep.sh families32      # Youtu-LLM 2B whole, EXAONE MoE's widths at 8192, Mellum's
#                                                           # (FAMILIES32); families33: GPT-1 whole, Qwen3.5's text
#                                                           # model (8 layers at 4096) and the planner's own picks of
#                                                           # both (FAMILIES33); NAME=... ROWS=... families-rest: the
#                                                           # rows a first call's time limit left
#   bash benchmarks/device/trainer_sweep.sh families34      # Solar Open (2 layers) and MiniMax-M2 (1 layer) at their
#                                                           # widths and 4096 tokens, with the planner's picks
#   bash benchmarks/device/trainer_sweep.sh families35      # DBRX (1 layer at 4096) once the tracer ran its loop
#   bash benchmarks/device/trainer_sweep.sh families36      # BLOOM-1b7 whole and MPT-7B's widths (8 layers), ALiBi
#   bash benchmarks/device/trainer_sweep.sh clip38          # gradient clipping beside the same plans without it (CLIP38;
#                                                           # on nvidia-h200-x2 the two-GPU pairs too, CLIP38_DIST)
#   bash benchmarks/device/trainer_sweep.sh full-timelines  # compute-stream idle of MoE and dense rows, eager and full
#   bash benchmarks/device/trainer_sweep.sh carry-check     # twelve full-recompute and MoE rows after the forward's
#                                                           # carried lead (CARRY_CHECK), predicted before the run
#   bash benchmarks/device/trainer_sweep.sh alloc-aba       # four host-paced rows: default allocator, expandable
#                                                           # segments, default again (ALLOC_ROWS)
#   bash benchmarks/device/trainer_sweep.sh replay-host     # host_mix with no recompute, full, none again (dense and
#                                                           # MoE blocks), index_backward.py in bf16 and fp32
#   bash benchmarks/device/trainer_sweep.sh single-probed-a # the one-GPU sweep's first 15 rows, the speed probes
#                                                           # timed around each (single-probed-b: the other 15)
#   bash benchmarks/device/trainer_sweep.sh host-mix        # one GPU: host factor, then the host time per block of the
#                                                           # sweep's families at 32 tokens a row (host_mix.py;
#                                                           # host-mix-compiled: six of them compiled)
#   bash benchmarks/device/trainer_sweep.sh compiled-launches # one GPU: kernels each compiled block launches per
#                                                           # phase against its host time (host_mix --launches at 32
#                                                           # tokens a row); compiled-launch-rows: the compiled sweep
#                                                           # rows' launches at their own sizes (profiled); launch-rate:
#                                                           # host per kernel a compiled graph launches, then the rows
#   bash benchmarks/device/trainer_sweep.sh graph-breaks    # one GPU: Dynamo's graph breaks in BREAK_ROWS, named
#   bash benchmarks/device/trainer_sweep.sh moe-compiled    # one GPU: the catalog MoEs' compiled rows, held out
#   bash benchmarks/device/trainer_sweep.sh compiled-check  # one GPU: five host-paced compiled rows, held out
#   bash benchmarks/device/trainer_sweep.sh compiled-hf     # one GPU: seven compiled rows of earlier families, held out
#                                                           # from the compiled host floor of one call a phase
#   bash benchmarks/device/trainer_sweep.sh timeline        # one GPU: this VM's host factor, then the step
#                                                           # timelines of host-paced and compiled MoE rows
#                                                           # (profile_timeline.py; the compiled MoE's whole traces)
# Results land in $OUT; `python benchmarks/trainer_sweep.py fit/report` turn them into the docs on any CPU.
source "$(dirname "$0")/env.sh"
WIDE=1g-l3w-op,1g-l3w-op-compiled,1g-l3w-none,1g-l3w-compiled,1g-l3w-full-mb1
FAMILIES=1g-qwen3-eager,1g-qwen3-compiled,1g-qwen3-mb2x2-op,1g-qwen25-eager,1g-qwen25-compiled,1g-qwen3moe-eager
FAMILIES=$FAMILIES,1g-qwen3moe-compiled,1g-qwen3moe-full
FAMILIES2=1g-mixtral-eager,1g-mixtral-compiled,1g-mixtral-mb2x2-op,1g-qwen15moe-eager,1g-qwen15moe-compiled
FAMILIES2=$FAMILIES2,1g-gpt2xl-eager,1g-gpt2xl-compiled,1g-gpt2xl-mb8x2-full
FAMILIES3=1g-phi3-eager,1g-phi3-compiled,1g-phi3-mb2x2-op,1g-gemma-mb4x2,1g-gemma-mb4x2-compiled,1g-pythia-eager
FAMILIES3=$FAMILIES3,1g-pythia-compiled,1g-pythia-mb4x2-full
FAMILIES4=1g-olmo2-eager,1g-olmo2-compiled,1g-olmo2-mb4x2-op,1g-granite-eager,1g-granite-compiled,1g-granite-mb4x2-full
SKIP_SINGLE=1g-llama7b-b8,1g-llama7b-b8-mb2x4,1g-llama7b-b8-compiled,1g-llama7b-b8-mb2x4-compiled,$WIDE,$FAMILIES,$FAMILIES2
FAMILIES5=1g-llama32-eager,1g-llama32-compiled,1g-llama32-mb4x2-sel,1g-stablelm-eager,1g-stablelm-compiled
FAMILIES5=$FAMILIES5,1g-stablelm-mb2x4-full
SELECTIVE_HF=1g-stablelm-mb4x2-sel,1g-olmo2-mb4x2-sel,1g-pythia-mb4x2-sel,1g-granite-mb8-sel
FAMILIES6=1g-gemma3-eager,1g-gemma3-compiled,1g-gemma3-mb4x8-full,1g-gptj-eager,1g-gptj-compiled,1g-gptj-mb2x4-op
FAMILIES6=$FAMILIES6,1g-dsv2-eager,1g-dsv2-compiled,1g-dsv2-mb2x4-full
FAMILIES7=1g-codegen-eager,1g-codegen-compiled,1g-codegen-mb4x2-full,1g-phi2-eager,1g-phi2-compiled,1g-phi2-mb2x4-op
FAMILIES8=1g-opt-eager,1g-opt-compiled,1g-opt-mb2x4-op,1g-bigcode-eager,1g-bigcode-compiled,1g-bigcode-mb4x2-full
FAMILIES9=1g-olmo3-eager,1g-olmo3-compiled,1g-olmo3-mb2x4-op,1g-smollm3-eager,1g-smollm3-compiled,1g-smollm3-mb2x4-full
FAMILIES10=1g-starcoder2-eager,1g-starcoder2-compiled,1g-starcoder2-mb2x4-full,1g-arcee-eager,1g-arcee-compiled
FAMILIES10=$FAMILIES10,1g-arcee-mb2x4-op
FAMILIES11=1g-falcon-eager,1g-falcon-compiled,1g-falcon-mb2x4-op,1g-aya-eager,1g-aya-compiled,1g-aya-mb2x4-full
FAMILIES11=$FAMILIES11,1g-olmoe-eager,1g-olmoe-compiled,1g-olmoe-mb4x2-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES3,$FAMILIES4,$FAMILIES5,$SELECTIVE_HF,$FAMILIES6,$FAMILIES7,$FAMILIES8,$FAMILIES9,$FAMILIES10
FAMILIES12=1g-apertus-eager,1g-apertus-compiled,1g-apertus-mb2x4-op,1g-granitemoe-eager,1g-granitemoe-compiled
FAMILIES12=$FAMILIES12,1g-granitemoe-mb4x2-op,1g-glm4-eager,1g-glm4-compiled,1g-glm4-mb2x4-full
# compiled-launches: host_mix's families (its MODELS names), the six of host-mix-compiled first; compiled-launch-rows
LAUNCH_FAMILIES=llama-1.3b,gpt-350m,llama3.2-1b,gemma3-1b,pythia-1.4b,phi2-16l,qwen3-1.7b,olmo2-1b,gpt2-xl,granite-3-2b,stablelm-2-1.6b,moe-1.2b-8e,qwen2.5-1.5b
LAUNCH_SEQS=${LAUNCH_SEQS:-32 512}
# compiled-check: host-paced compiled rows predicted with the per-kernel launch term before they ran (s80)
COMPILED_CHECK=1g-gpt-auto,1g-gpt-mb4x2-compiled,1g-moe-auto,1g-llama-mb4x2-compiled,1g-gpt-b16-compiled
# moe-compiled: the compiled rows of catalog MoE models, whose blocks ran as six graphs before s82
MOE_COMPILED=1g-moe-auto,1g-moe-b16-compiled,1g-qwen3moe-compiled,1g-mixtral-compiled,1g-qwen15moe-compiled
# accumulate-check: rows of several micro-batches predicted with FSDP2's fp32 accumulation priced (s84)
ACCUMULATE_CHECK=1g-llama-b16-mb8x2,1g-llama-b16-mb4x4,1g-llama-mb4x2,1g-llama-b16-compiled,1g-moe-b16-mb8x2
ACCUMULATE_CHECK=$ACCUMULATE_CHECK,1g-moe-b16-compiled,1g-moonlight-eager,1g-dsv2-eager,1g-flexolmo-eager
# single-check: the one-GPU sweep of record (its 1.3B llama, 350M GPT and MoE rows; SKIP_SINGLE left out)
SINGLE_CHECK=1g-llama-auto,1g-llama-eager,1g-llama-mb4x2,1g-llama-selective,1g-llama-full,1g-llama-mb2x4-full
SINGLE_CHECK=$SINGLE_CHECK,1g-llama-op,1g-llama-b16,1g-gpt-auto,1g-gpt-eager,1g-gpt-selective,1g-moe-eager,1g-moe-full
SINGLE_CHECK=$SINGLE_CHECK,1g-moe-auto,1g-llama-mb2x4,1g-gpt-mb2x4-op,1g-gpt-b16,1g-moe-b16,1g-llama-b16-mb8x2
SINGLE_CHECK=$SINGLE_CHECK,1g-llama-b16-mb4x4,1g-llama-b16-full,1g-llama-b16-compiled,1g-gpt-b16-mb8x2
SINGLE_CHECK=$SINGLE_CHECK,1g-gpt-b16-compiled,1g-moe-b16-mb8x2,1g-moe-b16-compiled,1g-gpt-mb4x2,1g-gpt-mb4x2-compiled
SINGLE_CHECK=$SINGLE_CHECK,1g-gpt-full,1g-llama-mb4x2-compiled
# moe-replay: MoE rows under full recompute and per-op checkpointing, after the replay's own host floor (s89)
MOE_REPLAY=1g-moe-full,1g-qwen3moe-full,1g-dsv2-mb2x4-full,1g-moonlight-mb2x4-full,1g-gemma4moe-mb2x4-full
MOE_REPLAY=$MOE_REPLAY,1g-minimax-mb2x2-full,1g-lfm2moe-mb2x4-full,1g-gptoss-mb2x4-full,1g-granitemoe-mb4x2-op
MOE_REPLAY=$MOE_REPLAY,1g-olmoe-mb4x2-op,1g-dots1-mb1x8-op,1g-phimoe-mb2x4-op
# moe-check: MoE rows eager, compiled and under recompute after the MoE's per-op rates from the trainer's blocks (s90)
MOE_CHECK=1g-moe-eager,1g-moe-full,1g-moe-b16-mb8x2,1g-moe-auto,1g-dsv2-eager,1g-moonlight-eager,1g-olmoe-eager
MOE_CHECK=$MOE_CHECK,1g-granitemoesh-eager,1g-granitemoesh-mb2x4-op,1g-ernie45-mb2x4-op,1g-glm47flash-mb2x4-op
MOE_CHECK=$MOE_CHECK,1g-llama4-mb1x2-op,1g-lfm2moe-eager,1g-gptoss-eager,1g-qwen15moe-eager,1g-mixtral-mb2x2-op
LAUNCH_ROWS=1g-gpt-auto,1g-llama-auto,1g-qwen3-compiled,1g-phi3-compiled,1g-gemma3-compiled,1g-pythia-compiled,1g-olmo2-compiled,1g-gpt2xl-compiled,1g-moe-auto,1g-granite-compiled
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES11,$FAMILIES12
FAMILIES13=1g-gemma2-eager,1g-gemma2-compiled,1g-gemma2-mb2x4-op,1g-exaone4-eager,1g-exaone4-compiled
FAMILIES13=$FAMILIES13,1g-exaone4-mb2x4-full,1g-ernie45-eager,1g-ernie45-compiled,1g-ernie45-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES13
FAMILIES14=1g-helium-eager,1g-helium-compiled,1g-helium-mb2x4-op,1g-phimoe-eager,1g-phimoe-compiled
FAMILIES14=$FAMILIES14,1g-phimoe-mb2x4-op,1g-seedoss-eager,1g-seedoss-compiled,1g-seedoss-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES14
FAMILIES15=1g-persimmon-eager,1g-persimmon-compiled,1g-persimmon-mb2x4-full,1g-bitnet-eager,1g-bitnet-compiled
FAMILIES15=$FAMILIES15,1g-bitnet-mb2x4-op,1g-glm45air-eager,1g-glm45air-compiled,1g-glm45air-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES15
FAMILIES16=1g-diffllama-eager,1g-diffllama-compiled,1g-diffllama-mb2x4-op,1g-nanochat-eager,1g-nanochat-compiled
FAMILIES16=$FAMILIES16,1g-nanochat-mb4x4-full,1g-llama4-eager,1g-llama4-compiled,1g-llama4-mb1x2-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES16
FAMILIES17=1g-gptoss-eager,1g-gptoss-compiled,1g-gptoss-mb2x4-full,1g-gemma3-s2k-eager,1g-gemma3-s2k-compiled
FAMILIES17=$FAMILIES17,1g-gemma3-s2k-mb2x4-op,1g-cohere2-eager,1g-cohere2-compiled,1g-cohere2-mb2x2-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES17
FAMILIES18=1g-mistral-s8k-eager,1g-mistral-s8k-compiled,1g-mistral-s8k-mb1x4-op,1g-olmo3-s8k-eager,1g-olmo3-s8k-compiled
FAMILIES18=$FAMILIES18,1g-olmo3-s8k-mb1x4-full,1g-gemma3-4b-eager,1g-gemma3-4b-compiled,1g-gemma3-4b-mb2x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES18
PADDED=1g-apertus-padded-eager,1g-apertus-padded-compiled,1g-apertus-padded-mb1x4-op,1g-smollm3-padded-eager
PADDED=$PADDED,1g-smollm3-padded-compiled,1g-smollm3-padded-mb1x4-full,1g-llama32-padded-eager
PADDED=$PADDED,1g-llama32-padded-compiled,1g-llama32-padded-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$PADDED
FAMILIES19=1g-gptneo-eager,1g-gptneo-compiled,1g-gptneo-mb2x4-op,1g-biogpt-eager,1g-biogpt-compiled,1g-biogpt-mb4x4-full
FAMILIES19=$FAMILIES19,1g-internlm3-eager,1g-internlm3-compiled,1g-internlm3-mb1x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES19
FAMILIES19B=1g-olmo7-eager,1g-olmo7-compiled,1g-olmo7-mb1x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES19B
FAMILIES20=1g-neoxja-eager,1g-neoxja-compiled,1g-neoxja-mb4x2-full,1g-flexolmo-eager,1g-flexolmo-compiled
FAMILIES20=$FAMILIES20,1g-flexolmo-mb1x4-op,1g-minimax-eager,1g-minimax-compiled,1g-minimax-mb2x2-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES20
FAMILIES20B=1g-minimax-eager,1g-minimax-compiled,1g-minimax-mb2x2-full
FAMILIES21=1g-granitemoesh-eager,1g-granitemoesh-compiled,1g-granitemoesh-mb2x4-op,1g-ministral3-eager
FAMILIES21=$FAMILIES21,1g-ministral3-compiled,1g-ministral3-mb1x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES21
FAMILIES22=1g-vaultgemma-eager,1g-vaultgemma-compiled,1g-vaultgemma-mb2x4-op,1g-doge-eager,1g-doge-compiled
FAMILIES22=$FAMILIES22,1g-doge-mb4x4-full,1g-glm9b-eager,1g-glm9b-compiled,1g-glm9b-mb1x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES22
FAMILIES23A=1g-moonlight-eager,1g-moonlight-compiled,1g-moonlight-mb2x4-full,1g-glm47flash-eager
FAMILIES23A=$FAMILIES23A,1g-glm47flash-compiled,1g-glm47flash-mb2x4-op
FAMILIES23B=1g-minicpm3-eager,1g-minicpm3-compiled,1g-minicpm3-mb2x4-full,1g-dsv32-eager,1g-dsv32-compiled
FAMILIES23B=$FAMILIES23B,1g-dsv32-mb1x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES23A,$FAMILIES23B
FAMILIES24=1g-gemma4-eager,1g-gemma4-compiled,1g-gemma4-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES24
FAMILIES24B=1g-gemma4moe-eager,1g-gemma4moe-compiled,1g-gemma4moe-mb2x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES24B
FAMILIES25=1g-lfm2-eager,1g-lfm2-compiled,1g-lfm2-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES25
FAMILIES26=1g-lfm2moe-eager,1g-lfm2moe-compiled,1g-lfm2moe-mb2x4-full,1g-dots1-eager,1g-dots1-compiled,1g-dots1-mb1x8-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES26
FAMILIES27A=1g-nemotron-eager,1g-nemotron-compiled,1g-nemotron-mb2x4-op,1g-hunyuan-eager,1g-hunyuan-compiled
FAMILIES27A=$FAMILIES27A,1g-hunyuan-mb2x4-op
FAMILIES27B=1g-ernie45d-eager,1g-ernie45d-compiled,1g-ernie45d-mb2x4-full,1g-qwen3next-eager,1g-qwen3next-compiled
FAMILIES27B=$FAMILIES27B,1g-qwen3next-mb2x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES27A,$FAMILIES27B
FAMILIES28=1g-stablelm3b-eager,1g-stablelm3b-compiled,1g-stablelm3b-mb2x4-op,1g-gemma7b-eager,1g-gemma7b-compiled
FAMILIES28=$FAMILIES28,1g-gemma7b-mb2x4-op,1g-smollm2-eager,1g-smollm2-compiled,1g-smollm2-mb2x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES28
SKIP_SINGLE=$SKIP_SINGLE,1g-gpt-s64-mb4x2,1g-llama-s64-mb4x2,1g-smollm3-s64-mb2x4-full,1g-smollm3-s64-mb2x4
SKIP_SINGLE=$SKIP_SINGLE,1g-smollm3-s64-mb2x4-op
FAMILIES29=1g-phi4mini-eager,1g-phi4mini-compiled,1g-phi4mini-mb2x4-op,1g-nemo-eager,1g-nemo-compiled
FAMILIES29=$FAMILIES29,1g-nemo-mb2x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES29
FAMILIES30=1g-afmoe-eager,1g-afmoe-compiled,1g-afmoe-mb2x4-full,1g-jais2-eager,1g-jais2-compiled,1g-jais2-mb2x4-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES30
FAMILIES31=1g-laguna-eager,1g-laguna-compiled,1g-laguna-mb2x4-full,1g-cwm-eager,1g-cwm-compiled,1g-cwm-mb1x2-op
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES31
FAMILIES32=1g-youtu-eager,1g-youtu-compiled,1g-youtu-mb2x4-op,1g-exaonemoe-eager,1g-exaonemoe-compiled
FAMILIES32=$FAMILIES32,1g-exaonemoe-mb1x4-op,1g-mellum-eager,1g-mellum-compiled,1g-mellum-mb2x4-full
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES32
FAMILIES33=1g-youtu-auto,1g-mellum-auto,1g-exaonemoe-auto,1g-gpt1-eager,1g-gpt1-compiled,1g-gpt1-mb8x4-full
FAMILIES33=$FAMILIES33,1g-gpt1-auto,1g-qwen35-eager,1g-qwen35-compiled,1g-qwen35-mb1x4-op,1g-qwen35-auto
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES33
FAMILIES34=1g-solaropen-eager,1g-solaropen-compiled,1g-solaropen-mb1x4-full,1g-solaropen-auto,1g-minimaxm2-eager
FAMILIES34=$FAMILIES34,1g-minimaxm2-compiled,1g-minimaxm2-mb1x4-op,1g-minimaxm2-auto
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES34
FAMILIES35=1g-dbrx-eager,1g-dbrx-mb1x4-op,1g-dbrx-auto,1g-dbrx-compiled
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES35
FAMILIES36=1g-bloom-eager,1g-bloom-compiled,1g-bloom-mb2x4-full,1g-bloom-auto,1g-mpt-eager,1g-mpt-compiled
FAMILIES36=$FAMILIES36,1g-mpt-mb2x4-op,1g-mpt-auto
SKIP_SINGLE=$SKIP_SINGLE,$FAMILIES36
# clip38: the trainer's gradient clipping (max_grad_norm=1.0) beside the same plans without it, each pair measured
# back to back and profiled (the norm's and scaling's kernels); on two GPUs the 2g pairs too (s117 predictions)
CLIP38=1g-llama-eager,1g-llama-eager-clip,1g-llama-auto,1g-llama-auto-clip,1g-gpt-eager,1g-gpt-eager-clip
CLIP38=$CLIP38,1g-moe-eager,1g-moe-eager-clip
CLIP38_DIST=2g-llama-zero3,2g-llama-zero3-clip,2g-llama-tp2sp,2g-llama-tp2sp-clip,2g-llama-pp2,2g-llama-pp2-clip
CLIP38_DIST=$CLIP38_DIST,2g-moe-ep2,2g-moe-ep2-clip,2g-llama-auto,2g-llama-auto-clip
# and the planner's two-GPU MoE pick since it searches compiled plans on their own (s117_moe_pick predictions)
CLIP38_DIST=$CLIP38_DIST,2g-moe-ep2-compiled,2g-moe-dp2-compiled
SKIP_SINGLE=$SKIP_SINGLE,1g-llama-eager-clip,1g-llama-auto-clip,1g-gpt-eager-clip,1g-moe-eager-clip
SKIP_DIST=2g-llama7b-eager,2g-llama7b-compiled,2g-llama-zero3-clip,2g-llama-tp2sp-clip,2g-llama-pp2-clip
SKIP_DIST=$SKIP_DIST,2g-moe-ep2-clip,2g-llama-auto-clip
# hf-h100: Hugging Face rows of FAMILIES3-5 whose H200 peak was under 60 GiB (an H100 holds 80 GB)
HF_H100=1g-phi3-compiled,1g-phi3-mb2x2-op,1g-pythia-eager,1g-pythia-compiled,1g-pythia-mb4x2-full,1g-olmo2-compiled
HF_H100=$HF_H100,1g-olmo2-mb4x2-op,1g-granite-mb4x2-full,1g-llama32-compiled,1g-llama32-mb4x2-sel
HF_H100=$HF_H100,1g-stablelm-compiled,1g-stablelm-mb2x4-full
# picks-h100: the planner's picks on an H100 and the measured alternatives of each model and batch
H100_PICKS=1g-llama-b16-h100auto,1g-gpt-b16-h100auto,1g-moe-b16-h100auto,1g-l3w-h100auto
H100_ALTERNATIVES=1g-llama-b16-compiled,1g-gpt-b16-compiled,1g-moe-b16-compiled,1g-l3w-op-compiled,1g-l3w-full-mb1
H100_ALTERNATIVES=$H100_ALTERNATIVES,1g-llama-b16-mb8x2,1g-gpt-b16,1g-moe-b16
# single-probed-a / -b: the one-GPU sweep's 30 rows in two calls on one VM (15 each), the speed probes timed in the
# measuring process before and after each row (measure --host-probes; report --row-speed) (s101), and since s102 one
# step of each between the row's timed steps too (--interleave-probes; report --row-speed steps)
IFS=, read -ra SINGLE_ROWS <<< "$SINGLE_CHECK"
SINGLE_A=$(IFS=,; echo "${SINGLE_ROWS[*]:0:15}")
SINGLE_B=$(IFS=,; echo "${SINGLE_ROWS[*]:15}")
# held_out NAME ROWS SECONDS [MEASURE FLAGS]: this VM's host factor, the rows into $OUT/NAME.jsonl, the factor again
# the one-GPU sweep's host-paced rows: the compiled small models and their eager twins, full recompute
HOST_PACED=1g-gpt-eager,1g-gpt-auto,1g-moe-eager,1g-moe-auto,1g-gpt-b16-mb8x2,1g-gpt-b16-compiled,1g-moe-b16-mb8x2
HOST_PACED=$HOST_PACED,1g-moe-b16-compiled,1g-gpt-mb4x2,1g-gpt-mb4x2-compiled,1g-moe-full,1g-gpt-full
# rows the forward's carried lead moves most (full recompute, MoE), and controls, held out after that change (s108)
CARRY_CHECK=1g-moe-full,1g-qwen3moe-full,1g-dsv2-mb2x4-full,1g-moonlight-mb2x4-full,1g-gemma4moe-mb2x4-full,1g-lfm2moe-mb2x4-full,1g-llama-full,1g-starcoder2-mb2x4-full,1g-ministral3-mb1x4-full,1g-gpt-full,1g-moe-eager,1g-moe-b16-mb8x2
# host-paced rows whose steps stall in the caching allocator on some VMs (alloc-aba; ALLOC_ROWS=... to choose)
ALLOC_ROWS=${ALLOC_ROWS:-1g-afmoe-mb2x4-full,1g-laguna-mb2x4-full,1g-llama-mb2x4-full,1g-gpt-mb4x2-compiled}
# dense and MoE blocks (catalog and Hugging Face) whose replay under full recompute replay-host times
REPLAY_FAMILIES=llama-1.3b,gpt-350m,qwen3-1.7b,moe-1.2b-8e,qwen3-30b-a3b-4l,deepseek-v2-lite-4l,moonlight-16b-4l,afmoe-6l
# BASE: the shipped profile the VM's factor rescales (h200; h100-sxm on an H100), its output $OUT/BASE_here.yaml
held_out() {
  local name=$1 rows=$2 seconds=$3 base=${BASE:-h200}
  shift 3
  python -m autoparallel.cli calibrate --trainer --rescale --base "$base" --raw "$OUT/speed.jsonl" \
    --output "$OUT/${base}_here.yaml" 2>&1 | quiet | tail -3
  timeout "$seconds" python benchmarks/trainer_sweep.py measure --gpus 1 --warmup 2 --steps 6 "$@" \
    --out "$OUT/$name.jsonl" --only "$rows" 2>&1 | quiet | grep '^{' | cut -c1-160
  python -m autoparallel.cli calibrate --trainer --rescale --base "$base" --raw "$OUT/speed_after.jsonl" \
    --output "$OUT/${base}_after.yaml" 2>&1 | quiet | tail -3
}
case "${1:-}" in
  probes-single)
    python -m autoparallel.cli calibrate --trainer --raw "$OUT/probes.jsonl" 2>&1 | quiet | tail -8
    torchrun --nproc-per-node 2 -m autoparallel.cli calibrate --trainer --raw "$OUT/probes.jsonl" 2>&1 | quiet | tail -9
    python benchmarks/trainer_sweep.py measure --gpus 1 --out "$OUT/single.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-160 ;;
  dist)
    torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out "$OUT/dist.jsonl" \
      --skip "$SKIP_DIST" 2>&1 | quiet | grep '^{' | cut -c1-160
    for c in 2g-llama7b-eager 2g-llama7b-compiled; do  # alone: after the others the allocator runs out
      torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --only $c --out "$OUT/dist.jsonl" 2>&1 \
        | quiet | grep '^{' | cut -c1-160
    done ;;
  dist-rescale)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    timeout 480 torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out "$OUT/dist.jsonl" \
      --skip "$SKIP_DIST" 2>&1 | quiet | grep '^{' | cut -c1-160 ;;
  moe)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    python benchmarks/trainer_sweep.py measure --gpus 1 --steps 8 --out "$OUT/single.jsonl" \
      --only 1g-moe-eager,1g-moe-full,1g-moe-auto,1g-moe-b16,1g-moe-b16-mb8x2,1g-moe-b16-compiled 2>&1 \
      | quiet | grep '^{' | cut -c1-160
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out "$OUT/dist.jsonl" \
        --only 2g-moe-dp2,2g-moe-dp2-compiled,2g-moe-ep2,2g-moe-ep2-mb4x2 2>&1 | quiet | grep '^{' | cut -c1-160
    fi
    timeout 120 python benchmarks/profile_timeline.py --only 1g-moe-b16-compiled --out "$OUT/timeline.jsonl" 2>&1 \
      | quiet | grep '^{' | cut -c1-200 ;;
  attention-drift)
    timeout 200 python benchmarks/attention_timing.py --out "$OUT/attention.json" 2>&1 | quiet | grep '^B'
    bash "$0" rescale-drift ;;
  rescale-single|rescale-drift)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -6
    python benchmarks/trainer_sweep.py measure --gpus 1 --steps 8 --out "$OUT/single.jsonl" \
      --skip "$SKIP_SINGLE" 2>&1 \
      | quiet | grep '^{' | cut -c1-160
    if [ "$1" = rescale-drift ]; then
      python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed_after.jsonl" \
        --output "$OUT/h200_after.yaml" 2>&1 | quiet | tail -6
    else
      python -m autoparallel.cli calibrate --trainer --raw "$OUT/probes.jsonl" 2>&1 | quiet | tail -8
    fi ;;
  timeline)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    timeout 300 python benchmarks/profile_timeline.py --only 1g-moe-auto,1g-moe-b16-compiled \
      --out "$OUT/timeline.jsonl" --save-trace "$OUT/traces" 2>&1 | quiet | grep '^{' | cut -c1-200
    timeout 240 python benchmarks/profile_timeline.py --only 1g-moe-b16-mb8x2,1g-llama-op,1g-gpt-eager,1g-llama-b16 \
      --out "$OUT/timeline.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-200 ;;
  wide)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    timeout 330 python benchmarks/trainer_sweep.py measure --gpus 1 --warmup 2 --steps 5 --out "$OUT/wide.jsonl" --only "$WIDE" 2>&1 \
      | quiet | grep '^{' | cut -c1-160
    timeout 150 python benchmarks/profile_timeline.py --only 1g-llama-mb2x4,1g-moe-full --out "$OUT/timeline.jsonl" 2>&1 \
      | quiet | grep '^{' | cut -c1-200 ;;
  families)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    timeout 480 python benchmarks/trainer_sweep.py measure --gpus 1 --warmup 2 --steps 6 --out "$OUT/families.jsonl" \
      --only "$FAMILIES" 2>&1 | quiet | grep '^{' | cut -c1-160 ;;
  families2) held_out families2 "$FAMILIES2" 450 ;;
  families3) held_out families3 "$FAMILIES3" 480 --profile-all ;;
  families4) held_out families4 "$FAMILIES4" 480 --profile-all ;;
  families5) held_out families5 "$FAMILIES5" 480 --profile-all ;;
  selective-hf) held_out selective_hf "$SELECTIVE_HF" 420 --profile-all ;;
  families6) held_out families6 "$FAMILIES6" 470 --profile-all ;;
  families7) held_out families7 "$FAMILIES7" 440 --profile-all ;;
  families8) held_out families8 "$FAMILIES8" 400 --profile-all ;;
  families9) held_out families9 "$FAMILIES9" 420 --profile-all ;;
  families10) held_out families10 "$FAMILIES10" 420 --profile-all ;;
  families11) held_out families11 "$FAMILIES11" 520 --profile-all ;;
  families12) held_out families12 "$FAMILIES12" 520 --profile-all ;;
  families13) held_out families13 "$FAMILIES13" 540 --profile-all ;;
  families14) held_out families14 "$FAMILIES14" 540 --profile-all ;;
  families15) held_out families15 "$FAMILIES15" 540 --profile-all ;;
  families16) held_out families16 "$FAMILIES16" 540 --profile-all ;;
  families17) held_out families17 "$FAMILIES17" 480 --profile-all ;;
  families18) held_out families18 "$FAMILIES18" 480 --profile-all ;;
  padded) held_out padded "$PADDED" 420 --profile-all ;;
  families19) held_out families19 "$FAMILIES19" 480 --profile-all ;;
  families19b) held_out families19b "$FAMILIES19B" 240 --profile-all ;;
  families20) held_out families20 "$FAMILIES20" 500 --profile-all ;;
  families20b) held_out families20b "$FAMILIES20B" 300 --profile-all ;;
  families21) held_out families21 "$FAMILIES20B,$FAMILIES21" 440 --profile-all ;;
  families22) held_out families22 "$FAMILIES22" 460 --profile-all ;;
  families23a) held_out families23a "$FAMILIES23A" 440 --profile-all ;;
  families23b) held_out families23b "$FAMILIES23B" 440 --profile-all ;;
  families24) held_out families24 "$FAMILIES24" 300 --profile-all ;;
  families24b) held_out families24b "$FAMILIES24B" 300 --profile-all ;;
  families25) held_out families25 "$FAMILIES25" 300 --profile-all ;;
  families26) held_out families26 "$FAMILIES26" 480 --profile-all ;;
  families27a) held_out families27a "$FAMILIES27A" 460 --profile-all ;;
  families27b) held_out families27b "$FAMILIES27B" 460 --profile-all ;;
  families28)
    python benchmarks/host_op_kinds.py --out "$OUT/host_op_kinds.json" 2>&1 | quiet
    held_out families28 "$FAMILIES28" 420 --profile-all ;;
  isolate)  # the host-paced one-GPU rows in one process, each in a fresh process, in one process again (ABA):
            # does an earlier configuration of the sweep's process slow a later host-paced step?
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    for pass in a b c; do
      if [ $pass = b ]; then flag=--isolate; out=isolated; else flag=; out=inproc; fi
      timeout $([ $pass = b ] && echo 250 || echo 120) python benchmarks/trainer_sweep.py measure --gpus 1 --steps 8 --out "$OUT/$out.jsonl" \
        --only "$HOST_PACED" $flag 2>&1 | quiet | grep '^{' | cut -c1-120
    done ;;
  host-ticks)  # the host-paced rows, four passes in one process, the host's dispatch timed around each
               # (host_tick) and around the speed probes before and after: does the host's drift explain them?
    python benchmarks/trainer_sweep.py host-tick --out "$OUT/ticks.jsonl" --label before-probes 2>&1 | quiet | tail -2
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    python benchmarks/trainer_sweep.py host-tick --out "$OUT/ticks.jsonl" --label after-probes 2>&1 | quiet | tail -2
    timeout 330 python benchmarks/trainer_sweep.py measure --gpus 1 --steps 8 --passes 4 --host-ticks \
      --out "$OUT/ticked.jsonl" --only "$HOST_PACED,1g-llama-eager" 2>&1 | quiet | grep '^{' | cut -c1-100
    python benchmarks/trainer_sweep.py host-tick --out "$OUT/ticks.jsonl" --label before-probes-after 2>&1 | quiet | tail -2
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed_after.jsonl" \
      --output "$OUT/h200_after.yaml" 2>&1 | quiet | tail -3
    python benchmarks/trainer_sweep.py host-tick --out "$OUT/ticks.jsonl" --label after-probes-after 2>&1 | quiet | tail -2 ;;
  host-cpus)  # the host's speed pinned to each CPU (host_cpus.py), then four host-paced rows pinned to the
              # fastest CPU and to the slowest, two passes each: is the host's drift a matter of which CPU?
    python benchmarks/host_cpus.py --out "$OUT/host_cpus.jsonl" 2>&1 | quiet | tail -3
    read -r fast slow < <(python - "$OUT/host_cpus.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(line) for line in open(sys.argv[1])][1:]
speed = {}
for r in recs:
    speed.setdefault(r["cpu"], []).append(r["tick"]["op_us"])
order = sorted(speed, key=lambda c: statistics.median(speed[c]))
print(order[0], order[-1])
PY
)
    echo "fastest cpu $fast, slowest $slow"
    for cpu in $fast $slow; do
      timeout 150 taskset -c "$cpu" python benchmarks/trainer_sweep.py measure --gpus 1 --steps 8 --passes 2 \
        --host-ticks --out "$OUT/pinned_cpu$cpu.jsonl" --only 1g-gpt-eager,1g-moe-auto,1g-gpt-mb4x2-compiled,1g-gpt-full \
        2>&1 | quiet | grep '^{' | cut -c1-100
    done ;;
  compiled-gpt)  # the 350M GPT eager and compiled on one VM: one profiled step each with its trace kept (where
                 # the compiled step's host time goes), then both alternately, three passes, the host ticked
    timeout 200 python benchmarks/profile_timeline.py --only 1g-gpt-eager,1g-gpt-auto,1g-gpt-mb4x2,1g-gpt-mb4x2-compiled \
      --steps 2 --out "$OUT/timeline.jsonl" --save-trace "$OUT/traces" 2>&1 | quiet | grep '^{' | cut -c1-120
    timeout 150 python benchmarks/trainer_sweep.py measure --gpus 1 --steps 8 --passes 3 --host-ticks \
      --out "$OUT/paired.jsonl" --only 1g-gpt-eager,1g-gpt-auto,1g-gpt-mb4x2,1g-gpt-mb4x2-compiled 2>&1 | quiet \
      | grep '^{' | cut -c1-100 ;;
  families10-fsdp)  # FAMILIES10, then step timelines of three plans at 2048 and at 64 tokens a row
    bash "$0" families10
    timeout 290 python benchmarks/profile_timeline.py --out "$OUT/timeline.jsonl" \
      --only 1g-smollm3-s64-mb2x4,1g-smollm3-s64-mb2x4-full,1g-smollm3-s64-mb2x4-op,1g-gpt-s64-mb4x2,1g-llama-s64-mb4x2,1g-smollm3-mb2x4-full,1g-gpt-mb4x2,1g-llama-mb4x2 \
      2>&1 | quiet | grep '^{' | cut -c1-200 ;;
  host-mix-sac)  # host time per block under per-op checkpointing and full recompute (the replay's share)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    for mode in op full; do
      timeout 230 python benchmarks/host_mix.py measure --recompute $mode --out "$OUT/host_mix_$mode.jsonl" 2>&1 \
        | quiet | grep "blocks fwd\|Error\|error" | cut -c1-200
    done ;;
  replay-host)  # what a replayed block costs the host, MoE against dense: host_mix at 32 tokens a row with no
                # recompute, under full recompute, and with none again (its drift), the speed probes around; and
                # the accumulating index_put in bf16 and fp32 (index_backward.py: is an fp32 row an element's time?)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    for dtype in bf16 fp32; do
      timeout 90 python benchmarks/index_backward.py --dtype $dtype --out "$OUT/index_backward_$dtype.json" 2>&1 \
        | quiet | tail -2
    done
    for pass in none full none_again; do
      timeout 170 python benchmarks/host_mix.py measure --recompute "${pass%_again}" --only "$REPLAY_FAMILIES" \
        --out "$OUT/host_mix_$pass.jsonl" 2>&1 | quiet | grep "blocks fwd\|Error\|error" | cut -c1-200
    done
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed_after.jsonl" \
      --output "$OUT/h200_after.yaml" 2>&1 | quiet | tail -3 ;;
  full-timelines)  # where the Hugging Face MoE rows under full recompute lose against the model (predicted 8-16% slow):
                   # the compute stream's idle per step, MoE and dense, eager and full, the speed probes first
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    timeout 420 python benchmarks/profile_timeline.py --steps 2 --out "$OUT/timeline.jsonl" \
      --only 1g-laguna-mb2x4-full,1g-laguna-eager,1g-afmoe-mb2x4-full,1g-moonlight-mb2x4-full,1g-llama-mb2x4-full,1g-qwen3moe-full \
      2>&1 | quiet | grep '^{' | cut -c1-200 ;;
  alloc-aba)  # whether the caching allocator holds host-paced rows back (s106: AFMoE's full-recompute steps idle
              # 20 ms at a time in FSDP2's _chunk_cat): default, expandable segments, default again, one process
              # each, the speed probes around every row
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    for pass in default expandable default_again; do
      ( unset PYTORCH_CUDA_ALLOC_CONF; [ "$pass" = expandable ] && export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        timeout 170 python benchmarks/trainer_sweep.py measure --gpus 1 --warmup 2 --steps 6 --host-probes \
          --out "$OUT/alloc_$pass.jsonl" --only "$ALLOC_ROWS" 2>&1 | quiet | grep '^{' | cut -c1-120 )
    done ;;
  host-mix|host-mix-compiled)  # host time per block of the sweep's families at 32 tokens a row (host_mix.py)
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    flag=""; [ "$1" = host-mix-compiled ] && flag=--compiled
    timeout 450 python benchmarks/host_mix.py measure $flag --out "$OUT/host_mix.jsonl" 2>&1 | quiet \
      | grep "blocks fwd\|Error\|error" | cut -c1-200 ;;
  compiled-launches)  # kernels per compiled block and phase against its host time: host_mix at LAUNCH_SEQS tokens a
                     # row (32: no reduction split; 512: every one over the tokens split), unprofiled host per phase
                     # + one profiled step's launches per region, the speed probes first
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    for seq in $LAUNCH_SEQS; do
      timeout 480 python benchmarks/host_mix.py measure --compiled --launches --seq $seq \
        --out "$OUT/host_mix_launches.jsonl" --only "$LAUNCH_FAMILIES" 2>&1 | quiet | grep "blocks fwd\|Error\|error" \
        | cut -c1-200
    done ;;
  launch-rate)  # the host's time per kernel a compiled graph launches (compiled_launch_rate.py), the speed probes
                # first; then compiled-launch-rows
    python -m autoparallel.cli calibrate --trainer --rescale --base h200 --raw "$OUT/speed.jsonl" \
      --output "$OUT/h200_here.yaml" 2>&1 | quiet | tail -3
    timeout 200 python benchmarks/compiled_launch_rate.py --out "$OUT/launch_rate.jsonl" 2>&1 | quiet | tail -8
    [ -n "$RATE_ONLY" ] || bash "$0" compiled-launch-rows ;;
  compiled-launch-rows)  # the kernels each compiled block of the compiled sweep rows launches at their own sizes
    timeout 420 python benchmarks/profile_timeline.py --only "$LAUNCH_ROWS" --steps 2 --out "$OUT/timeline.jsonl" \
      --save-trace /tmp/launch_traces 2>&1 | quiet | grep '^{' | cut -c1-120
    python benchmarks/profile_timeline.py --regions-of /tmp/launch_traces/*.json.gz \
      --out "$OUT/launch_regions.jsonl" 2>&1 | cut -c1-300 ;;
  graph-breaks)  # Dynamo's graph breaks in compiled sweep rows (graph_breaks.py), each break's user stack logged
    TORCH_LOGS=graph_breaks timeout 300 python benchmarks/graph_breaks.py --only "${BREAK_ROWS:-1g-moe-auto,1g-llama-auto}" \
      --out "$OUT/graph_breaks.jsonl" > "$OUT/graph_breaks.log" 2>&1
    grep '^{' "$OUT/graph_breaks.log" | cut -c1-600 ;;
  micro-batches)  # one and two micro-batches of the 1.3B llama, eager and compiled, profiled: what a second
                  # micro-batch adds (the sweep's pairs: ~312 / 256 ms against 291 / 233 predicted)
    timeout 400 python benchmarks/profile_timeline.py --only 1g-llama-auto,1g-llama-b16-compiled,1g-llama-eager,1g-llama-b16-mb8x2 \
      --steps 2 --out "$OUT/timeline.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-200 ;;
  moe-check) held_out moe_check "$MOE_CHECK" 440 ;;  # MoE rows under the trainer-measured MoE rates, held out (s90)
  moe-replay) held_out moe_replay "$MOE_REPLAY" 420 ;;  # MoE rows that replay their blocks, held out (s89)
  single-check) held_out single_check "$SINGLE_CHECK" 420 ;;  # the one-GPU sweep's 30 rows, held out (s85)
  single-check-h100)  # on an H100 (nvidia-h100-x1) against the shipped h100-sxm (derived from h200): the 29 rows
                      # that fit its 80 GB (1g-llama-b16 needs 88 GiB); predictions trainer_sweep_predicted_s118_h100.json
    nvidia-smi -L
    BASE=h100-sxm held_out single_check_h100 "${SINGLE_CHECK/,1g-llama-b16,/,}" 440 ;;
  hf-h100)  # on an H100: calibrate's kernel families timed (kernel_rates.py), then the rows of FAMILIES3-5 that peaked
            # under 60 GiB on an H200, against h100-sxm with its anchor's kernel rates kept (loader._rates_kept);
            # predictions trainer_sweep_predicted_s119_h100_hf.json
    nvidia-smi -L
    timeout 90 python benchmarks/kernel_rates.py measure --out "$OUT/kernel_rates.json" 2>&1 | quiet | tail -2
    BASE=h100-sxm held_out hf_h100 "$HF_H100" 400 ;;
  picks-h100)  # on an H100: the planner's own picks at 16 rows and at 8192 tokens (H100_PICKS), then the plans they
               # beat in the same VM (H100_ALTERNATIVES); predictions trainer_sweep_predicted_s120_h100_picks.json
    nvidia-smi -L  # an H200 when no H100 came: the h200 profile then (trainer_sweep_predicted_s120_h200_picks.json)
    BASE=$(nvidia-smi -L | grep -q H200 && echo h200 || echo h100-sxm) held_out picks_h100 "$H100_PICKS" 240
    timeout 300 python benchmarks/trainer_sweep.py measure --gpus 1 --warmup 2 --steps 6 --out "$OUT/picks_h100_alt.jsonl" \
      --only "$H100_ALTERNATIVES" 2>&1 | quiet | grep '^{' | cut -c1-160 ;;
  single-probed-a) held_out single_probed_a "$SINGLE_A" 420 --host-probes --interleave-probes ;;
  single-probed-b) held_out single_probed_b "$SINGLE_B" 420 --host-probes --interleave-probes ;;
  families29) held_out families29 "$FAMILIES29" 450 --host-probes --profile ;;
  families30) held_out families30 "$FAMILIES30" 400 --host-probes --interleave-probes ;;
  carry-check) held_out carry_check "$CARRY_CHECK" 330 --host-probes ;;  # after estimate.carry_forward_lead (s108)
  families31) held_out families31 "$FAMILIES31" 470 --host-probes --interleave-probes ;;
  families32) held_out families32 "$FAMILIES32" 520 --host-probes --interleave-probes ;;  # Youtu, EXAONE MoE, Mellum
  families33) held_out families33 "$FAMILIES33" 500 --host-probes --interleave-probes ;;  # GPT-1, Qwen3.5, the picks
  families34) held_out families34 "$FAMILIES34" 500 --host-probes --interleave-probes ;;  # Solar Open, MiniMax-M2
  families35) held_out families35 "$FAMILIES35" 500 --host-probes --interleave-probes ;;  # DBRX (its expert loop)
  families36) held_out families36 "$FAMILIES36" 500 --host-probes --interleave-probes ;;  # BLOOM, MPT (ALiBi)
  clip38)
    held_out clip38 "$CLIP38" 330 --host-probes --interleave-probes --profile
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      timeout 240 torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --warmup 2 --steps 6 \
        --out "$OUT/clip38_dist.jsonl" --only "$CLIP38_DIST" 2>&1 | quiet | grep '^{' | cut -c1-160
    fi ;;
  families-rest) held_out "${NAME:?set NAME}" "${ROWS:?set ROWS}" 500 --host-probes --interleave-probes ;;
  accumulate-check) held_out accumulate_check "$ACCUMULATE_CHECK" 400 ;;  # several micro-batches, held out (s84)
  moe-compiled)  # the catalog MoE's compiled rows once its blocks are one graph each (s82), then their breaks again
    held_out moe_compiled "$MOE_COMPILED" 330
    BREAK_ROWS=1g-moe-auto bash "$0" graph-breaks ;;
  compiled-check) held_out compiled_check "$COMPILED_CHECK" 140 ;;  # host-paced compiled rows after the launch term
  compiled-hf) held_out compiled_hf 1g-qwen3-compiled,1g-phi3-compiled,1g-gemma-mb4x2-compiled,1g-granite-compiled,1g-olmo2-compiled,1g-stablelm-compiled,1g-gpt2xl-compiled 260 ;;
  families6b) held_out families6b 1g-gptj-eager,1g-gptj-compiled,1g-gptj-mb2x4-op,1g-gemma3-mb4x8-full 400 --profile-all ;;
  *) echo "usage: $0 probes-single|dist|dist-rescale|rescale-single|rescale-drift|moe|attention-drift|timeline|wide|families|families2|families3|families4|families5|selective-hf|families6|families6b|families7|families8|families9|families10|families10-fsdp|families11|families12|families13|families14|families15|families16|families17|families18|padded|families19|families19b|families20|families20b|families21|families22|families23a|families23b|families24|families24b|families25|families26|families27a|families27b|families28|host-mix|host-mix-compiled|host-mix-sac|compiled-hf|graph-breaks|moe-compiled|micro-batches|accumulate-check|single-check|single-check-h100|hf-h100|picks-h100|single-probed-a|single-probed-b|families29|families30|moe-replay|moe-check" >&2
     exit 2 ;;
esac
