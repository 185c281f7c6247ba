"""Hugging Face `transformers` causal LMs, passed as they are.

A `PreTrainedModel` for causal LM (LlamaForCausalLM, Qwen2/3(-MoE), Mixtral, Phi-3, Gemma, GPT-2, ...)
keeps its own modules and parameter names; what this module adds is a forward for the copies the
trainer and tracer run, `causal_lm_forward`, that

* computes rotary tables and learned positions from the whole sequence at the model root (HF derives
  them from the embedding output, which sequence parallelism shards), and the per-head position biases
  (ALiBi: BLOOM's, MPT's) its blocks take, with the base model's own builder (BIAS_BUILDERS),
* runs the blocks without HF's mask builders: causal attention comes from SDPA's `is_causal` (what HF
  itself uses when no padding mask is given), an explicit additive mask otherwise. HF's mask
  utilities call data-dependent checks (`find_packed_sequence_indices(...).all()`) that fail on the
  meta device, so the tracer sees an op-level graph only on this path,
* computes Gemma 4's per-layer inputs (E2B / E4B: `PerLayerInputs`) beside the token embedding, as the base
  model's own methods do, and hands each block its slice,
* skips the pieces a pipeline stage does not hold (embeddings before the first stage, final norm and
  head after the last) and takes hidden states as its input on later stages,
* returns logits (not a ModelOutput, no loss): the trainer computes HF's loss itself (`hf_labels`,
  and the MoE router's load-balancing term, `router_aux` / `load_balance_terms`).

It also recognizes, by their interfaces, the layers tensor parallelism must treat specially: a Linear
that stores its weight transposed (Conv1D: `transposed_linear`) and fused projections whose parent
cuts the output into pieces (`fused_split`, `localize_fused`).

Nothing here imports transformers at import time: a model is recognized by its class hierarchy, so the
package stays an optional extra (`pip install autoparallel[hf]`). Only `causal_lm_from_config` (a config
file of a model_type the catalog does not implement, given to the CLI) imports it, when called.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import copy
import functools
import inspect
import logging
import re
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from autoparallel.specs import HFConfig

IGNORE_INDEX = -100  # HF's label for positions without a loss


BLOCK_ARGS = ("attention_mask", "position_ids", "position_embeddings")  # what causal_lm_forward passes a block


@dataclass(frozen=True)
class BlockBias:
    """A per-head position bias (ALiBi) that the base model builds once and hands every block as `arg`, built by
    the base model's own builder (BIAS_BUILDERS) the way its forward calls it. Its dim 0 is (batch x) heads."""

    arg: str    # the block argument ("alibi": BLOOM, "position_bias": MPT)
    base: str   # the base model's path, which holds the builder and the head count (`num_heads`)


@dataclass(frozen=True)
class PerLayerInputs:
    """Per-layer embeddings (PLE: Gemma 4's E2B and E4B). Beside the token embedding, the base model looks each
    token up in a second table, `num_layers x width` wide, adds a projection of the token embeddings (scaled, cut
    per layer, normalized), scales the sum, and hands block i its slice i as `per_layer_input`: what its
    get_per_layer_inputs and project_per_layer_inputs compute, run where the token embedding runs."""

    table: str               # the per-layer embedding ("model.embed_tokens_per_layer"), [vocab, layers x width]
    projection: str          # the token embeddings' projection to every layer's input ("model.per_layer_model_projection")
    norm: str                # the norm over each layer's slice of that projection ("model.per_layer_projection_norm")
    width: int               # config.hidden_size_per_layer_input
    projection_scale: float  # the base model's per_layer_model_projection_scale (hidden_size ** -0.5)
    input_scale: float       # its per_layer_input_scale (2 ** -0.5), applied to the sum


@dataclass(frozen=True)
class HFParts:
    """Module paths of an HF decoder-only causal LM (None: the model has no such piece)."""

    embed: str                 # token embedding ("model.embed_tokens", "transformer.wte")
    positions: str | None      # learned position table ("transformer.wpe")
    dropout: str | None        # embedding dropout ("transformer.drop")
    layers: str                # ModuleList of blocks ("model.layers", "transformer.h")
    after: tuple[str, ...]     # what runs between the blocks and the head, in order: the final norm
                               # ("model.norm"), OPT's output projection ("model.decoder.project_out")
    rotary: str | None         # rotary table module ("model.rotary_emb")
    head: str                  # the output head, get_output_embeddings() ("lm_head", BioGPT's "output_projection")
    attn_implementation: str   # config._attn_implementation ("sdpa", "eager", ...)
    rotary_by_layer_type: bool = False  # one table per attention layer type (Gemma 3: sliding / full)
    # a multimodal (M-RoPE) table: it reads one row of positions per grid (temporal, height, width), each the token
    # positions for text; transformers 5.17's Qwen3.5 takes only those three rows, later versions broadcast one
    rotary_grids: bool = False
    sliding_window: int | None = None  # attention window of the sliding layers (Mistral: all of them)
    mixed_windows: bool = False        # some layers slide, others attend to everything (Gemma 2)
    attention_chunk: int | None = None  # chunked-attention layers attend within chunks this long (Llama 4: 8192)
    none_args: tuple[str, ...] = ()    # required block arguments passed as None (Falcon's `alibi` under rotary)
    embed_scale: float = 1.0           # the base model's multiplier of the token embeddings (Granite)
    logit_ops: tuple[tuple[str, float], ...] = ()  # what the LM's forward does to the logits, in order
    before: tuple[str, ...] = ()       # what runs on the token embeddings before the positions are added
                                       # (OPT's input projection "model.decoder.project_in")
    positions_by_mask: bool = False    # the table counts each row's unpadded tokens (OPT's, which HF calls
                                       # with the attention mask); otherwise positions are 0..S-1
    positions_by_keyword: bool = False  # the table takes position ids by keyword, the mask first (OPT's, BioGPT's)
    block_args: tuple[str, ...] = BLOCK_ARGS  # those the blocks take (GPT-1's take no position_ids)
    explicit_mask: bool = False        # the attention reads a materialized causal mask (Doge's), never None
    padding_mask_types: tuple[str, ...] = ()  # layer types whose blocks take the [B, S] padding mask itself, not
                                              # a causal one (MiniMax's "linear_attention", a recurrent mixer)
    # the blocks take a dict into which a layer of each type stores its keys and values (Gemma 4's
    # `shared_kv_states`, written whether or not a later layer reuses them, read by the last
    # num_kv_shared_layers layers): a fresh one every forward
    kv_store: bool = False
    # layer types the config gives no rotary parameters: their blocks get position_embeddings None (Ergo's full
    # attention, no position embedding), as the base model's forward passes them
    unrotated_types: tuple[str, ...] = ()
    # norms the base model runs on the embeddings before its blocks, after the positions are added (BLOOM's
    # word_embeddings_layernorm, BART's layernorm_embedding): the first stage's, like the embedding
    embed_norms: tuple[str, ...] = ()
    bias: BlockBias | None = None      # the per-head position bias its blocks take (ALiBi: BLOOM's, MPT's)
    bool_mask: bool = False            # the blocks take the causal mask as booleans, True where masked (MPT's
                                       # create_causal_mask(...).to(torch.bool), which its attention masked_fills)
    # the LM's own loss scores position t against labels[t + 1] (transformers' ForCausalLMLoss); BART's, mBART's,
    # PLBART's, TrOCR's and Whisper's decoders score it against labels[t]: their labels come shifted
    shifts_labels: bool = True
    per_layer: PerLayerInputs | None = None  # per-layer embeddings every block takes a slice of (Gemma 4's E2B/E4B)
    # why the blocks cannot be cut into pipeline stages ("" where they can): a tensor causal_lm_forward hands from
    # one block to later ones besides the hidden states (per-layer inputs, shared keys and values), which the
    # trainer's stages do not pass on
    no_pipeline: str = ""
    # one rotary module per layer, by index (Granite-SWA's: one per distinct config.layer_rope_theta, None for a
    # NoPE layer, theta 0), which the base model's forward picks for each block by that list; () for the others
    rotary_by_layer: tuple[str | None, ...] = ()
    # block arguments the base model hands the [B, S] padding mask of its recurrent mixers besides attention_mask
    # (Falcon-H1's `mamba_attention_mask`; None without padding, as transformers' create_recurrent_attention_mask)
    padding_mask_args: tuple[str, ...] = ()


# torchao's (one warning per optional CUDA extension its build cannot load: "Failed to load ..._C_mxfp8...so"),
# torch's pytree (torchao registers Enums as pytree constants at import, which torch now deprecates)
IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_optional_kernels() -> Iterator[None]:
    """transformers imports torchao's quantizer while it builds a model, and importing torchao logs warnings
    (IMPORT_NOISE_LOGGERS): lines on the CLI's stderr that say nothing about the plan. Those loggers are
    raised to errors for the build only."""
    logs = [logging.getLogger(name) for name in IMPORT_NOISE_LOGGERS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def causal_lm_from_config(config: HFConfig) -> nn.Module:
    """The causal LM transformers builds from `config` (AutoModelForCausalLM.from_config, transformers' own
    attention default: SDPA where the model has it) on the current default device: the meta device under
    the tracer. Every failure is one UserError naming the config."""
    from autoparallel.errors import UserError
    model_type = config.raw.get("model_type")
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise UserError(f"{config.source}: model_type {model_type!r} is built with transformers, which is not "
                        f"installed; pip install 'autoparallel[hf]'") from None
    version = transformers.__version__
    try:
        hf_config = AutoConfig.for_model(**config.raw)
    except Exception as e:  # an unknown model_type, a value its config class validates and rejects
        raise UserError(f"{config.source}: transformers {version} cannot read it ({type(e).__name__}: "
                        f"{_first_line(e)}); check model_type and the keys") from None
    try:
        with quiet_optional_kernels():
            model = AutoModelForCausalLM.from_config(hf_config)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise UserError(f"{config.source}: model_type {model_type!r} has no causal language model in "
                            f"transformers {version} (AutoModelForCausalLM); autoparallel plans decoder-only "
                            f"language models") from None
        raise UserError(f"{config.source}: transformers {version} cannot build {model_type!r} from it "
                        f"(ValueError: {_first_line(e)}); fix the config") from None
    except Exception as e:
        raise UserError(f"{config.source}: transformers {version} cannot build {model_type!r} from it "
                        f"({type(e).__name__}: {_first_line(e)}); fix the config") from None
    if not is_hf_causal_lm(model):  # no output head (get_output_embeddings() is None), or an encoder-decoder
        raise UserError(f"{config.source}: model_type {model_type!r} builds {type(model).__name__}, not a decoder-only "
                        f"causal language model (decoder layers and an output head), which is what autoparallel plans")
    return model


def config_values(config: object, key: str) -> list:
    """A config attribute for every layer: [its value] (None where it has none) for a homogeneous config, each
    layer's for a transformers heterogeneous one (`per_layer_config`: dots3's heads and latent ranks differ by
    layer), whose global read of a per-layer attribute raises."""
    per_layer = getattr(config, "per_layer_attributes", None)
    if per_layer and key in per_layer:
        return [getattr(layer, key, None) for layer in config.per_layer_config]
    return [getattr(config, key, None)]


def config_value(config: object, key: str) -> object:
    """A config attribute where every layer has the same value, else None (it varies by layer: no one value)."""
    values = config_values(config, key)
    return values[0] if all(v == values[0] for v in values) else None


@functools.cache
def source_of(obj: type | Callable) -> str:
    """inspect.getsource of a class or function, read once per object ("" where it has none: a builtin, code
    made at runtime): hf_parts and the tracer's per-projection questions read the same classes many times."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else "no message"


def is_hf_causal_lm(model: nn.Module) -> bool:
    """A decoder-only transformers PreTrainedModel with an output head (checked by class names: no
    import)."""
    names = {c.__name__ for c in type(model).__mro__}
    config = getattr(model, "config", None)
    return ("PreTrainedModel" in names and hasattr(model, "get_input_embeddings") and _output_head(model) is not None
            and not getattr(config, "is_encoder_decoder", False))


def hf_layer_list(model: nn.Module) -> str | None:
    """The path of a Hugging Face causal LM's block list as its base model runs it (hf_parts), else None.
    structure.find_layout and blocks.find_blocks take it as the blocks: a hybrid's layers of more than one class
    (Jamba's attention and Mamba layers), and a multimodal model's language layers where another tower holds as
    many layers of one class (MOSS-Transcribe's audio tower, which a text step never runs, had been taken)."""
    from autoparallel.errors import UserError

    if not is_hf_causal_lm(model):
        return None
    try:
        return hf_parts(model).layers
    except UserError:  # refused where it is run
        return None


def _output_head(model: nn.Module) -> nn.Module | None:
    """transformers' get_output_embeddings(): `lm_head` by default, whatever the class names it otherwise
    (BioGPT's `output_projection`, GPT-NeoX-Japanese's `embed_out`)."""
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _path_of(model: nn.Module, target: nn.Module | None) -> str | None:
    if target is None:
        return None
    return next((n for n, m in model.named_modules() if m is target), None)


def hf_parts(model: nn.Module) -> HFParts:
    """Find the pieces of an HF causal LM by structure: the base model's children around its block list."""
    from autoparallel.errors import UserError

    embed = _path_of(model, model.get_input_embeddings())
    if embed is None or "." not in embed:
        raise UserError(f"{type(model).__name__}: no token embedding inside a base model; only decoder-only "
                        f"causal LMs (model.embed_tokens / transformer.wte) are supported")
    base_path = embed.rpartition(".")[0]
    base = model.get_submodule(base_path)
    children = list(base.named_children())
    layers_idx = next((i for i, (_, c) in enumerate(children) if isinstance(c, nn.ModuleList)), None)
    if layers_idx is None:  # BERT's embedding sits in an embeddings module, beside the encoder's blocks
        raise UserError(f"{type(model).__name__}: its token embedding {embed} sits in {base_path} "
                        f"({type(base).__name__}), which holds no ModuleList of blocks; only decoder-only causal LMs "
                        f"whose base model holds the embedding and the blocks (model.embed_tokens and model.layers, "
                        f"transformer.wte and transformer.h) are supported")

    def full(name: str) -> str:
        return f"{base_path}.{name}"

    from autoparallel.trainer.structure import forward_order, mentioned_before, runs_around

    layers_name, blocks = children[layers_idx]
    kinds = dict(children)
    # in the order the base model's forward runs them (OPT registers its final norm before its blocks); a
    # module it runs on both sides (NanoChat's parameter-free norm) is in both lists
    order = forward_order(base, [n for n, c in children if n == layers_name or computes(c) or isinstance(c, nn.Dropout)])
    cut = order.index(layers_name)
    twice = runs_around(base, order, layers_name)
    if any(True for n in twice for _ in kinds[n].parameters()):
        raise UserError(f"{type(model).__name__}: {base_path}'s forward runs {sorted(twice)} both before and after "
                        f"its blocks with the same parameters, which pipeline stages cannot share; not supported")
    before, after = order[:cut], [n for n in order[:cut] if n in twice] + order[cut + 1:]
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    # per-layer embeddings (Gemma 4's E2B / E4B): their modules run beside the token embedding, by
    # causal_lm_forward's own rule (PerLayerInputs), not as an input projection or a position table
    per_layer = _per_layer_inputs(model, base, base_path, config, blocks)
    if per_layer is not None:
        ple = {per_layer.table, per_layer.projection, per_layer.norm}
        before, after = [n for n in before if full(n) not in ple], [n for n in after if full(n) not in ple]
    # floating-point tensors the base model holds itself are values its forward mixes in (CTRL's sinusoidal
    # position table), which causal_lm_forward would skip; integer and boolean ones are the causal masks and
    # position ids it builds itself (GPT-BigCode's `bias`, GPT-1's `position_ids`)
    own = [n for n, t in [*base.named_buffers(recurse=False), *base.named_parameters(recurse=False)]
           if t.is_floating_point()]
    if own:
        raise UserError(f"{type(model).__name__}: {base_path} holds {own} itself, which its forward reads and "
                        f"autoparallel's Hugging Face forward does not reproduce; this architecture is not supported "
                        f"there; pass a package.module:callable")
    positions = next((n for n in before if isinstance(kinds[n], nn.Embedding) and full(n) != embed), None)
    if positions is not None and "input_ids_shape" in inspect.signature(kinds[positions].forward).parameters:
        # Marian's, Pegasus's sinusoidal tables take the input's shape, not position ids: called as a learned
        # table their rows came out wrong (benchmarks/hf_coverage.py: DIFFERENT)
        raise UserError(f"{type(model).__name__}: {full(positions)} ({type(kinds[positions]).__name__}) builds "
                        f"positions from the input's shape, which autoparallel's Hugging Face forward does not "
                        f"call; this architecture is not supported there; pass a package.module:callable")
    dropout = next((full(n) for n in before if isinstance(kinds[n], nn.Dropout)), None)
    layerdrop = getattr(model.config, "layerdrop", 0) or 0
    if layerdrop > 0:  # OPT's, BART-style: the model's own forward skips blocks at random in training
        raise UserError(f"{type(model).__name__}: config.layerdrop={layerdrop} skips blocks at random in training, "
                        f"which autoparallel's Hugging Face forward does not do; set config.layerdrop = 0")
    # the rotary table: an `inv_freq` buffer (Llama's), or by name (GPT-J's keeps `embed_positions`, Gemma 3's
    # one inv_freq per layer type)
    rotary_name, rotary_mod = next(((n, c) for n, c in children if hasattr(c, "inv_freq") or "rotary" in n.lower()),
                                   (None, None))
    rotary = full(rotary_name) if rotary_name is not None else None
    by_type = rotary_mod is not None and "layer_type" in inspect.signature(rotary_mod.forward).parameters
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    source = source_of(type(base).forward)
    window, mixed = _windows(model.config, source)
    unread = _unread_window(model) if window is None else None
    if unread is not None:  # beyond it the model's own attention is local and autoparallel's would be global
        raise UserError(f"{type(model).__name__}: config.{unread[0]}={unread[1]} limits its attention layers to a "
                        f"sliding window that autoparallel's Hugging Face forward does not apply (it reads "
                        f"config.sliding_window); this architecture is not supported there")
    # RWKV's time mixing, Mamba-1's selective scan: a Python loop over the sequence, whose meta trace at 1024 tokens ran
    # past 5 minutes (`autoparallel plan`). Mamba-2's mixer scans in chunks (chunk_size; its torch path is whole-
    # tensor ops, as in the hybrids that hold it): a model of those alone runs (Mamba2ForCausalLM)
    chunked_ssm = any(hasattr(m, "chunk_size") and hasattr(m, "ssm_state_size") for m in model.modules())
    if not any(config_values(config, "num_attention_heads")) and not chunked_ssm:
        raise UserError(f"{type(model).__name__}: its config declares no attention heads (num_attention_heads), so "
                        f"its blocks mix tokens by something other than attention (a recurrence), which "
                        f"autoparallel's Hugging Face forward, tracer and cost model do not cover; this architecture "
                        f"is not supported there")
    # what runs on the token embeddings before the blocks: an input projection that changes their width (OPT's
    # project_in, which must run before the hidden-wide positions are added) and norms after the positions
    # (_embed_norms); anything else there has no place in causal_lm_forward (XGLM's sinusoidal table, a buffer
    # module with a forward of its own): one error rather than a forward without it
    widen = [n for n in before if (f := linear_features(kinds[n])) is not None and f[0] != f[1] and n not in twice]
    norms = _embed_norms(base, before, kinds, positions, twice)
    by_layer = _rotary_by_layer(model, base, base_path, config, len(blocks))
    handled = {embed.rpartition(".")[2], positions, rotary_name, *widen, *twice, *norms,
               *(["rotary_embs"] if by_layer else []),
               *(n.rpartition(".")[2] for n in ((per_layer.table, per_layer.projection, per_layer.norm)
                                                 if per_layer is not None else ()))}
    skipped = [n for n in mentioned_before(base, [n for n, _ in children], layers_name)
               if n not in handled and not isinstance(kinds[n], nn.Dropout)]
    if skipped:
        raise UserError(f"{type(model).__name__}: {base_path}'s forward runs {skipped} "
                        f"({', '.join(type(kinds[n]).__name__ for n in skipped)}) before its blocks, which autoparallel's "
                        f"Hugging Face forward does not reproduce; this architecture is not supported there")
    head = _head_path(model, base_path)
    # the LM's forward scales the base model's output before its head (Inkling's division by
    # config.logits_mup_width_multiplier): through a head without a bias that is the same scaling of the logits
    # (_logit_ops applies it there); anything else is one error
    scaled = _pre_head_scale(model)
    if scaled is not None and (scaled[1] is None or getattr(model.get_output_embeddings(), "bias", None) is not None):
        raise UserError(f"{type(model).__name__}: its forward {'divides' if scaled[0] == 'div' else 'multiplies'} the "
                        f"base model's output by self.{scaled[2]}{f'={scaled[1]}' if scaled[1] is not None else ''} "
                        f"before its head {head}, which autoparallel's Hugging Face forward does not; this "
                        f"architecture is not supported there; pass a package.module:callable")
    # hyper-connections (DeepSeek V4's, HY-V4's, Qwen4-Exp's): the forward widens the embeddings into several
    # residual streams before the blocks (`inputs_embeds.unsqueeze(..)`, `hidden_states.repeat(1, 1, hc_count)`),
    # and the blocks take and return that stack; causal_lm_forward runs one stream (the trainer failed on the shapes).
    # Checked before the blocks' masks and rotary tables: it is the first thing such a forward does otherwise
    ahead = source.split(f"self.{layers_name}", 1)[0]
    if re.search(r"=\s*(inputs_embeds|hidden_states)\.(unsqueeze|expand|repeat|view|reshape)\(", ahead):
        streams = next((f"config.{k}={v} " for k in ("hc_mult", "hc_count", "num_residual_streams")
                        if isinstance(v := getattr(config, k, None), int) and not isinstance(v, bool)), "")
        raise UserError(f"{type(model).__name__}: {base_path}'s forward reshapes the token embeddings before its "
                        f"blocks (hyper-connections: {streams or 'several '}residual streams per token, which the "
                        f"blocks take and return and which are merged after them), which autoparallel's Hugging Face "
                        f"forward does not run (one stream); this architecture is not supported there; pass a "
                        f"package.module:callable")
    # a base model that hands its blocks more than the hidden states by position (Zamba2's token embeddings, layer
    # index, padding mask and causal mask): causal_lm_forward passes the hidden states and BLOCK_ARGS by keyword
    # (by the rule of _check_passed_block_args: the values it computes itself or needs not, and the base model's own
    # inputs, None in a causal LM's training step, pass)
    positional = _positional_block_args(source, layers_name)
    names = [p for p in inspect.signature(blocks[0].forward).parameters][1:len(positional) + 1] if len(blocks) else []
    inputs = set(inspect.signature(type(base).forward).parameters)
    # (Gemma 4's per-layer input: computed where the config sets hidden_size_per_layer_input, PerLayerInputs, and
    # None in the base model's forward where it does not)
    computed = {*BLOCK_ARGS, *_UNNEEDED_BLOCK_ARGS, "per_layer_input"}
    unknown = [(a, n) for (a, node), n in zip(positional, names, strict=False) if n not in computed
               and not (isinstance(node, ast.Name) and node.id in inputs
                        or isinstance(node, ast.Constant) and node.value is None)]
    if unknown:
        raise UserError(f"{type(model).__name__}: {base_path}'s forward passes its blocks "
                        f"({', '.join(sorted({type(b).__name__ for b in blocks}))}) "
                        f"{', '.join(a for a, _ in unknown)} by position (as {', '.join(n for _, n in unknown)}) "
                        f"beside the hidden states, which autoparallel's Hugging Face forward does not compute; this "
                        f"architecture is not supported there; pass a package.module:callable")
    layer_types = [_find_layer_type(b) for b in blocks]
    # a convolution in a block is a state-space or short-convolution mixer (Mamba, Jamba, Falcon-H1, Qwen3-Next's
    # linear attention, LFM2): it reads `attention_mask` as the [B, S] padding mask. Where the block's layer type
    # is one transformers hands that mask (masking_utils: "linear_attention", "conv"), causal_lm_forward does so
    # too; elsewhere it would pass the attention layers' causal mask (the trainer failed on the shapes, the meta
    # trace broadcast them silently)
    padding_types = _padding_mask_types(layer_types)
    # block arguments other than attention_mask that the base model's forward hands the padding mask of a recurrent
    # layer type (masking_utils' create_recurrent_attention_mask: Falcon-H1's `mamba_attention_mask`, which its
    # Mamba-2 mixer multiplies padded tokens by): causal_lm_forward hands them the [B, S] mask
    padding_args = _padding_mask_args(source, blocks)
    conv = next((f"{full(layers_name)}.{i}.{n}" for i, b in enumerate(blocks)
                 if layer_types[i] not in padding_types and not padding_args
                 for n, m in b.named_modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
    if conv is not None:
        raise UserError(f"{type(model).__name__}: {conv} is a convolution inside a block (a state-space or "
                        f"convolution mixer) whose layer type transformers gives no padding mask of its own, which "
                        f"autoparallel's Hugging Face forward does not run; pass a package.module:callable")
    unrotated = (_check_rotary_tables(model, rotary, rotary_mod, full(layers_name), layer_types, padding_types)
                 if by_type else ())
    # a looped (recurrent-depth) model runs a range of its layers several times per forward (Dory's
    # n_recurrent_loops); causal_lm_forward runs each layer once (hf_coverage: DIFFERENT logits)
    loops = next(((k, v) for k in ("n_recurrent_loops", "num_recurrent_loops", "recurrent_loops")
                  if isinstance(v := getattr(config, k, None), int) and not isinstance(v, bool) and v > 1), None)
    if loops is not None:
        raise UserError(f"{type(model).__name__}: config.{loops[0]}={loops[1]} runs some of its layers {loops[1]} "
                        f"times a forward, which autoparallel's Hugging Face forward does not (each layer runs "
                        f"once); this architecture is not supported there; pass a package.module:callable")
    accepted = inspect.signature(blocks[0].forward).parameters if len(blocks) else {}
    kv_store = "shared_kv_states" in accepted
    # what a block hands later blocks besides the hidden states: within one pipeline stage causal_lm_forward
    # passes it, across stages it would not arrive (the trainer's stages send the hidden states only)
    shared = (getattr(config, "num_kv_shared_layers", 0) or 0) if kv_store else 0
    no_pipeline = "; ".join(
        ([f"config.hidden_size_per_layer_input={per_layer.width}: every block takes its slice of per-layer inputs "
          f"computed beside the token embedding"] if per_layer is not None else [])
        + ([f"config.num_kv_shared_layers={shared}: its last {shared} layers reuse earlier layers' keys and "
            f"values"] if shared else []))
    bias = _block_bias(base, base_path, blocks[0]) if len(blocks) and rotary is None else None
    none_args = _required_block_args(model, blocks[0], rotary is not None, bias) if len(blocks) else ()
    if "shared" in (getattr(config, "indexer_types", None) or ()):
        # GLM-5's DSA: a "shared" layer reuses the top-k of the layer before it, which its base forward passes as
        # `prev_topk_indices` from layer to layer (and no pipeline stage could); "full" layers select their own
        raise UserError(f"{type(model).__name__}: config.indexer_types has 'shared' layers, which reuse an earlier "
                        f"layer's top-k selection that autoparallel's Hugging Face forward does not pass between "
                        f"blocks; this architecture is not supported there (every layer 'full' is); pass a "
                        f"package.module:callable")
    passed = _passed_keywords(source)
    for block in {type(b): b for b in blocks}.values():
        _check_passed_block_args(model, block, passed, (*none_args, *padding_args, *([bias.arg] if bias else [])),
                                 inputs)
    table = kinds[positions] if positions is not None else None
    takes_all = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    # a table whose forward takes position ids by keyword beside other arguments (OPT's and BioGPT's, the mask
    # first; Whisper's, the input ids first, which it reads only for their length): called with the ids by keyword
    keyword = table is not None and "position_ids" in inspect.signature(table.forward).parameters
    return HFParts(embed=embed, positions=full(positions) if positions is not None else None, dropout=dropout,
                   layers=full(layers_name), after=tuple(full(n) for n in after if computes(kinds[n])),
                   rotary=rotary, rotary_by_layer_type=by_type, rotary_grids=hasattr(rotary_mod, "mrope_section"),
                   head=head, attn_implementation=impl,
                   sliding_window=window, mixed_windows=mixed, attention_chunk=_attention_chunk(model.config, source),
                   none_args=none_args, embed_scale=_embed_scale(base),
                   logit_ops=_logit_ops(model),
                   before=tuple(full(n) for n in before if n in widen or n in twice),
                   # a table that takes the mask counts unpadded tokens only where the base model's forward does
                   # so itself (OPT's cumsum); BioGPT's forward gives the same table position ids 0..S-1
                   positions_by_mask=keyword and "cumsum(" in source, positions_by_keyword=keyword,
                   block_args=tuple(a for a in BLOCK_ARGS if takes_all or a in accepted),
                   # Doge's forward builds the causal mask even where SDPA's is_causal would do: its attention adds
                   # to it; DeepSeek V3.2's indexer reads it (a keyword, or a key of the mask's kwargs dict)
                   explicit_mask=re.search(r"allow_is_causal_skip['\"]?\s*[=:]\s*False", source) is not None,
                   padding_mask_types=padding_types, kv_store=kv_store, unrotated_types=unrotated,
                   embed_norms=tuple(full(n) for n in norms), bias=bias,
                   bool_mask=re.search(r"create_causal_mask\([^()]*\)\.to\(torch\.bool\)", source) is not None,
                   shifts_labels=shifts_labels(model), per_layer=per_layer, no_pipeline=no_pipeline,
                   rotary_by_layer=by_layer, padding_mask_args=padding_args)


def _rotary_by_layer(model: nn.Module, base: nn.Module, base_path: str, config: object,
                     n: int) -> tuple[str | None, ...]:
    """Each block's rotary module where the base model holds one per distinct per-layer rope theta (Granite-SWA's
    `rotary_embs`, one per non-zero entry of config.layer_rope_theta) and its forward hands block i the table of
    theta layer_rope_theta[i], None for theta 0 (NoPE): HFParts.rotary_by_layer. () for a base model without
    such tables; one error where a layer's theta has no module."""
    from autoparallel.errors import UserError

    tables, thetas = getattr(base, "rotary_embs", None), getattr(config, "layer_rope_theta", None)
    source = source_of(type(base).forward)
    if not (isinstance(tables, nn.ModuleList) and isinstance(thetas, (list, tuple)) and "self.rotary_embs" in source
            and "layer_rope_theta[" in source):
        return ()
    by_theta: dict[float, int] = {}
    for j, table in enumerate(tables):
        theta = (getattr(getattr(table, "config", None), "rope_parameters", None) or {}).get("rope_theta")
        if not hasattr(table, "inv_freq") or _number(theta) is None:
            raise UserError(f"{type(model).__name__}: {base_path}.rotary_embs.{j} ({type(table).__name__}) is not a "
                            f"rotary table of one rope theta, which autoparallel's Hugging Face forward reads "
                            f"config.layer_rope_theta by; this architecture is not supported there")
        by_theta.setdefault(float(theta), j)
    missing = [i for i in range(n) if i >= len(thetas) or thetas[i] and float(thetas[i]) not in by_theta]
    if missing:
        raise UserError(f"{type(model).__name__}: layer {missing[0]}'s rope theta (config.layer_rope_theta) has no "
                        f"table in {base_path}.rotary_embs (thetas {sorted(by_theta)}); fix the config")
    return tuple(f"{base_path}.rotary_embs.{by_theta[float(thetas[i])]}" if thetas[i] else None for i in range(n))


def _per_layer_inputs(model: nn.Module, base: nn.Module, base_path: str, config: object,
                      blocks: nn.ModuleList) -> PerLayerInputs | None:
    """The per-layer embeddings of a base model whose config sets hidden_size_per_layer_input (Gemma 4's E2B / E4B,
    PerLayerInputs), None without them. causal_lm_forward computes them as the base model's get_per_layer_inputs and
    project_per_layer_inputs do; a base model whose pieces or methods are not those (Gemma 3n's, whose blocks also
    take AltUp's stacked streams) is one error."""
    from autoparallel.errors import UserError

    width = getattr(config, "hidden_size_per_layer_input", None)
    if not width:
        return None
    names = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")
    pieces = [getattr(base, n, None) for n in names]
    scales = [_number(getattr(base, a, None)) for a in ("per_layer_model_projection_scale", "per_layer_input_scale")]

    def source(method: str) -> str:
        fn = getattr(type(base), method, None)
        return source_of(fn) if callable(fn) else ""

    takes = len(blocks) > 0 and "per_layer_input" in inspect.signature(blocks[0].forward).parameters
    project = source("project_per_layer_inputs")
    if not (isinstance(pieces[0], nn.Embedding) and linear_features(pieces[1]) is not None and is_norm_like(pieces[2])
            and None not in scales and takes and "self.embed_tokens_per_layer(" in source("get_per_layer_inputs")
            and all(f"self.{n}" in project for n in (*names[1:], "per_layer_model_projection_scale",
                                                     "per_layer_input_scale"))):
        raise UserError(f"{type(model).__name__}: config.hidden_size_per_layer_input={width} feeds each block a "
                        f"slice of a second, per-layer embedding, which autoparallel's Hugging Face forward computes "
                        f"only as Gemma 4's base model does ({', '.join(names)}); {base_path} "
                        f"({type(base).__name__}) computes it otherwise: this architecture is not supported there; "
                        f"pass a package.module:callable")
    return PerLayerInputs(table=f"{base_path}.{names[0]}", projection=f"{base_path}.{names[1]}",
                          norm=f"{base_path}.{names[2]}", width=int(width), projection_scale=scales[0],
                          input_scale=scales[1])


def per_layer_inputs(model: nn.Module, spec: PerLayerInputs, ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """[B, S, layers, width]: the base model's get_per_layer_inputs (the table's rows of the tokens, cut per layer)
    and project_per_layer_inputs (the token embeddings projected, scaled, cut per layer, normalized; added to the
    rows, the sum scaled), op for op. Cut by the width rather than by the batch and sequence of the ids: under
    sequence parallelism the table's and the projection's outputs hold this rank's chunk of the sequence."""
    rows = _get(model, spec.table)(ids)
    rows = rows.reshape(*rows.shape[:-1], -1, spec.width)
    projected = _get(model, spec.projection)(embeds) * spec.projection_scale
    projected = _get(model, spec.norm)(projected.reshape(*projected.shape[:-1], -1, spec.width))
    return (projected + rows) * spec.input_scale


def shifts_labels(model: nn.Module) -> bool:
    """Whether the causal LM's own forward shifts its labels (HF's convention: labels aligned with the inputs,
    position t scored against labels[t + 1]): it calls transformers' loss_function (ForCausalLMLoss) or shifts
    them itself. The decoders of encoder-decoder families (BART, mBART, PLBART, TrOCR, Whisper) apply a plain
    CrossEntropyLoss to labels[t]: their callers pass labels already shifted, and the trainer follows the model
    (its loss is the model's own on the same batch)."""
    source = source_of(type(model).forward)
    return not source or any(s in source for s in ("loss_function(", "shift_labels", "shift_logits",
                                                   "labels[..., 1:]", "labels[:, 1:]"))


def _embed_norms(base: nn.Module, before: list[str], kinds: dict[str, nn.Module], positions: str | None,
                 twice: set[str]) -> list[str]:
    """The norms (is_norm_like) the base model's forward runs on the embeddings before its blocks, which
    causal_lm_forward runs after adding the positions: only where the forward names the norm after the position
    table (BART's layernorm_embedding; BLOOM's word_embeddings_layernorm, without positions). A norm before the
    positions stays unhandled (hf_parts' one error)."""
    from autoparallel.trainer.structure import forward_order

    norms = [n for n in before if is_norm_like(kinds[n]) and n not in twice]
    if positions is None:
        return norms
    order = forward_order(base, [positions, *norms])
    return [n for n in norms if order.index(n) > order.index(positions)]


def _block_bias(base: nn.Module, base_path: str, block: nn.Module) -> BlockBias | None:
    """The per-head position bias a block requires (an argument of BIAS_BUILDERS without a default) where the base
    model holds its builder and its head count (`num_heads`): BLOOM's `alibi`, MPT's `position_bias`."""
    params = inspect.signature(block.forward).parameters
    heads = getattr(base, "num_heads", None)
    for arg, (builder, _) in BIAS_BUILDERS.items():
        p = params.get(arg)
        if p is not None and p.default is inspect.Parameter.empty and callable(getattr(base, builder, None)) \
                and isinstance(heads, int):
            return BlockBias(arg=arg, base=base_path)
    return None


def _head_path(model: nn.Module, base_path: str) -> str:
    """The path of the output head (get_output_embeddings()), which causal_lm_forward runs on the base model's
    output; any other module of the LM that computes (BERT's `cls` transform around its head, Inkling 2's
    logit_softcap) it would skip: one error."""
    from autoparallel.errors import UserError

    head = _path_of(model, _output_head(model))
    if head is None:
        raise UserError(f"{type(model).__name__}: get_output_embeddings() gives none of its modules; only causal LMs "
                        f"with an output head are supported")
    base_root = base_path.partition(".")[0]
    around = [n for n, c in model.named_children() if n not in (base_root, head) and computes(c)]
    if around:
        kinds = ", ".join(type(model.get_submodule(n)).__name__ for n in around)
        raise UserError(f"{type(model).__name__}: {around} ({kinds}), beside its base model {base_root} and output "
                        f"head {head}, would not run in autoparallel's Hugging Face forward (the base model's pieces, "
                        f"then the head); this architecture is not supported there; pass a package.module:callable")
    return head


def _rotary_tables(rotary: nn.Module) -> list[str]:
    """The layer types a per-layer-type rotary module holds a table for: its forward reads `{type}_inv_freq`."""
    return sorted(n.removesuffix("_inv_freq") for n, _ in rotary.named_buffers(recurse=False)
                  if n.endswith("_inv_freq") and not n.endswith("_original_inv_freq"))


def _check_rotary_tables(model: nn.Module, rotary: str, rotary_mod: nn.Module, layers: str,
                         kinds: list[str | None], recurrent: tuple[str, ...] = ()) -> tuple[str, ...]:
    """causal_lm_forward gives each block the rotary table of its layer type. The layer types the config gives no
    rotary parameters (`rope_parameters[type]` None: Ergo's full-attention layers use no position embedding, and
    its base model passes them None) and the `recurrent` ones without a table (_padding_mask_types: LFM3's "conv"
    layers, a short convolution that reads no positions, which its base model passes None) are returned; a block of
    any other type without a table is one error (DeepSeek V4's attention picks "main" or "compress" itself from a
    dict its base model passes)."""
    from autoparallel.errors import UserError

    tables = _rotary_tables(rotary_mod)
    params = getattr(getattr(rotary_mod, "config", None), "rope_parameters", None)
    unrotated = tuple(sorted({k for k in kinds if k not in tables and (k in recurrent or isinstance(params, dict)
                                                                       and k in params and params[k] is None)}))
    for i, kind in enumerate(kinds):
        if kind not in tables and kind not in unrotated:
            raise UserError(f"{type(model).__name__}: {layers}.{i} is a layer of type {kind!r}, for which {rotary} "
                            f"({type(rotary_mod).__name__}) holds no rotary table (it holds {tables}); autoparallel's "
                            f"Hugging Face forward gives each block the table of its layer type, so this architecture "
                            f"is not supported there; pass a package.module:callable")
    return unrotated


def _positional_block_args(source: str, layers_name: str) -> list[tuple[str, ast.expr]]:
    """The arguments a base model's forward (`source`) passes its blocks by position after the hidden states, (as
    written, the expression) (`for i, layer in enumerate(self.layers): layer(h, original_hidden_states, i, ...)`);
    [] where it passes the rest by keyword, or its source does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    for loop in ast.walk(tree):
        if not (isinstance(loop, ast.For) and f"self.{layers_name}" in ast.unparse(loop.iter)):
            continue
        target = loop.target.elts[-1] if isinstance(loop.target, ast.Tuple) else loop.target
        if not isinstance(target, ast.Name):
            continue
        for node in ast.walk(loop):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == target.id
                    and len(node.args) > 1):
                return [(ast.unparse(a), a) for a in node.args[1:]]
    return []


def _padding_mask_args(source: str, blocks: nn.ModuleList) -> tuple[str, ...]:
    """The keywords, other than attention_mask, by which a base model's forward (`source`) hands its blocks the
    [B, S] padding mask of a recurrent layer type: `kw=masks["linear_attention"]` (a key of _padding_mask_types) or
    `kw=create_recurrent_attention_mask(...)`, where every block takes `kw` (HFParts.padding_mask_args)."""
    if not len(blocks):
        return ()
    found = []
    for kw, values in _passed_keywords(source).items():
        for v in values:
            key = v.slice.value if isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Constant) else None
            built = (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                     and v.func.id == "create_recurrent_attention_mask")
            if kw != "attention_mask" and (built or isinstance(key, str) and _padding_mask_types([key])):
                found.append(kw)
    return tuple(kw for kw in dict.fromkeys(found)
                 if all(kw in inspect.signature(b.forward).parameters for b in blocks))


def _padding_mask_types(kinds: list[str | None]) -> tuple[str, ...]:
    """The layer types among `kinds` that transformers gives the [B, S] padding mask rather than a causal one
    (masking_utils' table: recurrent mixers such as MiniMax's lightning attention zero padded tokens themselves)."""
    try:
        from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING as MASKS
        from transformers.masking_utils import create_recurrent_attention_mask
    except ImportError:  # a transformers without recurrent layer types
        return ()
    return tuple(sorted({k for k in kinds if k is not None and MASKS.get(k) is create_recurrent_attention_mask}))


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _embed_scale(base: nn.Module) -> float:
    """The multiplier a base model's forward applies to the token embeddings (Granite's
    embedding_multiplier, HRM's embedding_scale); 1 for the rest (Gemma scales inside its embedding)."""
    for attr in ("embedding_multiplier", "embedding_scale"):
        value = _number(getattr(base, attr, None))
        if value is not None:
            return value
    return 1.0


def _pre_head_scale(model: nn.Module) -> tuple[str, float | None, str] | None:
    """("div" | "mul", the number or None, the attribute) where the causal LM's own forward scales the base model's
    output by self.<attribute> before its head (Inkling: `outputs.last_hidden_state / self.config.
    logits_mup_width_multiplier`), else None."""
    found = re.search(r"=\s*outputs(?:\.last_hidden_state|\[0\])\s*([/*])\s*self\.([\w.]+)",
                      source_of(type(model).forward))
    if found is None:
        return None
    value = functools.reduce(lambda o, a: getattr(o, a, None), found[2].split("."), model)
    return ("div" if found[1] == "/" else "mul"), _number(value), found[2]


def _logit_ops(model: nn.Module) -> tuple[tuple[str, float], ...]:
    """What the causal LM's own forward does to the head's logits, read from the attributes it uses:
    a scaling of the head's input by a number (Inkling's, `_pre_head_scale`: the same on the logits of a head
    without a bias, first), Cohere's logit_scale (x), Granite's logits_scaling (/; HyperCLOVA X's x), Falcon-H1's
    lm_head_multiplier (x), Gemma 2/3's final_logit_softcapping and RecurrentGemma's logits_soft_cap
    (cap * tanh(logits / cap))."""
    config = model.config
    ops: list[tuple[str, float]] = []
    pre = _pre_head_scale(model)
    if pre is not None and pre[1] is not None:  # a head with a bias was refused (hf_parts)
        ops.append((pre[0], pre[1]))
    scale = _number(getattr(model, "logit_scale", None))
    if scale is not None:
        ops.append(("mul", scale))
    scaling = _number(getattr(config, "logits_scaling", None))
    if scaling is not None:
        # Granite divides by it, HyperCLOVA X multiplies (MuP): which one, the LM's own forward says
        ops.append(("mul" if re.search(r"\*\s*self\.config\.logits_scaling", source_of(type(model).forward))
                    else "div", scaling))
    # Falcon-H1's head output times lm_head_multiplier (its base model's copy of the config's)
    multiplier = _number(getattr(config, "lm_head_multiplier", None))
    if multiplier is not None and "lm_head_multiplier" in source_of(type(model).forward):
        ops.append(("mul", multiplier))
    for attr in ("final_logit_softcapping", "logits_soft_cap"):
        cap = _number(getattr(config, attr, None))
        if cap:
            ops.append(("softcap", cap))
    return tuple(ops)


def apply_logit_ops(logits: torch.Tensor, ops: tuple[tuple[str, float], ...]) -> torch.Tensor:
    for op, value in ops:
        logits = logits * value if op == "mul" else logits / value if op == "div" else torch.tanh(logits / value) * value
    return logits




def _required_block_args(model: nn.Module, block: nn.Module, rotary: bool,
                         bias: BlockBias | None = None) -> tuple[str, ...]:
    """Required arguments of a block's forward beyond the hidden states, BLOCK_ARGS and the position bias
    causal_lm_forward builds (`bias`: BLOOM's and MPT's ALiBi), each of which causal_lm_forward passes as None.
    Only ALiBi's `alibi` qualifies, and only in a model with rotary embeddings that does not use ALiBi (Falcon's
    blocks require the argument and take None then); any other is one clear error rather than a wrong forward."""
    from autoparallel.errors import UserError

    if getattr(model.config, "alibi", False) is True:
        # transformers >= 5.25 folds Falcon's ALiBi bias into the attention mask its model builds (the blocks no
        # longer take `alibi`): the mask autoparallel passes would drop it, a silently different model
        raise UserError(f"{type(model).__name__}: config.alibi is set; autoparallel's Hugging Face path does not "
                        f"compute ALiBi position biases (ALiBi attention is not supported); use a model with rotary "
                        f"or learned positions")
    params = [p for p in inspect.signature(block.forward).parameters.values()
              if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)][1:]
    missing = tuple(p.name for p in params if p.default is inspect.Parameter.empty and p.name not in BLOCK_ARGS
                    and (bias is None or p.name != bias.arg))
    for name in missing:
        if name != "alibi" or not rotary:  # (config.alibi was refused above)
            # (an ALiBi bias is computed only where the base model holds a builder of BIAS_BUILDERS)
            why = ("ALiBi attention is not supported without BLOOM's or MPT's builder on the base model; use a model "
                   "with rotary or learned positions" if name == "alibi"
                   else "this architecture is not supported there; pass a package.module:callable")
            raise UserError(f"{type(model).__name__}: its blocks require the argument {name!r}, which autoparallel's "
                            f"Hugging Face path does not compute ({why})")
    return missing


# block arguments a base model passes that carry no value the forward needs: the generation cache and its flags
# (causal_lm_forward trains without a cache), and the dict of Gemma 4's shared keys and values (HFParts.kv_store)
# (and GLM-5's `prev_topk_indices`, which only its "shared" indexer layers read: those are refused by config)
_UNNEEDED_BLOCK_ARGS = frozenset(("cache", "past_key_values", "past_key_value", "layer_past", "use_cache",
                                  "output_attentions", "output_router_logits", "cache_position", "shared_kv_states",
                                  "prev_topk_indices"))


def _passed_keywords(source: str) -> dict[str, list[ast.expr]]:
    """keyword -> the values the calls in a base model's forward (`source`) pass it ({} where it does not parse)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return {}
    calls: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg is not None:
                    calls.setdefault(kw.arg, []).append(kw.value)
    return calls


def _check_passed_block_args(model: nn.Module, block: nn.Module, calls: dict[str, list[ast.expr]],
                             none_args: tuple[str, ...], inputs: set[str]) -> None:
    """A block argument with a default that the base model's forward computes and passes by keyword (`calls`,
    `_passed_keywords`: Beam's `attention_scaling`, its NoPE layers' position-dependent query scale) would take
    its default in causal_lm_forward, which passes BLOCK_ARGS only: a silently different model, so one error. An
    argument the base forward only hands on from its own `inputs` (GPT-2's `encoder_hidden_states`) is None in a
    causal LM's training step, as the default is."""
    from autoparallel.errors import UserError

    params = list(inspect.signature(block.forward).parameters.values())[1:]
    for p in params:
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            continue
        if p.name in BLOCK_ARGS or p.name in none_args or p.name in _UNNEEDED_BLOCK_ARGS:
            continue
        if any(not (isinstance(v, ast.Name) and v.id in inputs or isinstance(v, ast.Constant) and v.value is None)
               for v in calls.get(p.name, ())):
            raise UserError(f"{type(model).__name__}: its base model passes its blocks ({type(block).__name__}) the "
                            f"argument {p.name!r}, which autoparallel's Hugging Face forward does not compute (the "
                            f"blocks would take its default: a different model); this architecture is not "
                            f"supported there; pass a package.module:callable")


def computes(module: nn.Module) -> bool:
    """Whether a module around the blocks computes something a pipeline stage must own: it holds
    parameters, or it is a parameter-free leaf that is neither a dropout nor a table of buffers (OLMo's
    final LayerNorm computes; rotary tables, Llama's `inv_freq` or GPT-J's and Gemma 3's own buffers, do
    not: every stage's blocks need them). A stage drops the modules that compute and that it does not own."""
    if any(True for _ in module.parameters()):
        return True
    return (not any(True for _ in module.children()) and not isinstance(module, nn.Dropout)
            and not any(True for _ in module.buffers()))


def _builds(source: str, builder: str) -> bool:
    """Whether a base model's forward (`source`) masks with transformers' `builder`: where it builds only the plain
    `create_causal_mask` (Moshi's, whose config carries a sliding_window that reaches flash-attention kernels
    only), a window or chunk in its config does not change what its SDPA or eager attention sees. A forward that
    names neither (its source unreadable, or masks of its own) is taken at its config's word."""
    return builder in source or "create_causal_mask" not in source


def _attention_chunk(config: object, source: str = "") -> int | None:
    """The chunk length of an HF config's chunked-attention layers (Llama 4: a query attends to the keys of its own
    attention_chunk_size-token chunk only), None without such layers."""
    chunk = getattr(config, "attention_chunk_size", None)
    if not _builds(source, "create_chunked_causal_mask"):
        return None
    return int(chunk) if chunk and "chunked_attention" in (getattr(config, "layer_types", None) or ()) else None


def _unread_window(model: nn.Module) -> tuple[str, int] | None:
    """(name, size) of a window size the model's attention reads from its config under another name than
    sliding_window (Inkling's `self.sliding_window = config.sliding_window_size`), else None."""
    try:
        module_source = inspect.getsource(inspect.getmodule(type(model)))
    except (OSError, TypeError):
        return None
    for name, value in vars(model.config).items():
        if ("window" in name and name != "sliding_window" and _number(value)
                and re.search(rf"sliding_window\s*=\s*(self\.)?config\.{name}\b", module_source)):
            return name, int(value)
    return None


def _windows(config: object, source: str = "") -> tuple[int | None, bool]:
    """(sliding window, whether only some layers use it) from an HF config and its base model's forward."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return None, False
    if not _builds(source, "create_sliding_window_causal_mask"):
        return None, False
    return int(window), types is not None and any(t != "sliding_attention" for t in types)


def transposed_linear(mod: nn.Module | None) -> tuple[int, int] | None:
    """(in_features, out_features) of a Linear that stores its weight transposed, [in, out], and
    computes x @ weight + bias: transformers' Conv1D (GPT-2's c_attn, c_fc, c_proj), recognized by its
    interface (nx inputs, nf outputs, weight [nx, nf]) rather than its class. Tensor parallelism gives
    it the colwise / rowwise roles of an nn.Linear with the shards on the transposed dims."""
    nx, nf, weight = getattr(mod, "nx", None), getattr(mod, "nf", None), getattr(mod, "weight", None)
    if (isinstance(nx, int) and isinstance(nf, int) and isinstance(weight, torch.Tensor)
            and tuple(weight.shape) == (nx, nf)):
        return nx, nf
    return None


def linear_features(mod: nn.Module | None) -> tuple[int, int] | None:
    """(in_features, out_features) of an nn.Linear or a transposed one (Conv1D); None otherwise."""
    if isinstance(mod, nn.Linear):
        return mod.in_features, mod.out_features
    return transposed_linear(mod)


def is_norm_like(mod: nn.Module | None) -> bool:
    """A norm by what it holds, not its class (HF's LlamaRMSNorm, Qwen3MoeRMSNorm and GemmaRMSNorm are
    plain nn.Modules): a leaf whose parameters are all vectors of one length (a scale, maybe a bias),
    which is not a Linear / Embedding. Under tp such a module's weight stays a replicated copy per rank,
    and the trainer must keep those copies equal (sequence-parallel or head-parallel gradient sums). The
    tracer records it per parametric op (ParamOp.norm_like) for the planner's rules of the same name."""
    if mod is None or isinstance(mod, (nn.Linear, nn.Embedding)) or any(True for _ in mod.children()):
        return False
    shapes = {tuple(p.shape) for p in mod.parameters(recurse=False)}
    return len(shapes) == 1 and len(next(iter(shapes))) == 1


def normalized_width(mod: nn.Module | None) -> int | None:
    """A norm's declared width (normalized_shape[-1], nn.LayerNorm / nn.RMSNorm), None where it declares none."""
    shape = getattr(mod, "normalized_shape", None)
    return int(shape[-1]) if shape else None


# attributes an attention keeps its head counts in and may reshape with (OPT's view(bsz, -1, self.num_heads,
# head_dim), GPT-J's _split_heads(x, self.num_attention_heads, ...))
HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "n_kv_heads")


def head_counts(parent: nn.Module | None) -> set[int]:
    """The head counts `parent` keeps in HEAD_COUNT_ATTRS (its own attributes, ints)."""
    attrs = vars(parent) if parent is not None else {}
    return {v for a in HEAD_COUNT_ATTRS if isinstance(v := attrs.get(a), int) and not isinstance(v, bool) and v > 0}


def projection_heads(parent: nn.Module | None, out_features: int) -> tuple[int, int] | None:
    """(heads, unit) of a projection of `parent` (an attention: an int head_dim) with `out_features` outputs, as
    tensor parallelism splits it: out_features // head_dim heads of head_dim, or, for a per-head projection (one
    feature per head, as wide as one of the parent's head counts and no count's heads * head_dim: Laguna's
    per-head g_proj), out_features heads of 1. None where the parent has no head_dim. A column split must give
    each rank whole heads (the trainer's tensor_parallel._check_heads refuses any other, and the tracer records
    the count, ParamOp.heads, for the planner's CostModel._runnable). An attention that reshapes its output to
    the width of its input (reshapes_to_input_width: TrOCR's) is one unit, out_features wide: no split runs."""
    head_dim = getattr(parent, "head_dim", None)
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        return None
    if reshapes_to_input_width(parent):
        return 1, out_features
    counts = head_counts(parent)
    if out_features in counts and out_features != head_dim and all(c * head_dim != out_features for c in counts):
        return out_features, 1
    return out_features // head_dim, head_dim


def reshapes_to_input_width(parent: nn.Module) -> bool:
    """Whether an attention's forward reshapes its heads' output to the width it reads off its input
    (`bsz, tgt_len, embed_dim = hidden_states.size()` ... `.reshape(bsz, tgt_len, embed_dim)`: TrOCR's): under a
    head split the input stays whole, so no local head count makes that reshape fit (the trainer crashed on it)."""
    source = source_of(type(parent).forward)
    dims = re.search(r"(\w+),\s*(\w+),\s*(\w+)\s*=\s*hidden_states\.(?:size\(\)|shape)", source)
    return dims is not None and re.search(rf"\.reshape\(\s*{dims[1]},\s*{dims[2]},\s*{dims[3]}\s*\)", source) is not None


def runs_without_grad(module: nn.Module) -> bool:
    """Whether a module's forward is decorated to run without autograd (`@torch.no_grad()`,
    `@torch.inference_mode()`): DeepSeek V3.2's top-k indexer. The tracer sees the same as ParamOp.no_grad
    (cost_models.facts.no_grad_modules), which the planner keeps whole; this is the trainer's reading of a plan it
    was handed."""
    return re.search(r"@torch\.(?:no_grad|inference_mode)\(\)\s*\n(?:\s*@[^\n]*\n)*\s*def forward\b",
                     source_of(type(module))) is not None


@dataclass(frozen=True)
class FusedSplit:
    """How a fused projection's output is cut by its parent's forward: `pieces` (sizes along the
    output features, in order: q, k, v or gate, up), each made of whole `unit`s (head_dim for
    attention). Under tensor parallelism each rank holds its 1/tp of every piece (Megatron's and
    vLLM's QKVParallelLinear / MergedColumnParallelLinear layout), not a contiguous 1/tp of the rows."""

    pieces: tuple[int, ...]
    unit: int = 1

    def divisible(self, tp: int) -> bool:
        return all(p % (self.unit * tp) == 0 for p in self.pieces)

    def rank_order(self, tp: int) -> torch.Tensor:
        """Output-feature indices in the order whose contiguous tp chunks are each rank's slices of
        every piece: rank r's chunk is [piece_0 slice r, piece_1 slice r, ...]."""
        order, start = [], 0
        starts = []
        for p in self.pieces:
            starts.append(start)
            start += p
        for r in range(tp):
            for s, p in zip(starts, self.pieces, strict=True):
                w = p // tp
                order.append(torch.arange(s + r * w, s + (r + 1) * w))
        return torch.cat(order)


def fused_split(parent: nn.Module | None, child: str) -> FusedSplit | None:
    """The split of `parent.<child>`'s output when the parent's forward cuts it into pieces that
    tensor parallelism can localize (see localize_fused); None for any other module. Recognized by
    the attributes the forward slices with (what the module does), for transformers' fused layouts:

    * `split_size` (GPT-2's c_attn: q, k, v of split_size each, cut by .split(split_size)),
    * `config.num_attention_heads`, `num_key_value_heads`, `head_dim` with an output of (H + 2 KV) *
      head_dim (Phi-3's qkv_proj, sliced at H * head_dim and (H + KV) * head_dim),
    * `config.intermediate_size` with an output of twice it and a down projection of it (Phi-3's
      gate_up_proj, cut by .chunk(2)).
    """
    feats = linear_features(getattr(parent, child, None)) if parent is not None else None
    if feats is None:
        return None
    out = feats[1]
    falcon = _falcon_split(parent, child, out)
    if falcon is not None:
        return falcon
    by_heads = _head_layout(parent, child, out)
    if by_heads is not None:
        return by_heads[1]
    split = getattr(parent, "split_size", None)
    head_dim = getattr(parent, "head_dim", None)
    if isinstance(split, int) and 0 < split < out and out % split == 0:
        return FusedSplit((split,) * (out // split), head_dim if isinstance(head_dim, int) else 1)
    config = getattr(parent, "config", None)
    heads, kv = config_value(config, "num_attention_heads"), getattr(parent, "num_key_value_heads", None)
    if (isinstance(head_dim, int) and isinstance(heads, int) and isinstance(kv, int)
            and out == (heads + 2 * kv) * head_dim and child.startswith("qkv")):
        return FusedSplit((heads * head_dim, kv * head_dim, kv * head_dim), head_dim)
    inter = config_value(config, "intermediate_size")
    # the down projection reads `inter` features (the product of the two halves): Aria's shared experts'
    # plain gate_proj is also 2 * intermediate_size wide (moe_num_shared_experts = 2), beside an up_proj of
    # its own and a down_proj that reads all 2 * intermediate_size
    if isinstance(inter, int) and out == 2 * inter and "gate" in child and any(
            (f := linear_features(m)) is not None and f[0] == inter for n, m in parent.named_children() if n != child):
        return FusedSplit((inter, inter))
    return None


def _falcon_split(parent: nn.Module, child: str, out: int) -> FusedSplit | None:
    """Falcon's fused query_key_value, recognized by the attributes its _split_heads cuts with
    (multi_query, new_decoder_architecture, num_heads, num_kv_heads, head_dim). Multi-query
    [q heads | k | v] has one k and one v head, which no tp > 1 can split; the grouped layouts (per kv
    head [q..q, k, v], or per head [q, k, v]) are one piece of their whole width for now. Either way no
    tp > 1 divides the pieces, so the projection (and its attention) stays replicated: the contiguous
    column split a plain Linear gets would cut across q, k and v."""
    if child != "query_key_value" or not all(hasattr(parent, a) for a in
                                             ("multi_query", "new_decoder_architecture", "num_kv_heads")):
        return None
    h, d = parent.num_heads, parent.head_dim
    if parent.multi_query and not parent.new_decoder_architecture:
        return FusedSplit((h * d, d, d), d)
    # the grouped layouts would split by whole groups, but Falcon's forward then modifies views of the
    # sharded output in place, which autograd refuses on the local tensor: kept whole until that runs
    return FusedSplit((out,), out)


def _head_layout(parent: nn.Module, child: str, out: int) -> tuple[str, FusedSplit] | None:
    """(the head-count attribute the parent's forward reshapes by, the split) of a fused q/k/v projection whose
    parent reads it by its own head count, found in the parent's source:

    * per head, [heads, k, head_dim]: viewed as (.., self.<count>, k, self.head_dim) (BLOOM's, Persimmon's
      query_key_value): a contiguous column shard already holds whole heads with all k pieces, so it is one piece
      of units k * head_dim,
    * piece by piece, [k, heads, head_dim]: its output cut by .chunk(k) unviewed, each piece reshaped to
      (.., self.<count>, self.head_dim) (MPT's Wqkv): k pieces of heads of head_dim.

    None where the parent's source is unreadable or reads the projection otherwise."""
    head_dim = getattr(parent, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim <= 0:
        return None
    source = source_of(type(parent))
    for count, k in re.findall(r"\.view\([^()]*self\.(\w+),\s*(\d+),\s*self\.head_dim\)", source):
        if getattr(parent, count, None) == out // (int(k) * head_dim) and out % (int(k) * head_dim) == 0:
            return count, FusedSplit((out,), int(k) * head_dim)
    var = re.search(rf"(\w+)\s*=\s*self\.{re.escape(child)}\(", source)
    chunks = re.findall(rf"\b{var.group(1)}\.chunk\((\d+)", source) if var is not None else []
    if len(chunks) != 1 or re.search(rf"\b{var.group(1)}\.(view|reshape|unflatten)\(", source):
        return None
    k = int(chunks[0])
    for count in re.findall(r"\.reshape\([^()]*self\.(\w+),\s*self\.head_dim\)", source):
        if getattr(parent, count, None) == out // (k * head_dim) and out % (k * head_dim) == 0:
            return count, FusedSplit((out // k,) * k, head_dim)
    return None


def localize_fused(parent: nn.Module, child: str, tp: int, rank: int) -> None:
    """Make the parent's forward (on a trainer's copy) cut the local output of its column-sharded fused
    projection, which holds this rank's 1/tp of each piece (`rank`'s): the sizes it slices with become local,
    and an attention read by its own head count (_head_layout) takes its heads' rows of a per-head position
    bias (localize_head_bias)."""
    out = linear_features(getattr(parent, child))[1]
    by_heads = _head_layout(parent, child, out)
    if by_heads is not None:
        count = by_heads[0]
        localize_head_bias(parent, getattr(parent, count), rank, tp)
        setattr(parent, count, getattr(parent, count) // tp)
        return
    split = getattr(parent, "split_size", None)
    if isinstance(split, int) and 0 < split < out:
        parent.split_size = split // tp
        return
    if child.startswith("qkv"):
        config = copy.copy(parent.config)  # the parent's own copy: other modules keep the global sizes
        config.num_attention_heads = parent.config.num_attention_heads // tp
        config.num_key_value_heads = parent.num_key_value_heads // tp
        parent.config = config
        parent.num_key_value_heads //= tp
    # gate/up cut by .chunk(2) halves the local output as it is


@dataclass(frozen=True)
class RouterAux:
    """HF's MoE load-balancing loss, asked for by config.output_router_logits: `coef` times
    load_balancing_loss_func over the router logits of every layer (output `index` of each `router`
    module, the model's own OutputRecorder for "router_logits")."""

    router: type
    index: int
    num_experts: int
    top_k: int
    coef: float


def router_aux(model: nn.Module) -> RouterAux | None:
    """The model's router auxiliary loss when its config turns it on (else None)."""
    config = getattr(model, "config", None)
    recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
    if not getattr(config, "output_router_logits", False) or recorder is None:
        return None
    return RouterAux(router=recorder.target_class, index=int(getattr(recorder, "index", 0) or 0),
                     num_experts=int(model.num_experts), top_k=int(model.num_experts_per_tok),
                     coef=float(model.router_aux_loss_coef))


def load_balance_terms(gate_logits: list[torch.Tensor], num_experts: int, top_k: int,
                       attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sums transformers' load_balancing_loss_func builds its loss from, over the given router
    logits ([tokens, E] per layer): (expert selections [E], no gradient; router probabilities summed
    over tokens [E]; token rows). Its loss is num_experts * sum(selections * probabilities) / rows^2;
    the sums add up over data slices, so the loss of a global batch comes from their totals."""
    device = gate_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    flat = None if attention_mask is None else attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
    for gate in gate_logits:
        weights = F.softmax(gate.to(device), dim=-1)
        _, selected = torch.topk(weights, top_k, dim=-1)
        w = torch.ones(weights.shape[0], device=device) if flat is None else flat
        counts = counts.scatter_add(0, selected.reshape(-1), w.repeat_interleave(top_k))
        probs = probs + (weights.float() * w.unsqueeze(-1)).sum(dim=0)
        rows = rows + w.sum()
    return counts.detach(), probs, rows


def _get(model: nn.Module, path: str | None) -> nn.Module | None:
    from autoparallel.trainer.structure import get_submodule

    return get_submodule(model, path) if path else None


def causal_mask(attention_mask: torch.Tensor | None, seq: int, dtype: torch.dtype,
                device: torch.device, implementation: str, window: int | None = None, batch: int = 1,
                explicit: bool = False, chunk: int | None = None) -> torch.Tensor | None:
    """None where SDPA's is_causal gives causal attention (what HF does without padding, unless the model
    asks for a materialized mask: `explicit`); otherwise an additive [B, 1, S, S] mask (a broadcast view
    without padding: XGLM's eager attention checks the batch dim): causal (within `window` positions back,
    HF's sliding window; within `chunk`-token chunks counted from each row's first unpadded token, HF's
    chunked attention), plus padded keys (attention_mask == 0) masked out."""
    if attention_mask is None and implementation == "sdpa" and window is None and chunk is None and not explicit:
        return None
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    if window is not None:
        allowed = allowed.triu(1 - window)  # key j visible from query i when i - j < window
    allowed = allowed[None, None]
    if chunk is not None:  # chunk ids as transformers' chunked_overlay: (position - left padding) // chunk
        left = (attention_mask.cumsum(-1) == 0).sum(-1, keepdim=True) if attention_mask is not None else 0
        ids = torch.div(torch.arange(seq, device=device)[None] - left, chunk, rounding_mode="floor")
        allowed = allowed & (ids[:, None, :, None] == ids[:, None, None, :])
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min).expand(batch, 1, seq, seq)


def _bloom_alibi(base: nn.Module, h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """BLOOM's ALiBi, [B * H, 1, S]: each key's slope-scaled position among its row's unpadded tokens. Without a
    mask transformers >= 5.25 multiplies the slopes by 0..S-1 directly, which is what an all-ones mask gives."""
    mask = attention_mask if attention_mask is not None else torch.ones(h.shape[:2], dtype=torch.long,
                                                                         device=h.device)
    return base.build_alibi_tensor(mask.to(h.device), base.num_heads, dtype=h.dtype)


def _mpt_alibi(base: nn.Module, h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """MPT's ALiBi, [H, 1, max_seq_len], whatever the mask (its attention reads the last S keys' columns)."""
    return base.build_mpt_alibi_tensor(base.num_heads, base.config.max_seq_len, device=h.device)


# block argument -> (the base model's builder method, how its forward calls it); a required block argument of
# this name is computed where the base model holds that builder
BIAS_BUILDERS = {"alibi": ("build_alibi_tensor", _bloom_alibi),
                 "position_bias": ("build_mpt_alibi_tensor", _mpt_alibi)}


def heads_slice(bias: torch.Tensor, heads: int, rank: int, tp: int) -> torch.Tensor:
    """The rows of a per-head bias ([(B x) heads, ...], BlockBias) that belong to tensor-parallel rank `rank`'s
    heads, a contiguous 1/tp of them (its column shard of the attention's projections)."""
    local = heads // tp
    return bias.unflatten(0, (-1, heads))[:, rank * local:(rank + 1) * local].flatten(0, 1)


def localize_head_bias(attention: nn.Module, heads: int, rank: int, tp: int) -> None:
    """An attention split by heads over tensor parallelism (this rank's 1/tp of `heads`) whose forward takes a
    per-head position bias (an argument of BIAS_BUILDERS: BLOOM's `alibi`, MPT's `position_bias`, built for all
    heads) gets this rank's rows of it, by a pre-hook: ALiBi gives every head its own slope."""
    names = list(inspect.signature(attention.forward).parameters)
    arg = next((a for a in BIAS_BUILDERS if a in names), None)
    if arg is None:
        return
    index = names.index(arg)

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if kwargs.get(arg) is not None:
            kwargs = {**kwargs, arg: heads_slice(kwargs[arg], heads, rank, tp)}
        elif len(args) > index and args[index] is not None:
            args = (*args[:index], heads_slice(args[index], heads, rank, tp), *args[index + 1:])
        return args, kwargs

    attention.register_forward_pre_hook(hook, with_kwargs=True)


def causal_lm_forward(model: nn.Module, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      *, parts: HFParts) -> torch.Tensor:
    """Logits of an HF causal LM (or of the pipeline stage `model` holds: see the module docstring).
    `x`: token ids [B, S] where the model holds the embedding, else hidden states [B, S, H]."""
    embed = _get(model, parts.embed)
    seq = x.shape[1]  # whole sequence: the stage root always sees it (pipeline/SP hooks gather)
    h = embed(x) if embed is not None else x
    if embed is not None and parts.embed_scale != 1.0:
        h = h * parts.embed_scale
    per_layer = None
    if parts.per_layer is not None:  # from the ids and the token embeddings, before anything else runs on them
        if embed is None:
            from autoparallel.errors import UserError

            raise UserError(f"{type(model).__name__}: a pipeline stage without the token embedding cannot compute "
                            f"the per-layer inputs its blocks take ({parts.no_pipeline}); use a plan with pp=1")
        per_layer = per_layer_inputs(model, parts.per_layer, x, h)
    for path in parts.before if embed is not None else ():
        h = _get(model, path)(h)
    positions = torch.arange(seq, device=x.device)
    table = _get(model, parts.positions)
    if embed is not None and table is not None:
        # [S, H] ([B, S, H] from a padding mask); sliced to the rank's chunk under SP (tensor_parallel.py)
        ids = positions
        if parts.positions_by_mask and attention_mask is not None:  # OPT's forward counts unpadded tokens
            ids = (attention_mask.cumsum(1) * attention_mask - 1).long()
        # OPT's and BioGPT's tables take the ids by keyword (and add their offset)
        h = h + (table(None, 0, position_ids=ids) if parts.positions_by_keyword else table(ids))
    for path in parts.embed_norms if embed is not None else ():
        h = _get(model, path)(h)
    drop = _get(model, parts.dropout)
    if embed is not None and drop is not None:
        h = drop(h)
    window = parts.sliding_window if parts.sliding_window is not None and seq > parts.sliding_window else None
    chunk = parts.attention_chunk if parts.attention_chunk is not None and seq > parts.attention_chunk else None
    # beyond the window (or chunk), a model whose layers attend differently needs a mask per layer type
    by_kind = (window is not None and parts.mixed_windows) or chunk is not None
    masks: dict[str | None, torch.Tensor | None] = {}

    def mask_of(kind: str | None) -> torch.Tensor | None:
        if kind not in masks:
            w = window if not parts.mixed_windows or kind == "sliding_attention" else None
            mask = causal_mask(attention_mask, seq, h.dtype, h.device, parts.attn_implementation, w,
                               x.shape[0], parts.explicit_mask or parts.bool_mask,
                               chunk if kind == "chunked_attention" else None)
            masks[kind] = mask.to(torch.bool) if parts.bool_mask else mask  # (the additive mask's min: True)
        return masks[kind]

    kwargs: dict = {"attention_mask": None, "position_ids": positions[None]}
    rotary = _get(model, parts.rotary)
    tables: dict[str | None, object] = {}
    rotary_ids = positions[None, None].expand(3, 1, -1) if parts.rotary_grids else positions[None]
    if rotary is not None and not parts.rotary_by_layer_type and not parts.rotary_by_layer:
        kwargs["position_embeddings"] = rotary(h, rotary_ids)
    kwargs.update(dict.fromkeys(parts.none_args))
    kwargs = {k: v for k, v in kwargs.items() if k in parts.block_args or k in parts.none_args}
    if parts.kv_store:  # a mapping FSDP2's input casts hand on as it is (a dict they would copy: transformers'
        kwargs["shared_kv_states"] = collections.UserDict()  # KVSharingDict is one too)
    kwargs.update(dict.fromkeys(parts.padding_mask_args, attention_mask))
    if parts.bias is not None:
        kwargs[parts.bias.arg] = BIAS_BUILDERS[parts.bias.arg][1](_get(model, parts.bias.base), h, attention_mask)
    layers = _get(model, parts.layers)
    for key, layer in layers._modules.items() if layers is not None else ():  # (each entry, repeats included)
        if per_layer is not None:  # block i's slice (a ModuleList keeps its indices as keys on a pipeline stage)
            kwargs["per_layer_input"] = per_layer[:, :, int(key), :]
        kind = _layer_type(layer) if parts.rotary_by_layer_type or parts.padding_mask_types or by_kind else None
        if parts.rotary_by_layer:  # the table of the layer's own rope theta, None for a NoPE layer (Granite-SWA)
            path = parts.rotary_by_layer[int(key)]
            if path not in tables:
                tables[path] = _get(model, path)(h, positions[None]) if path is not None else None
            kwargs["position_embeddings"] = tables[path]
        elif rotary is not None and parts.rotary_by_layer_type:
            if kind not in tables:  # a layer type without rotary parameters takes none (Ergo's full attention)
                tables[kind] = None if kind in parts.unrotated_types else rotary(h, rotary_ids, kind)
            kwargs["position_embeddings"] = tables[kind]
        if "attention_mask" in kwargs:  # a recurrent layer zeroes padded tokens by the [B, S] mask itself (HF's)
            if kind in parts.padding_mask_types:
                kwargs["attention_mask"] = attention_mask
            else:
                if by_kind and kind not in _MASKED_KINDS:
                    from autoparallel.errors import UserError

                    raise UserError(f"{type(layer).__name__}: layer type {kind!r} of a model whose layers attend "
                                    f"differently beyond {window or chunk} tokens is not one autoparallel's Hugging "
                                    f"Face forward masks ({', '.join(_MASKED_KINDS)}); use seq_len <= {window or chunk}")
                kwargs["attention_mask"] = mask_of(kind if by_kind else None)
        out = layer(h, **kwargs)
        h = out[0] if isinstance(out, (tuple, list)) else out  # GPT-1's blocks return a list
    head = _get(model, parts.head)
    if head is None:  # a pipeline stage that does not end the model (one that runs on both sides of the
        return h      # blocks, NanoChat's norm, stays on every stage)
    for path in parts.after:
        h = _get(model, path)(h)
    return apply_logit_ops(head(h), parts.logit_ops)


# the layer types whose attention mask causal_lm_forward builds (transformers' names)
_MASKED_KINDS = ("full_attention", "sliding_attention", "chunked_attention")


def _layer_type(layer: nn.Module) -> str | None:
    """`_find_layer_type` of a block, looked up once and kept on it: the forward runs on copies the trainer or
    tracer owns (hf_parts reads the user's blocks and keeps nothing on them)."""
    kind = vars(layer).get("_layer_type", False)
    if kind is False:
        kind = layer._layer_type = _find_layer_type(layer)
    return kind


def _find_layer_type(layer: nn.Module) -> str | None:
    """The layer type of a block, which picks its rotary table (Gemma 3's attention holds `layer_type`, OLMo 3's
    `attention_type`: "sliding_attention" or "full_attention") and its mask (MiniMax's "linear_attention"), found
    below any wrapper (activation checkpointing's)."""
    kind = next((k for m in layer.modules() for k in (getattr(m, a, None) for a in ("layer_type", "attention_type"))
                 if isinstance(k, str)), None)
    if kind is None:  # else the config's entry for the block's index (Mellum's, Laguna's attention keep none)
        idx = next((i for m in layer.modules() if isinstance(i := getattr(m, "layer_idx", None), int)), None)
        types = next((t for m in layer.modules() if isinstance(t := getattr(getattr(m, "config", None),
                                                                            "layer_types", None), list)), None)
        kind = types[idx] if idx is not None and types is not None and idx < len(types) else None
    return kind


def install_forward(model: nn.Module, parts: HFParts) -> None:
    """Give `model` (a copy the trainer or tracer owns, never the user's module) causal_lm_forward."""

    def forward(self: nn.Module, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return causal_lm_forward(self, x, attention_mask, parts=parts)

    model.forward = types.MethodType(forward, model)


def init_weights(part: nn.Module) -> None:
    """Initialize a meta-device model's part (a pipeline stage, sharded) with transformers' own
    per-module initializer. Not `init_weights()`: that also ties the embeddings through `lm_head`,
    which a pipeline stage may not hold (the trainer re-ties what it holds itself)."""
    part.initialize_weights()


def buffer_dtypes(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.dtype]:
    """Each floating buffer's dtype (by its name in `model`) when transformers builds the model in `dtype`, as
    from_pretrained(dtype=...) and from_config(dtype=...) do: under that default dtype. A buffer the model
    computes at the default dtype is then low-precision (MiniMax's decay factors, which its linear attention
    multiplies into bf16 activations), one it builds in fp32 explicitly stays fp32 (RoPE's inv_freq). Rebuilt
    on the meta device from the model's config: no memory, and the user's model is not touched. A model that
    does not rebuild so (a subclass whose constructor takes more than its config) keeps its buffers as they are:
    empty."""
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device("meta"), quiet_optional_kernels():
            rebuilt = type(model)(copy.deepcopy(model.config))
    except Exception:  # whatever a user's constructor raises: the buffers then stay as the model has them
        return {}
    finally:
        torch.set_default_dtype(previous)
    return {n: b.dtype for n, b in rebuilt.named_buffers() if b.is_floating_point()}


def hf_labels(labels: torch.Tensor) -> torch.Tensor:
    """HF's causal-LM label shift: position t is scored against labels[t + 1], the last position
    against nothing (IGNORE_INDEX), as transformers' ForCausalLMLoss does."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def save_pretrained(model: nn.Module, state: dict[str, torch.Tensor], ties: list[list[str]],
                    path: str | Path) -> None:
    """Write `state` (full parameters by HF name) as a transformers checkpoint of `model`'s class and
    config: a copy of `model`'s module tree (parameters on meta, never the user's tensors) takes the
    values, tied names share one tensor again, and transformers' own save_pretrained writes it, so
    AutoModelForCausalLM.from_pretrained(path) loads it."""
    from autoparallel.trainer.materialize import meta_copy
    from autoparallel.trainer.structure import set_param

    out = meta_copy(model)
    group_of = {n: g for g in ties for n in g}
    done: set[str] = set()
    dtypes = {n: p.dtype for n, p in out.named_parameters(remove_duplicate=False)}
    for name, value in state.items():
        if name in done:
            continue
        # in the dtype the model was handed in: the trainer's fp32 masters of a bf16 model export as bf16
        param = nn.Parameter(value.detach().to(dtypes.get(name, value.dtype)).clone(), requires_grad=False)
        for n in group_of.get(name, [name]):
            set_param(out, n, param)
            done.add(n)
    missing = sorted(n for n, p in out.named_parameters() if p.is_meta)
    if missing:
        raise RuntimeError(f"save_pretrained: no value for {missing[0]}")
    out.save_pretrained(str(path))
