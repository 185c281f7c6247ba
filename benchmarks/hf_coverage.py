"""Which Hugging Face causal LMs does autoparallel run as they are, and does it run them right?

For every model_type transformers maps to a causal LM (AutoModelForCausalLM), this builds a tiny random-weight
model of it (the config class's defaults, shrunk: 2 layers, width 64, 4 heads, vocabulary 256, dropout off) on
the CPU in fp32 and sets autoparallel's forward (`autoparallel.hf`, the one the trainer and the tracer run)
against the model's own: the logits without a padding mask and, at the unpadded positions, with right and left
padding. Each type ends as one of

    same       the logits agree (max |difference| <= 1e-5 of the largest logit; the forwards differ only in
               the order of a few fp32 sums, if at all)
    refused    autoparallel says why in one line (UserError): not decoder-only, a state-space mixer, ALiBi, ...
    DIFFERENT  the forwards disagree: a silent wrong answer, the row to fix first
    error      anything else: transformers cannot build the tiny config or its own forward fails on it (this
               script's shrinking: stage "build" / "own forward"), or autoparallel fails unannounced ("forward")

    python benchmarks/hf_coverage.py [--only llama,opt] [--out benchmarks/results/hf_coverage.json]
        [--doc docs/hf_coverage.md]
    python benchmarks/hf_coverage.py --window 4 --out benchmarks/results/hf_coverage_windows.json \
        --doc docs/hf_coverage_windows.md

--window N: only the types whose config has a sliding window, a local window (GPT-Neo's window_size) or an
attention chunk, each set to N tokens, so that the 16-token sequence runs beyond it (the per-layer-type masks;
the defaults, 128-8192 tokens, never bind).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoparallel.errors import UserError  # noqa: E402
from autoparallel.hf import hf_parts, install_forward, is_hf_causal_lm, quiet_optional_kernels  # noqa: E402

SEQ = 16
ROWS = 2
MAX_PARAMS = 20_000_000  # a tiny config is ~0.1-1M; larger means the shrinking missed a sub-config
TOLERANCE = 1e-5  # of the largest |logit|: fp32 sums in another order differ by ~1e-7 relative per op
# the tiny shape, under the names config classes use for it (set where the class has the attribute)
SHRINK = {"hidden_size": 64, "n_embd": 64, "d_model": 64, "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2,
          "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "intermediate_size": 128, "ffn_dim": 128,
          "n_inner": 128, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128, "n_positions": 128,
          "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4,
          "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "word_embed_proj_dim": 64,
          "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
          "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "layerdrop": 0.0, "rotary_dim": 8, "attention_hidden_size": 64,
          "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 16, "decoder_attention_heads": 4,
          "encoder_attention_heads": 4, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128}
# defaults of transformers 5.24 that do not build a model or run its own forward, with what the released
# checkpoints' configs set (attribute path -> value, after SHRINK): without them these types never reached a check
DEFAULT_FIXES = {
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},  # None: torch.empty(None, ..)
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},     # None: not subscriptable
    "dbrx": {"attn_config.rope_theta": 500000.0, "attn_config.clip_qkv": 8.0},         # no attribute; clamp(None)
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},  # {}
    "falcon_h1": {"mamba_d_ssm": None},  # its default 1024 is not shrunk with the width: the model's own shape error
    "mamba2": {"num_heads": 8, "n_groups": 1, "state_size": 16},  # heads x head_dim = expand x hidden (2 x 64 / 16)
    **{t: {f"{p}indexer_{k}": v for k, v in (("n_heads", 2), ("kv_heads", 1), ("head_dim", 16), ("budget", 8),
                                                ("compress_ratio", 4))}                                 # None: x // None
       for t, p in (("qwen4_exp", "text_config."), ("qwen4_exp_text", ""))},
}


WINDOW_KEYS = ("sliding_window", "attention_chunk_size", "window_size")


def tiny_config(model_type: str, window: int | None = None) -> Any:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    shrink(cfg)
    for path, value in DEFAULT_FIXES.get(model_type, {}).items():
        owner, _, name = path.rpartition(".")
        setattr(getattr(cfg, owner) if owner else cfg, name, value)
    for key in WINDOW_KEYS if window else ():
        if getattr(cfg, key, None):
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                setattr(cfg, key, window)
    return cfg


def windowed(model_type: str) -> bool:
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.for_model(model_type)
    except Exception:  # a type whose default config does not build: check() reports it where it is run
        return False
    return any(getattr(cfg, k, None) for k in WINDOW_KEYS)


def _read(cfg: Any, key: str) -> Any:
    """cfg.key, or its stored value where the config refuses the global read (a per-layer attribute of a
    heterogeneous config: Gemma 4's head_dim)."""
    try:
        return getattr(cfg, key, None)
    except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError
        return vars(cfg).get(key)


def shrink(cfg: Any) -> None:
    """SHRINK where the config has the attribute, dropout off, per-layer lists cut to the layers; the same in
    its sub-configs (a multimodal model's text_config, DBRX's attn_config / ffn_config)."""
    from transformers import PretrainedConfig

    for key, value in SHRINK.items():
        if _read(cfg, key) is not None:
            with contextlib.suppress(Exception):  # a read-only property; a per-layer one (Gemma 4's)
                setattr(cfg, key, value)
    if isinstance(getattr(cfg, "qk_rope_head_dim", None), int):  # latent attention: rotary over qk_rope_head_dim
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            cfg.head_dim = cfg.qk_rope_head_dim
        if isinstance(getattr(cfg, "qk_head_dim", None), int):  # derived in the config's __init__, not on setattr
            cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if isinstance(_read(cfg, "num_key_value_heads"), int):  # its keys and values have every head
            cfg.num_key_value_heads = _read(cfg, "num_attention_heads")
    for key in ("head_dim", "num_key_value_heads"):  # None in some defaults, which their attention reads as is
        if key in vars(cfg) and _read(cfg, key) is None:
            setattr(cfg, key, SHRINK[key])
    if isinstance(getattr(cfg, "mamba_n_heads", None), int) and isinstance(getattr(cfg, "mamba_d_head", None), int):
        # a Mamba-2 mixer's heads tile its inner width (mamba_expand x hidden; Bamba's, Granite 4's)
        cfg.mamba_n_heads = SHRINK["num_attention_heads"]
        cfg.mamba_d_head = getattr(cfg, "mamba_expand", 2) * cfg.hidden_size // cfg.mamba_n_heads
    if getattr(cfg, "n_routed_experts", None) and getattr(cfg, "num_experts_per_tok", 0) is None:  # DeepSeek V2's
        cfg.num_experts_per_tok = SHRINK["num_experts_per_tok"]                                   # default
    for key, value in list(vars(cfg).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(cfg, key, 0.0)
        elif isinstance(value, PretrainedConfig):
            shrink(value)
    layers = next((getattr(cfg, k) for k in ("num_hidden_layers", "n_layer", "num_layers") if hasattr(cfg, k)), 2)
    per_layer = vars(cfg).get("per_layer_config")
    if isinstance(per_layer, dict):  # a heterogeneous config's overrides (dots3): the kept layers', shrunk alike
        cfg.per_layer_config = {i: {k: SHRINK.get(k, v) for k, v in over.items()} for i, over in per_layer.items()
                                if str(i).isdigit() and int(i) < layers}
    for key in ("layer_types", "mlp_only_layers"):
        value = getattr(cfg, key, None)
        if isinstance(value, list) and len(value) > layers:
            # every kind of layer the model has, as far as the layers go (a hybrid's first layers are often all
            # linear attention, its full-attention layers further in), the rest in the config's order
            kinds = list(dict.fromkeys(value))[:layers] if key == "layer_types" else []
            setattr(cfg, key, kinds + value[:layers - len(kinds)])
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key) >= SHRINK["vocab_size"]:
            setattr(cfg, key, 0)


def check(model_type: str, window: int | None = None) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    out: dict[str, Any] = {"model_type": model_type}
    try:
        cfg = tiny_config(model_type, window)
        with quiet_optional_kernels(), torch.device("meta"):  # its size first: a config this script cannot
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())  # shrink stays big
        if size > MAX_PARAMS:
            return {**out, "result": "error", "stage": "build",
                    "detail": f"the tiny config still has {size / 1e6:.0f}M parameters (sub-configs not shrunk)"}
        torch.manual_seed(0)
        with quiet_optional_kernels():
            model = AutoModelForCausalLM.from_config(cfg).float().eval()
    except Exception as e:  # the tiny config is this script's guess, not the user's
        return {**out, "result": "error", "stage": "build", "detail": f"{type(e).__name__}: {_line(e)}"}
    out["class"] = type(model).__name__
    if not is_hf_causal_lm(model):
        return {**out, "result": "refused", "detail": "not a decoder-only causal LM (is_hf_causal_lm)"}
    try:
        parts = hf_parts(model)
    except UserError as e:
        return {**out, "result": "refused", "detail": str(e).splitlines()[0], "seconds": time.perf_counter() - t0}
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, SHRINK["vocab_size"], (ROWS, SEQ), generator=g)
    right = torch.ones_like(ids)
    right[1, SEQ - 5:] = 0
    masks = (None, right, right.flip(1))
    try:
        with torch.no_grad():
            refs = [model(input_ids=ids, attention_mask=mask, use_cache=False).logits for mask in masks]
    except Exception as e:  # the model's own forward fails on the tiny config: this script's shrinking
        return {**out, "result": "error", "stage": "own forward", "detail": f"{type(e).__name__}: {_line(e)}"}
    try:
        mine = copy.deepcopy(model)
        install_forward(mine, parts)
        diffs = []
        with torch.no_grad():
            for mask, ref in zip(masks, refs, strict=True):
                got = mine(ids, mask)
                valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
                diffs.append(float((got[valid] - ref[valid]).abs().max() / ref[valid].abs().max().clamp_min(1e-30)))
    except UserError as e:
        return {**out, "result": "refused", "detail": str(e).splitlines()[0], "seconds": time.perf_counter() - t0}
    except Exception as e:
        return {**out, "result": "error", "stage": "forward", "detail": f"{type(e).__name__}: {_line(e)}",
                "where": traceback.format_exc().strip().splitlines()[-3].strip(), "seconds": time.perf_counter() - t0}
    worst = max(diffs)
    return {**out, "result": "same" if worst <= TOLERANCE else "DIFFERENT", "rel_diff": diffs,
            "detail": "" if worst <= TOLERANCE else "no mask / right padding / left padding: "
            + ", ".join(f"{d:.1e}" for d in diffs), "seconds": time.perf_counter() - t0}


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:200]


def write_doc(rows: list[dict[str, Any]], path: Path, command: str, window: int | None = None) -> None:
    import transformers

    counts: dict[str, int] = {}
    for r in rows:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    lines = ["# Hugging Face causal LMs: which run as they are, and whether they run right", "",
             f"Command: `{command}` (CPU; transformers {transformers.__version__}, torch {torch.__version__}).", "",
             *([] if window else ["Beyond their sliding windows and attention chunks (the defaults here, 128-8192 tokens, "
                                  f"never bind at {SEQ}): docs/hf_coverage_windows.md.", ""]),
             "Each model_type AutoModelForCausalLM maps, built tiny (2 layers, width 64, random weights, fp32), "
             "with autoparallel's forward (autoparallel/hf.py: what the trainer and the tracer run) against the "
             "model's own, without a padding mask and with right and left padding. `same`: logits within "
             f"{TOLERANCE:g} of the largest; `refused`: one error line says why; `DIFFERENT`: a wrong answer; "
             "`error`: the tiny config does not build or the model's own forward fails on it (this script's "
             "shrinking: stage build / own forward), or autoparallel fails unannounced (stage forward)."
             + (f" Only the types whose config has a sliding window, a local window (window_size) or an attention "
                f"chunk, set to {window} tokens: the {SEQ}-token sequence runs beyond it." if window else ""), "",
             "Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), "",
             "| model_type | class | result | detail |", "|---|---|---|---|"]
    for r in rows:
        detail = r.get("detail", "").replace("|", "\\|")
        stage = f" ({r['stage']})" if r.get("stage") else ""
        lines.append(f"| {r['model_type']} | {r.get('class', '')} | {r['result']}{stage} | {detail} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=None, help="comma-separated model_types")
    p.add_argument("--out", default=None, help="JSON of the rows")
    p.add_argument("--doc", default=None, help="markdown table")
    p.add_argument("--window", type=int, default=None,
                   help="only types with a sliding window or attention chunk, set to this many tokens")
    args = p.parse_args(argv)
    types = args.only.split(",") if args.only else sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.window:
        types = [t for t in types if windowed(t)]
    rows = []
    for model_type in types:
        with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):  # transformers' warnings
            row = check(model_type, args.window)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "where"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    if args.doc:
        write_doc(rows, Path(args.doc), "python benchmarks/hf_coverage.py" + (f" --only {args.only}" if args.only else "")
                  + (f" --window {args.window}" if args.window else "") + f" --out {args.out} --doc {args.doc}",
                  args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
