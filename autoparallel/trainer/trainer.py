"""AutoParallelTrainer: execute a Plan with PyTorch's own parallelism (see docs/trainer.md).

Build order for each model part (the whole model, or each local pipeline stage), torchtitan's:
meta copy -> pipeline split -> tensor/sequence parallel -> expert parallel -> activation
checkpointing -> torch.compile per block -> FSDP2 / replicate -> allocate and fill this rank's shards
-> one optimizer per part.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from autoparallel.errors import UserError
from autoparallel.hf import (
    IGNORE_INDEX,
    HFParts,
    RouterAux,
    buffer_dtypes,
    hf_parts,
    install_forward,
    is_hf_causal_lm,
    load_balance_terms,
    router_aux,
)
from autoparallel.hf import init_weights as hf_init_weights
from autoparallel.hf import save_pretrained as save_hf_pretrained
from autoparallel.limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, check_int
from autoparallel.plan import Plan
from autoparallel.planner import parse_fix
from autoparallel.trainer import checkpoint as ckpt
from autoparallel.trainer import lr_schedule
from autoparallel.trainer.batch import Batch, check_against_plan, check_token_ids, parse_batch
from autoparallel.trainer.context_parallel import check_cp_model, cp_context
from autoparallel.trainer.data_parallel import (
    apply_data_parallel,
    discard_gradients,
    mixed_precision_policy,
    reshard,
    to_dtype,
)
from autoparallel.trainer.expert_parallel import apply_expert_parallel, scale_expert_grads
from autoparallel.trainer.grad_norm import check_max_grad_norm, clip_parameters
from autoparallel.trainer.hardware import attention_kernel, local_budget, resolve_hardware
from autoparallel.trainer.low_precision import apply_fp8
from autoparallel.trainer.materialize import (
    broadcast_source,
    cast_buffers,
    fp32_masters,
    full_source,
    is_meta_model,
    local_shard,
    materialize,
    meta_copy,
    pipeline_part,
    shared_seed,
)
from autoparallel.trainer.optim import make_optimizer_factory
from autoparallel.trainer.pipeline import (
    add_sequence_boundary_hooks,
    build_schedule,
    local_virtual_stages,
    virtual_stage_blocks,
)
from autoparallel.trainer.recompute import apply_recompute
from autoparallel.trainer.runtime import DistEnv, Meshes, build_meshes, init_distributed, new_group
from autoparallel.trainer.structure import (
    check_has_parameters,
    clean_fqn,
    find_layout,
    get_submodule,
    model_fingerprint,
    set_param,
    tie_groups,
)
from autoparallel.trainer.tensor_parallel import (
    Relayout,
    apply_tensor_parallel,
    enable_async_tp,
    lm_head_path,
)
from autoparallel.units import parse_bytes
from cost_models.estimate import RuntimeVariant
from cost_models.graph import no_pipeline_clause

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_EXPERT_CLASSES = ("GroupedExperts",)


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over the positions whose label is not -100, in fp32
    (vocab-sharded DTensor logits work too, under loss_parallel())."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


def _cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def _logits(output: Any) -> torch.Tensor:
    """The logits of a model output: a tensor, a ModelOutput-like object with .logits, or a tuple's first."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise UserError(f"model output of type {type(output).__name__} has no logits; return a tensor, an object "
                    f"with .logits, or pass loss_fn")


def _splits_over_tp(plan: Plan) -> bool:
    return any(v in ("colwise", "rowwise", "vocab") for v in plan.placements.values())


@contextmanager
def _explain_checkpoint_mutation(plan: Plan) -> Iterator[None]:
    """torch's selective checkpointing refuses, in the backward, an output it cached that the block then changed in
    place (transformers' grouped experts add their bias into the grouped GEMM's output): one error that says which
    plan setting runs into it and what to pin instead. The planner never chooses per-op checkpointing for such a
    model (Planner.recompute_modes); a plan that pins it reaches this."""
    try:
        yield
    except RuntimeError as e:
        if "selective activation checkpoint has been mutated" not in str(e):
            raise
        modes = sorted({r for r in plan.recompute if r in ("op", "selective")})
        raise UserError(f"plan recompute {'/'.join(modes) or 'op'}: per-op checkpointing cached an op output that "
                        f"the model then changes in place, which torch refuses in the backward ({e}); use "
                        f"recompute none or full for this model (the planner does)") from None


@contextmanager
def _explain_sharding_failure(plan: Plan) -> Iterator[None]:
    """DTensor cannot run an op on the shardings a plan's tensor-parallel placements give its inputs (a hand-written
    layout that splits a Linear whose neighbours then see its split output as whole: Gemma 4's per-layer gate split
    by columns beside the block's norms): one error naming the op and what to do, not DTensor's propagation trace.
    The planner's layouts keep such modules whole (CostModel._runnable); a hand-written plan reaches this."""
    try:
        yield
    except RuntimeError as e:
        text = str(e)
        if "Sharding propagation failed" not in text:
            raise
        op = text.split("Sharding propagation failed for ", 1)[1].split("(", 1)[0]
        first = text.strip().splitlines()[0]
        raise UserError(f"plan placements (tp={plan.tp}{', sequence parallel' if plan.sequence_parallel else ''}): "
                        f"the model's forward cannot run {op} on the shardings they give its inputs ({first}); "
                        f"use the planner's placements for this model (autoparallel plan, or no `placements` in the "
                        f"plan) or keep the modules around that op 'replicate'") from None


def _value(loss: torch.Tensor) -> torch.Tensor:
    """A loss as a plain detached fp32 scalar (a loss_parallel loss is a replicated DTensor)."""
    loss = loss.detach()
    return (loss.full_tensor() if isinstance(loss, DTensor) else loss).float()


def _as_plan(plan: Any) -> Plan:
    """The trainer's `plan` argument: a Plan, its dict (Plan.to_dict, or a plan file's contents) or a plan file."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return Plan.from_dict(plan, "plan")
    if isinstance(plan, (str, Path)):
        return Plan.load(plan)
    raise UserError(f"plan: expected a Plan, its dict or a plan file path, got {type(plan).__name__}")


def _checked_loss(loss: Any) -> torch.Tensor:
    """loss_fn's result, which the micro-batch's backward and the step's mean read: one floating scalar that
    depends on the logits (a float, a per-token tensor or a detached value failed inside autograd)."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
        got = (f"a tensor of shape {tuple(loss.shape)} and dtype {loss.dtype}" if isinstance(loss, torch.Tensor)
               else f"{type(loss).__name__} {loss!r}"[:80])
        raise UserError(f"loss_fn returned {got}: it must return the micro-batch's mean loss as a 0-dim floating "
                        f"tensor computed from the logits (reduce per-token losses with .mean())")
    if not loss.requires_grad:
        raise UserError("loss_fn returned a tensor that does not depend on the logits (requires_grad=False): "
                        "compute it from the logits passed in, without .detach(), .item() or torch.no_grad()")
    return loss


def _check_compile_arguments(kwargs: dict) -> None:
    """compile={...}: the keywords torch.compile takes (without `model`) and, for Inductor, a mode it knows;
    both failed only at the first step's forward, inside torch."""
    import inspect

    known = [k for k in inspect.signature(torch.compile).parameters if k != "model"]
    for key in kwargs:
        if key not in known:
            raise UserError(f"compile: {key!r} is not an argument of torch.compile (it takes {', '.join(known)})")
    mode, backend = kwargs.get("mode"), kwargs.get("backend", "inductor")
    if mode is not None and backend == "inductor":
        from torch._inductor import list_mode_options
        modes = list(list_mode_options())
        if mode not in modes:
            raise UserError(f"compile: mode {mode!r} is not one of torch.compile's modes ({', '.join(modes)})")


def _check_arguments(*, global_batch_size: Any, seq_len: Any, compile: Any, padded: Any, moe: Any, loss_fn: Any,
                     init_fn: Any) -> None:
    """AutoParallelTrainer's arguments by type, each a UserError naming it: a string flag was read as its truth
    (compile="no" compiled, padded="no" planned padded), a string batch size failed inside the planner."""
    for name, value in (("global_batch_size", global_batch_size), ("seq_len", seq_len)):
        if value is not None:
            check_int(value, name, 1, MAX_GLOBAL_BATCH if name == "global_batch_size" else MAX_SEQ_LEN)
    if compile is not None and not isinstance(compile, (bool, dict)):
        raise UserError(f"compile: {compile!r} is not True, False, None or a dict of torch.compile arguments")
    if isinstance(compile, dict):
        _check_compile_arguments(compile)
    if padded is not None and not isinstance(padded, bool):
        raise UserError(f"padded: {padded!r} is not True, False or None")
    if moe is not None and not isinstance(moe, dict):
        raise UserError(f"moe: expected a dict (e.g. {{'expert_modules': [...]}}), got {type(moe).__name__}")
    for name, fn in (("loss_fn", loss_fn), ("init_fn", init_fn)):
        if fn is not None and not callable(fn):
            raise UserError(f"{name}: {fn!r} is not callable; pass a function (or None for the default)")


def _token_vocabularies(model: nn.Module, blocks: tuple[str, ...], hf: bool,
                        default_loss: bool) -> tuple[int | None, int | None, bool]:
    """(rows of the token embedding, outputs the default loss's labels index, whether its inputs are token ids
    only) where known, for the batch's checks (batch.check_token_ids): a Hugging Face causal LM's input
    embedding and head, the catalog's vocabulary; of any other model the largest embedding outside its blocks
    (never smaller than its token table, so no valid id is refused), checked only on integer inputs, its labels
    unchecked (its output width is not known before a forward)."""
    from autoparallel.models.layers import Transformer

    if hf:
        head = model.get_output_embeddings()
        width = getattr(head, "out_features", None) or getattr(getattr(head, "weight", None), "shape", (None,))[0]
        return model.get_input_embeddings().num_embeddings, width if default_loss else None, True
    if isinstance(model, Transformer):
        return model.spec.vocab_size, model.spec.vocab_size if default_loss else None, True
    rows = [m.num_embeddings for n, m in model.named_modules() if isinstance(m, nn.Embedding)
            and not any(n == b or n.startswith(b + ".") for b in blocks)]
    return (max(rows) if rows else None), None, False


class AutoParallelTrainer:
    """Plan (or take) a parallel layout for `model` and train it with one `step(batch)` per global batch.

    model               nn.Module, materialized or on the meta device
    optimizer           an Optimizer built on model.parameters() (rebuilt with the same class and
                        hyperparameters on the parallel parameters), a factory callable(params), or None
                        for AdamW(lr=3e-4)
    max_memory_per_gpu  planner budget, e.g. "80GB"; None (default): the local accelerator's usable memory
                        (its reported capacity times the matched profile's usable fraction), what
                        `autoparallel plan` assumes without --max-memory-per-gpu
    global_batch_size, seq_len   planner inputs; inferred from the first batch when omitted
    padded              the batches carry padding (an attention mask), so a Hugging Face model's attention
                        runs a masked kernel that computes every score: plan for it. None (default): plan
                        at construction as unpadded, or by the first batch (padded when its mask has zeros)
    hardware            "auto" (detect the local accelerator), a profile name or a YAML path
    device_ids          local device index per local rank (default: the local rank)
    plan                a Plan or a plan file from `autoparallel plan --output`; None: plan here
    fix                 planner pins, e.g. {"tp": 2, "pp": 2}
    loss_fn             callable(logits, labels) -> mean loss of a micro-batch; default: cross entropy
                        averaged over the valid (!= -100) tokens of the whole global batch, as HF does
    moe                 {"expert_modules": [paths]}: expert groups of a user model whose class is not
                        GroupedExperts (placement "expert" in a plan marks them too)
    mixed_precision     param dtype the planner is asked for ("bf16", "fp16", "fp32"); an explicit plan
                        carries its own param_dtype / grad_reduce_dtype, which win
    compile             torch.compile each block (and the default loss at tp = cp = 1): True (or a dict
                        of torch.compile kwargs) or False pin it; None (default) runs what the plan says
                        (`compile` in the plan: the planner turns it on where the cost model predicts its
                        compiled optimum 5% faster than its eager one, Planner._solve_both; compiled steps of a 1.3B llama ran
                        257 against 317 ms on an H200, docs/trainer_sweep.md); off the GPU always eager
    init_fn             callable(module) initializing a meta-device model's part (default: the
                        model's init_weights())
    max_grad_norm       clip the gradients to this global L2 norm before each optimizer step
                        (torch.nn.utils.clip_grad_norm_ over the whole parallel model; grad_norm reports the
                        norm before clipping); inf measures the norm without clipping. None (default): no
                        clipping, as a plain PyTorch loop; Hugging Face's Trainer, torchtitan and Megatron-LM
                        clip at 1.0 by default. The planner prices the extra pass over the gradients.
    lr_scheduler        a factory callable(optimizer) -> LRScheduler, called on each of the trainer's optimizers
                        (e.g. lambda opt: get_cosine_schedule_with_warmup(opt, 100, 10_000)); each scheduler
                        steps after every optimizer step, and load_checkpoint brings it to the loaded step
    """

    def __init__(self, model: nn.Module, optimizer: Any = None, *, max_memory_per_gpu: str | int | None = None,
                 global_batch_size: int | None = None, seq_len: int | None = None, hardware: str | None = "auto",
                 device_ids: list[int] | None = None, plan: Plan | str | Path | None = None,
                 fix: dict | None = None, loss_fn: LossFn | None = None, moe: dict | None = None,
                 mixed_precision: str = "bf16", compile: bool | dict | None = None,
                 init_fn: Callable[[nn.Module], None] | None = None, padded: bool | None = None,
                 max_grad_norm: float | None = None, lr_scheduler: Callable[[Any], Any] | None = None) -> None:
        check_has_parameters(model)
        _check_arguments(global_batch_size=global_batch_size, seq_len=seq_len, compile=compile, padded=padded,
                         moe=moe, loss_fn=loss_fn, init_fn=init_fn)
        self._max_grad_norm = check_max_grad_norm(max_grad_norm)
        self._scheduler_factory = lr_schedule.check_factory(lr_scheduler)
        self._schedulers: list[Any] = []  # one per optimizer (_setup), stepped after it
        self._max_memory = None if max_memory_per_gpu is None else parse_bytes(max_memory_per_gpu,
                                                                                 "max_memory_per_gpu")
        to_dtype(mixed_precision, "mixed_precision")
        self._model = model
        self._takes_mask = _takes_attention_mask(model)  # whether a batch's attention_mask can be passed on
        # An HF causal LM runs with autoparallel.hf's forward (on the trainer's copies only).
        self._hf: HFParts | None = hf_parts(model) if is_hf_causal_lm(model) else None
        self._layout = find_layout(model)
        if self._hf is not None and self._hf.positions:
            self._layout = dataclasses.replace(self._layout, positions=(self._hf.positions,))
        self._fingerprint = model_fingerprint(model)
        self._vocab, self._label_vocab, self._token_ids_only = _token_vocabularies(
            model, self._layout.block_paths, self._hf is not None, loss_fn is None)
        self._ties = tie_groups(model)
        self._optimizer_factory = make_optimizer_factory(optimizer, model)
        self._user_loss = loss_fn
        self._default_loss = loss_fn is None
        self._loss_scale = 1.0  # default loss: dp*ep*micro-batches / valid tokens of the global batch
        self._moe = dict(moe or {})
        self._hardware = hardware
        self._fix = parse_fix(fix)  # 'tp=2,pp=2' or a dict, as autoparallel.plan takes them; checked here
        self._mixed_precision = mixed_precision
        self._compile = compile
        self._init_fn = init_fn if init_fn is not None or self._hf is None else hf_init_weights
        # HF MoE router load-balancing loss (config.output_router_logits), added to the default loss
        self._aux: RouterAux | None = router_aux(model) if self._hf is not None and loss_fn is None else None
        self._router_logits: list[torch.Tensor] = []
        self._env: DistEnv = init_distributed(device_ids)
        self._plan: Plan | None = None
        self._meshes: Meshes | None = None
        self._parts: list[tuple[int, nn.Module]] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._schedule: Any = None
        self._tie_sync: list[tuple[str, Any]] = []
        self._tie_copies: list[str] = []  # tied names whose gradient an earlier pipeline stage also holds
        self._grad_norm: torch.Tensor | None = None
        self._loss_parallel = False
        self._cross_entropy: LossFn = _cross_entropy_sum  # compiled with the blocks (_setup)
        self._expert_modules: list[nn.Module] = []
        self._relayout: dict[str, Relayout] = {}  # fused projections held in per-rank row order
        # this step's cp-sharded positions, handed to every pipeline stage's forward (_inject_positions)
        self._cp_positions: torch.Tensor | None = None
        self._steps = 0
        self._fp8_modules: list[str] = []  # module paths converted to torchao Float8Linear (plan.fp8)
        self._pending = (global_batch_size, seq_len)  # planner inputs when the plan waits for a batch
        self._padded = padded
        if plan is not None:
            self._setup(_as_plan(plan))
        elif global_batch_size is not None and seq_len is not None:
            self._setup(self._make_plan(global_batch_size, seq_len, padded=bool(padded)))

    # ---- public API --------------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        if self._plan is None:
            raise UserError("the plan is made at the first step() because global_batch_size / seq_len were not "
                            "given; pass them to AutoParallelTrainer(...) to see it before training")
        return self._plan

    @property
    def model_parts(self) -> list[nn.Module]:
        """The parallelized modules on this rank: the model, or this rank's pipeline stages."""
        return [m for _, m in self._parts]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self._optimizers)

    @property
    def lr_schedulers(self) -> list[Any]:
        """The learning-rate schedulers (lr_scheduler), one per optimizer; [] without a factory."""
        return list(self._schedulers)

    @property
    def fp8_modules(self) -> list[str]:
        """Paths of the linears this rank runs in FP8 (plan.fp8; low_precision.apply_fp8)."""
        return list(self._fp8_modules)

    @property
    def grad_norm(self) -> float | None:
        """The global L2 norm of the last step's gradients before clipping (max_grad_norm), equal on every
        rank; None without max_grad_norm or before the first step."""
        return None if self._grad_norm is None else float(self._grad_norm)

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored by load_checkpoint)."""
        return self._steps

    @property
    def rank(self) -> int:
        return self._env.rank

    @property
    def device(self) -> torch.device:
        return self._env.device

    def step(self, batch: Any) -> float:
        """One optimizer step on the global batch; returns the global mean loss (equal on all ranks)."""
        return self._run(batch, train=True)

    def evaluate(self, batch: Any) -> float:
        """The global mean loss of `batch` under the current weights, computed as step() computes it but without
        gradients or an update, with the modules in eval mode (dropout off), as Hugging Face's Trainer.evaluate
        and torchtitan's validator run (equal on all ranks). The batch is checked against the plan as step()'s."""
        return self._run(batch, train=False)

    def _run(self, batch: Any, train: bool) -> float:
        b = parse_batch(batch, hf_shift=self._hf is not None and self._hf.shifts_labels)
        check_token_ids(b, self._vocab if self._token_ids_only or not b.inputs.is_floating_point() else None,
                        self._label_vocab)
        if b.attention_mask is not None and not self._takes_mask:
            raise UserError(f"batch: attention_mask has padding, but {type(self._model).__name__}.forward takes no "
                            f"attention_mask; drop it (and mark padded labels -100) or pass a model that takes one")
        if self._plan is None:
            gb, seq = self._pending
            padded = self._padded if self._padded is not None else b.attention_mask is not None
            self._setup(self._make_plan(gb or b.rows, seq or b.seq_len, padded=padded))
        plan = self.plan
        dp_ep = plan.dp * plan.ep
        if plan.cp > 1:
            self._check_cp_batch(b, plan)
        n_micro = check_against_plan(b, plan.global_batch, dp_ep, plan.micro_batch, plan.pp > 1, plan.seq_len,
                                     plan.tp if plan.sequence_parallel else 1)
        if self._aux is not None and (plan.pp > 1 or n_micro > 1):
            raise UserError(f"config.output_router_logits: the router load-balancing loss is computed over the "
                            f"whole global batch (transformers' load_balancing_loss_func), which needs every "
                            f"router's logits before any backward: it runs with one micro-batch per data-parallel "
                            f"rank and no pipeline (this plan has pp={plan.pp}, {n_micro} micro-batches per rank); "
                            f"set micro_batch to the rows per rank ({b.rows // dp_ep}) and pp=1, or set "
                            f"output_router_logits=False")
        if self._default_loss:
            # HF's weighting: every valid token of the global batch counts once. Each micro-batch loss is
            # its token sum scaled so that the mean over micro-batches and dp*cp*ep token slices (what the
            # gradient reduction averages) is sum / valid.
            valid = int((b.labels != IGNORE_INDEX).sum())
            if valid == 0:
                raise UserError("batch: every label is -100 (ignored); there is nothing to train on")
            self._loss_scale = dp_ep * plan.cp * (plan.num_micro_batches if plan.pp > 1 else n_micro) / valid
        rows = b.rows // dp_ep
        start = (self._meshes.data_rank if self._meshes is not None else 0) * rows
        local = b.slice(start, start + rows).to(self.device)
        if not train:
            return self._global_loss(self._forward_only(local, n_micro, plan))
        try:
            with loss_parallel() if self._loss_parallel else nullcontext(), _explain_checkpoint_mutation(plan), \
                    _explain_sharding_failure(plan):
                if plan.pp > 1:
                    local_loss = self._pipeline_step(local)
                else:
                    local_loss = self._accumulation_step(local, n_micro)
        except BaseException:  # the next step starts from no gradients, as after a completed one
            for _, part in self._parts:
                discard_gradients(part)
            raise
        for name, group in self._tie_sync:
            self._sync_tied_grad(name, group)
        scale_expert_grads(self._expert_modules, self.plan.ep)
        if self._max_grad_norm is not None:
            skip = {id(self._param(name)) for name in self._tie_copies}
            self._grad_norm = clip_parameters(self.model_parts, skip, self._max_grad_norm,
                                              self._meshes.pp.get_group() if plan.pp > 1 else None)
        for opt in self._optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for sched in self._schedulers:
            sched.step()
        self._steps += 1
        return self._global_loss(local_loss)

    @staticmethod
    def _check_cp_batch(b: Batch, plan: Plan) -> None:
        if b.attention_mask is not None:
            raise UserError(f"batch: attention_mask is not supported under context parallelism (cp={plan.cp}): ring "
                            f"attention is causal only; pack sequences without padding or use cp=1")
        if b.seq_len % (2 * plan.cp):
            raise UserError(f"batch sequence length {b.seq_len} is not divisible by 2*cp = {2 * plan.cp} (causal load "
                            f"balancing); pad or crop the sequences")
        if plan.sequence_parallel and plan.tp > 1 and (b.seq_len // plan.cp) % plan.tp:
            raise UserError(f"batch sequence length {b.seq_len}: each cp rank's {b.seq_len // plan.cp} tokens must "
                            f"divide tp={plan.tp} for sequence parallelism; pad or crop the sequences")

    def save_checkpoint(self, path: str | Path) -> None:
        """Model, optimizer state and step count with torch.distributed.checkpoint (collective)."""
        self._require_plan("save_checkpoint")
        ckpt.save(path, self.model_parts, self._optimizers, self._ties, self._steps, self._fingerprint,
                  self._relayout)

    def load_checkpoint(self, path: str | Path) -> None:
        """Load a checkpoint written under any plan for this model (collective)."""
        self._require_plan("load_checkpoint")
        self._steps = ckpt.load(path, self.model_parts, self._optimizers, self._ties, self._fingerprint,
                                self._relayout)
        self._build_schedulers()  # a schedule is a function of the step: rebuilt at the loaded one

    def save_pretrained(self, path: str | Path) -> None:
        """Export a Hugging Face model as a transformers checkpoint (collective): the full parameters
        are gathered (from every pipeline stage) to rank 0, which writes them with the model's own
        save_pretrained, so AutoModelForCausalLM.from_pretrained(path) loads the trained model. Rank 0
        holds one full copy of the parameters in host memory while writing."""
        if self._hf is None:
            raise UserError(f"save_pretrained: {type(self._model).__name__} is not a Hugging Face PreTrainedModel; "
                            f"use save_checkpoint (or full_state_dict) instead")
        self._require_plan("save_pretrained")
        ckpt.writable_dir(path, "save_pretrained")
        state = self.full_state_dict()
        if self._meshes is not None and self.plan.pp > 1:
            parts: list[dict[str, torch.Tensor] | None] = [None] * self._env.world_size
            dist.gather_object(state, parts if self.rank == 0 else None, dst=0)
            state = {k: v for part in (parts if self.rank == 0 else []) for k, v in part.items()}
        if self.rank == 0:
            save_hf_pretrained(self._model, state, self._ties, path)
        if self._meshes is not None:
            dist.barrier()

    def _require_plan(self, what: str) -> None:
        """Checkpoints need the parallel model, which exists once the plan does (the constructor builds
        it when given plan= or global_batch_size and seq_len; otherwise the first step() does): refuse
        before that, since a load into nothing would be silently lost."""
        if self._plan is None:
            raise UserError(f"{what}() before the plan exists: pass plan=..., or global_batch_size and seq_len, to "
                            f"AutoParallelTrainer(...) so the parallel model is built before the first step()")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) CPU copies of this rank's parameters by FQN (collective over the mesh).
        Under pipeline parallelism each rank returns its own stages' parameters."""
        out: dict[str, torch.Tensor] = {}
        for part in self.model_parts:
            for name, p in part.named_parameters(remove_duplicate=False):
                t = p.full_tensor() if isinstance(p, DTensor) else p
                fqn = clean_fqn(name)
                if fqn in self._relayout:
                    t = self._relayout[fqn].to_model(t)
                out[fqn] = t.detach().cpu().clone()
        return out

    # ---- planning ----------------------------------------------------------------------------
    def _make_plan(self, global_batch: int, seq_len: int, padded: bool = False) -> Plan:
        """The planner's plan for batches of `global_batch` x `seq_len`; `padded`: the first batch has padding
        (an attention mask), which a Hugging Face model's attention then runs as a masked kernel."""
        env = self._env
        profile = resolve_hardware(self._hardware, env.device)
        if profile is None:
            return self._fallback_plan(global_batch, seq_len)
        from autoparallel.api import plan_model

        fix = dict(self._fix)
        if "compile" not in fix and (self._compile is not None or env.device.type != "cuda"):
            # compile=True/False pins the planner; None lets it choose on a GPU (off the GPU: eager)
            fix["compile"] = bool(self._compile)
        if "cp" not in fix:
            try:
                check_cp_model(self._model, self._hf is not None, 2)
            except UserError:
                fix["cp"] = 1  # the planner offers only what the trainer runs on this model
        budget = self._max_memory if self._max_memory is not None else local_budget(env.device, profile)
        # the SDPA kernel this torch runs here: the cost model prices the one it will meet
        variant = RuntimeVariant(attention=attention_kernel(env.device), clip_grad_norm=self._max_grad_norm is not None)
        plan = plan_model(self._model, hardware=profile, gpus=env.world_size, gpus_per_node=env.local_world_size,
                          global_batch=global_batch, seq_len=seq_len, max_memory_per_gpu=budget, fix=fix,
                          padded=padded, variant=variant)
        # The planner has no dtype pin: the requested mixed precision replaces its param_dtype.
        wanted = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[
            to_dtype(self._mixed_precision, "mixed_precision")]
        return plan if plan.param_dtype == wanted else dataclasses.replace(plan, param_dtype=wanted)

    def _fallback_plan(self, global_batch: int, seq_len: int) -> Plan:
        """No hardware profile (a CPU host with hardware="auto"): plain data parallelism in fp32."""
        env = self._env
        unsupported = sorted(k for k in self._fix if k not in ("dp", "zero", "micro_batch"))
        if unsupported:
            raise UserError(f"fix={self._fix}: without a hardware profile (CPU host, hardware='auto') the trainer "
                            f"runs plain data parallelism and cannot honour {unsupported[0]!r}; pass hardware=<a "
                            f"profile name> or an explicit plan")
        world = env.world_size
        if "dp" in self._fix and self._fix["dp"] != world:  # plain data parallelism runs on every process
            raise UserError(f"fix dp={self._fix['dp']}: without a hardware profile the trainer runs data parallelism "
                            f"over all {world} process(es); pin dp={world}, drop it, or pass hardware=<a profile name>")
        if global_batch % world:
            raise UserError(f"batch of {global_batch} rows is not divisible by the {world} data-parallel "
                            f"processes; pass a multiple of {world}")
        micro = int(self._fix.get("micro_batch", global_batch // world))
        if env.rank == 0:
            warnings.warn("hardware='auto' found no accelerator profile for this CPU host: running plain "
                          f"data parallelism over {world} process(es) in fp32", stacklevel=4)
        return Plan(model=type(self._model).__name__, hardware="cpu", gpus=world, gpus_per_node=env.local_world_size,
                    global_batch=global_batch, seq_len=seq_len, dp=world, micro_batch=micro,
                    zero=int(self._fix.get("zero", 0)), recompute=("none",) * len(self._layout.blocks),
                    param_dtype="fp32", grad_reduce_dtype="fp32", model_fingerprint=self._fingerprint)

    # ---- building ----------------------------------------------------------------------------
    def _validate(self, plan: Plan) -> None:
        env, layout = self._env, self._layout
        plan.check_runnable(len(layout.blocks) if layout.container is not None else None)
        if plan.model_fingerprint and plan.model_fingerprint != self._fingerprint:
            raise UserError(f"plan was made for another model (fingerprint {plan.model_fingerprint} != "
                            f"{self._fingerprint} of {type(self._model).__name__}'s parameter names and shapes); "
                            f"re-plan with `autoparallel plan` for this model")
        if (plan.recompute or plan.pp > 1) and layout.container is None:
            raise UserError(f"plan asks for {'pipeline stages' if plan.pp > 1 else 'per-block recompute'} but "
                            f"{type(self._model).__name__} has no repeated-block container (a ModuleDict, ModuleList "
                            f"or Sequential of same-class blocks)")
        if plan.pp > 1 and self._hf is not None and self._hf.no_pipeline:
            raise UserError(f"plan has pp={plan.pp} but "
                            f"{no_pipeline_clause(type(self._model).__name__, self._hf.no_pipeline)}; "
                            f"use a plan with pp=1")
        known = {n for n, _ in self._model.named_modules()}
        unknown = sorted(p for p in plan.placements if p not in known)
        if unknown:
            raise UserError(f"plan placement for {unknown[0]!r}: the model has no such module; the plan was made "
                            f"for another model")
        if plan.tp > 1 and not _splits_over_tp(plan) and env.rank == 0:
            warnings.warn(f"plan: tp={plan.tp} but every module is replicated; the {plan.tp} tp ranks compute the "
                          f"same thing (the planner found no split worth its communication)", stacklevel=4)
        if plan.cp > 1:
            check_cp_model(self._model, self._hf is not None, plan.cp)
        if plan.gpus != env.world_size:
            raise UserError(f"plan is for {plan.gpus} processes (pp*dp*cp*ep*tp = {plan.pp}*{plan.dp}*{plan.cp}*"
                            f"{plan.ep}*{plan.tp}) but {env.world_size} are running; launch with `torchrun --nproc-per-node "
                            f"{plan.gpus}` or re-plan for {env.world_size}")

    def _expert_paths(self, plan: Plan) -> list[str]:
        paths = {p for p, v in plan.placements.items() if v == "expert"}
        paths |= set(self._moe.get("expert_modules", ()))
        paths |= {n for n, m in self._model.named_modules() if type(m).__name__ in _EXPERT_CLASSES}
        return sorted(paths)

    def _setup(self, plan: Plan) -> None:
        self._validate(plan)
        env, layout = self._env, self._layout
        if env.distributed:
            self._meshes = build_meshes(env, plan)
        meshes = self._meshes
        source = None if is_meta_model(self._model) else full_source(self._model)
        if source is not None and env.distributed and env.world_size > 1:
            source = broadcast_source(source, env.device)
        seed = shared_seed(env.device) if source is None and env.distributed else None
        meta = meta_copy(self._model)
        fp32_masters(meta)
        if self._hf is not None:
            install_forward(meta, self._hf)  # deep copies (pipeline stages) rebind it to themselves
        if plan.pp > 1:
            blocks = virtual_stage_blocks(plan, layout)
            n_stages = plan.pp * plan.vpp
            pp_rank = meshes.coordinate("pp")
            parts = [(v, pipeline_part(meta, layout, set(blocks[v]), v == 0, v == n_stages - 1))
                     for v in local_virtual_stages(plan, pp_rank)]
        else:
            parts = [(0, meta)]
        experts = self._expert_paths(plan)
        # Expert groups are FSDP units of their own when ep-sharded (on the expert mesh) or when their data-
        # parallel group has more than one rank, whose collectives then start as soon as the experts are done:
        # a 1.2B MoE's two-GPU dp2 steps ran 3-10% faster so (s18 against s19). On one data-parallel rank
        # there is nothing to overlap, and a nested unit costs: FSDP2's hooks are opaque to Dynamo, so it
        # splits a compiled block into five graphs (a fully recomputed one runs eager), and the same MoE's
        # one-GPU compiled steps ran 10-17% faster with the experts in their block's unit
        # (docs/trainer_sweep_notes.md, "Expert units").
        units = experts if plan.experts_apart else []
        mp = mixed_precision_policy(plan.param_dtype, plan.grad_reduce_dtype)
        # FSDP2 computes with low-precision copies of the parameters and leaves buffers as they are; a Hugging
        # Face model mixes its buffers into its activations as its low-precision load made them (MiniMax's
        # fp32 decay factors times bf16 attention weights fail in the matmul after them): give each buffer that
        # load's dtype. Local mode computes under autocast, which casts at each op instead.
        low = to_dtype(plan.param_dtype, "param_dtype")
        buffers = buffer_dtypes(self._model, low) if self._hf is not None and env.distributed and \
            low != torch.float32 else {}
        self._fp8_modules = []
        # Vocab-sharded logits + parallel cross entropy when the default loss runs on a sharded head.
        # The sharding solver replicates everything when splitting cannot pay (tiny widths under a pinned
        # tp, sequence parallelism then included): such a plan runs without tensor parallelism, the tp
        # ranks computing the same thing on the same rows.
        tensor_parallel = plan.tp > 1 and _splits_over_tp(plan)
        self._loss_parallel = (tensor_parallel and self._default_loss
                               and lm_head_path(plan.placements, layout) is not None)
        compiled = bool(self._compile) or (self._compile is None and plan.compile and env.device.type == "cuda")
        if compiled and plan.pipeline_schedule == "zero_bubble":
            raise UserError("trainer: pipeline_schedule=zero_bubble runs eager stages only (torch's zero-bubble "
                            "schedules refuse compiled modules); pass compile=False or a plan without the schedule")
        if plan.async_tp and tensor_parallel:
            self._setup_async_tp(compiled)
        # The default loss compiles with the blocks (torchtitan compiles its loss too): one fused pass over
        # the bf16 logits, where eager makes an fp32 copy and a log-softmax of it and keeps them for the
        # backward (cost_models' logits_bytes prices both). Eager under TP and CP, whose loss runs on
        # sharded logits (loss_parallel) or inside the ring-attention context.
        self._cross_entropy = (torch.compile(_cross_entropy_sum) if compiled and plan.tp == 1 and plan.cp == 1
                               else _cross_entropy_sum)
        for v, part in parts:
            # FP8 linears first, on the meta copy (torchtitan's converter order): FSDP2 then shards the
            # Float8Linear weights like any other
            self._fp8_modules += apply_fp8(part, layout, plan.fp8)
            if tensor_parallel:
                self._relayout.update(apply_tensor_parallel(part, plan.placements, meshes.tp, plan.sequence_parallel,
                                                            layout, loss_parallel=self._loss_parallel,
                                                            owned_outputs=self._hf is not None))
                self._retie(part)
            if plan.ep > 1:
                for path in experts:
                    mod = get_submodule(part, path)
                    if mod is not None:
                        apply_expert_parallel(mod, path, meshes.ep)
            if plan.pp > 1 and tensor_parallel and plan.sequence_parallel:
                add_sequence_boundary_hooks(part, layout, meshes.tp, v == 0, v == plan.pp * plan.vpp - 1)
            apply_recompute(part, layout, plan.recompute,
                            [m for m in (get_submodule(part, p) for p in units) if m is not None])
            if compiled:
                self._compile_blocks(part)
            if env.distributed:
                apply_data_parallel(part, layout, plan.zero, meshes.dense_dp, meshes.expert_dp if plan.ep > 1 else None,
                                    units, mp, int8_grads=plan.grad_reduce_dtype == "int8", tied=bool(self._ties))
            # each virtual stage draws from its own stream (seed + v): stages must not repeat weights
            part_source = source if source is None or not self._relayout else {
                k: self._relayout[k].to_trainer(t) if k in self._relayout else t for k, t in source.items()}
            materialize(part, env.device, part_source, self._init_fn, None if seed is None else seed + v)
            cast_buffers(part, buffers)
            self._retie(part)  # to_empty allocates one tensor per name: tied names must share again
            part.train()
            if self._aux is not None:
                for mod in part.modules():
                    if isinstance(mod, self._aux.router):
                        mod.register_forward_hook(self._record_router_logits)
        self._parts = parts
        self._plan = plan
        self._expert_modules = [m for _, part in parts for m in (get_submodule(part, p) for p in experts)
                                if m is not None] if plan.ep > 1 else []
        self._setup_tie_sync(plan)
        self._optimizers = [self._optimizer_factory([(clean_fqn(n), p) for n, p in part.named_parameters()])
                            for _, part in parts]
        self._build_schedulers()
        if plan.pp > 1:
            if plan.cp > 1:  # the schedule calls each stage with its input only: positions come by hook
                for _, part in parts:
                    part.register_forward_pre_hook(self._inject_positions, with_kwargs=True)
            self._schedule = build_schedule(parts, plan, meshes.pp, env.device, self._micro_loss)
        self._autocast = (torch.autocast(env.device.type, dtype=to_dtype(plan.param_dtype, "param_dtype"))
                          if not env.distributed and to_dtype(plan.param_dtype, "param_dtype") != torch.float32
                          else None)

    def _build_schedulers(self) -> None:
        """One scheduler per optimizer from the lr_scheduler factory, stepped to the steps taken (lr_schedule)."""
        if self._scheduler_factory is None:
            return
        self._schedulers = [lr_schedule.build(self._scheduler_factory, opt) for opt in self._optimizers]
        lr_schedule.fast_forward(self._schedulers, self._steps)

    def _record_router_logits(self, _mod: nn.Module, _args: Any, out: Any) -> None:
        # (a checkpointed block's recomputation in backward appends again: cleared at the next forward)
        self._router_logits.append(out[self._aux.index] if isinstance(out, tuple) else out)

    def _retie(self, part: nn.Module) -> None:
        """Tensor parallelism replaced each module's parameters: point tied names at one DTensor again."""
        names = {clean_fqn(n): p for n, p in part.named_parameters(remove_duplicate=False)}
        for group in self._ties:
            present = [n for n in group if n in names]
            if len(present) < 2:
                continue
            keep = names[present[0]]
            for n in present[1:]:
                other = names[n]
                if isinstance(keep, DTensor) != isinstance(other, DTensor) or (
                        isinstance(keep, DTensor) and keep.placements != other.placements):
                    raise UserError(f"plan: tied parameters {present[0]} and {n} get different tensor-parallel "
                                    f"layouts; give their modules matching placements (vocab with colwise)")
                set_param(part, n, keep)

    def _setup_async_tp(self, compiled: bool) -> None:
        """plan.async_tp (validated: tp > 1, sequence parallel, compile): overlap the compiled blocks'
        sequence-parallel collectives with their matmuls (tensor_parallel.enable_async_tp). Off CUDA
        there is no symmetric memory: the plan runs as plain TP + SP (the same collectives, exposed),
        with a warning, as a compiled plan runs eager off the GPU."""
        if self._env.device.type != "cuda":
            if self._env.rank == 0:
                warnings.warn(f"plan: async_tp needs CUDA symmetric memory; on {self._env.device.type} the trainer "
                              f"runs synchronous tensor parallelism (same collectives, not overlapped)", stacklevel=5)
            return
        if not compiled:
            raise UserError("plan: async_tp rewrites compiled blocks but the trainer was given compile=False; drop "
                            "compile=False or set async_tp: false in the plan")
        enable_async_tp(self._meshes.tp)

    def _compile_blocks(self, part: nn.Module) -> None:
        kwargs = self._compile if isinstance(self._compile, dict) else {}
        container = get_submodule(part, self._layout.container or "")
        if container is None:
            part.compile(**kwargs)
            return
        for key in self._layout.blocks:
            block = get_submodule(container, key)
            if block is not None:
                block.compile(**kwargs)

    def _setup_tie_sync(self, plan: Plan) -> None:
        """Tied parameters split over pipeline stages (embedding on the first, head on the last) are two
        copies: their gradients are summed between the holders each step (Megatron's embedding group)
        and the copies start equal."""
        self._tie_sync = []
        self._tie_copies = []
        if plan.pp == 1:
            return
        layout, meshes = self._layout, self._meshes
        blocks = virtual_stage_blocks(plan, layout)
        n_stages = plan.pp * plan.vpp

        def under(fqn: str, paths: tuple[str, ...]) -> bool:
            return any(fqn.startswith(p + ".") for p in paths)

        def holder(fqn: str) -> int:
            if under(fqn, layout.pre):
                return 0
            if under(fqn, layout.post):
                return (n_stages - 1) % plan.pp
            prefix = f"{layout.container}."
            key = fqn[len(prefix):].split(".")[0] if fqn.startswith(prefix) else None
            for v, keys in enumerate(blocks):
                if key in keys:
                    return v % plan.pp
            return 0

        mesh = meshes.world.mesh  # [pp, dp, cp, ep, tp] global ranks
        for group in self._ties:
            holders = sorted({holder(n) for n in group})
            if len(holders) < 2:
                continue
            mine = None
            for d in range(plan.dp):
                for c in range(plan.cp):
                    for e in range(plan.ep):
                        for t in range(plan.tp):
                            ranks = [int(mesh[h, d, c, e, t]) for h in holders]
                            pg = new_group(ranks)
                            if self._env.rank in ranks:
                                mine = pg
            local = {clean_fqn(n) for part in self.model_parts for n, _ in part.named_parameters(remove_duplicate=False)}
            name = next((n for n in group if n in local), None)
            if name is not None:
                self._tie_sync.append((name, mine))
                if meshes.coordinate("pp") != holders[0]:  # the same summed gradient as the first holder's
                    self._tie_copies.append(name)
                self._broadcast_tied(name, mine, int(mesh[(holders[0],) + tuple(meshes.world.get_coordinate()[1:])]))

    def _param(self, fqn: str) -> torch.Tensor:
        for part in self.model_parts:
            for n, p in part.named_parameters(remove_duplicate=False):
                if clean_fqn(n) == fqn:
                    return p
        raise KeyError(fqn)

    def _broadcast_tied(self, name: str, group: Any, src: int) -> None:
        p = self._param(name)
        with torch.no_grad():
            dist.broadcast(local_shard(p), src=src, group=group)

    def _sync_tied_grad(self, name: str, group: Any) -> None:
        g = self._param(name).grad
        if g is None:
            raise UserError(f"tied parameter {name} got no gradient on this pipeline stage")
        dist.all_reduce(local_shard(g), group=group)

    # ---- stepping ----------------------------------------------------------------------------
    def _forward_only(self, local: Batch, n_micro: int, plan: Plan) -> torch.Tensor:
        """This rank's loss of `local` without gradients, its modules in eval mode (restored after); the
        parameters a forward left gathered are resharded, so the memory after it is a step's."""
        parts = [part for _, part in self._parts]
        modes = [{m: m.training for m in part.modules()} for part in parts]
        try:
            for part in parts:
                part.eval()
            with torch.no_grad(), loss_parallel() if self._loss_parallel else nullcontext(), \
                    _explain_sharding_failure(plan):
                if plan.pp > 1:
                    return self._pipeline_step(local, train=False)
                return self._accumulation_step(local, n_micro, train=False)
        finally:
            self._router_logits.clear()
            for part, mode in zip(parts, modes, strict=True):
                for m, training in mode.items():
                    m.training = training
                reshard(part)

    def _accumulation_step(self, local: Batch, n_micro: int, train: bool = True) -> torch.Tensor:
        (_, model), = self._parts
        mb = local.rows // n_micro
        fsdp = hasattr(model, "set_requires_gradient_sync")
        total = torch.zeros((), device=self.device)
        for i in range(n_micro):
            if fsdp and train:
                # zero 0/1: accumulate locally, reduce once; zero 2/3: reduce-scatter every micro-batch
                model.set_requires_gradient_sync(i == n_micro - 1 or self.plan.zero >= 2)
            chunk = local.slice(i * mb, (i + 1) * mb)
            if self.plan.cp > 1:
                loss = self._cp_micro_step(model, chunk, n_micro, train)
            else:
                self._router_logits.clear()
                with self._autocast or nullcontext():
                    out = model(chunk.inputs) if chunk.attention_mask is None else model(
                        chunk.inputs, attention_mask=chunk.attention_mask)
                    loss = self._micro_loss(out, chunk.labels)
                    if self._aux is not None:
                        aux = self._router_aux_loss(chunk.attention_mask)
                        if isinstance(loss, DTensor):  # loss_parallel: a replicated DTensor; aux is equal on the tp ranks
                            aux = DTensor.from_local(aux, loss.device_mesh, loss.placements, run_check=False)
                        loss = loss + aux
                if train:
                    (loss / n_micro).backward()
            total += _value(loss)
        return total / n_micro

    def _router_aux_loss(self, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """This data slice's share of HF's load-balancing loss of the global batch: the selection
        counts and token rows are summed over the data-parallel ranks (no gradient), the router
        probabilities stay local, so the shares add up to coef * E * sum(counts * probs) / rows^2 over
        the whole batch, as transformers computes it on one device. Times dp*ep: gradients are
        averaged over the data-parallel ranks."""
        aux, plan = self._aux, self.plan
        if not self._router_logits:
            raise UserError(f"config.output_router_logits: no {aux.router.__name__} ran in this forward")
        counts, probs, rows = load_balance_terms(self._router_logits, aux.num_experts, aux.top_k, attention_mask)
        self._router_logits.clear()
        totals = torch.cat([counts, rows.reshape(1)])
        if self._meshes is not None and plan.dp * plan.ep > 1:
            dist.all_reduce(totals, group=self._meshes.dense_dp.get_group())
        counts, rows = totals[:-1], totals[-1]
        return aux.coef * plan.dp * plan.ep * aux.num_experts * (counts * probs).sum() / rows ** 2

    def _cp_micro_step(self, model: nn.Module, chunk: Batch, n_micro: int, train: bool = True) -> torch.Tensor:
        """Forward and backward of one micro-batch on this cp rank's load-balanced share of the sequence
        (autoparallel/trainer/context_parallel.py): inputs, labels and positions are sharded alike."""
        inputs, labels = chunk.inputs.clone(), chunk.labels.clone()  # owned: sharded in place
        positions = torch.arange(chunk.seq_len, device=inputs.device)
        with cp_context(self._meshes.cp, [inputs, labels, positions], [1, 1, 0]):
            out = model(inputs, positions=positions)
            loss = self._micro_loss(out, labels)
            if train:
                (loss / n_micro).backward()
        return loss

    def _micro_loss(self, output: Any, labels: torch.Tensor) -> torch.Tensor:
        if self._user_loss is not None:
            return _checked_loss(self._user_loss(_logits(output), labels))
        return self._cross_entropy(_logits(output), labels) * self._loss_scale

    def _inject_positions(self, _mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, "positions": self._cp_positions}

    def _pipeline_step(self, local: Batch, train: bool = True) -> torch.Tensor:
        if self.plan.cp == 1:
            return self._schedule_step(local, train)
        # the whole slice's inputs, labels and positions sharded alike (context_parallel.py); the schedule
        # cuts micro-batches along the rows, which the sequence sharding leaves whole
        inputs, labels = local.inputs.clone(), local.labels.clone()
        self._cp_positions = torch.arange(local.seq_len, device=inputs.device)
        try:
            with cp_context(self._meshes.cp, [inputs, labels, self._cp_positions], [1, 1, 0]):
                return self._schedule_step(Batch(inputs, labels), train)
        finally:
            self._cp_positions = None

    def _schedule_step(self, local: Batch, train: bool = True) -> torch.Tensor:
        stages = [v for v, _ in self._parts]
        run = self._schedule.step if train else partial(_schedule_eval, self._schedule)
        n_stages = self.plan.pp * self.plan.vpp
        first, last = 0 in stages, n_stages - 1 in stages
        losses: list[torch.Tensor] = []
        # The attention mask is a keyword argument of every stage's forward: each rank's schedule cuts
        # it into the same micro-batches as the inputs, so every stage sees its micro-batch's mask
        # (activations alone travel between stages).
        kwargs = {} if local.attention_mask is None else {"attention_mask": local.attention_mask}
        if first:
            run(local.inputs, target=local.labels if last else None, losses=losses, **kwargs)
        elif last:
            run(target=local.labels, losses=losses, **kwargs)
        else:
            run(**kwargs)
        if last:
            return torch.stack([_value(x) for x in losses]).mean()
        return torch.zeros((), device=self.device)

    def _global_loss(self, local_loss: torch.Tensor) -> float:
        """Mean over dp*cp*ep token slices; counted once per slice (last pipeline stage, tp rank 0)."""
        if self._meshes is None:
            return float(local_loss)
        plan, meshes = self.plan, self._meshes
        counts = meshes.coordinate("pp") == plan.pp - 1 and meshes.coordinate("tp") == 0
        value = (local_loss.detach().float() / plan.dense_dp) if counts else torch.zeros((), device=self.device)
        value = value.to(self.device).reshape(1).clone()
        dist.all_reduce(value)
        return float(value)


def _schedule_eval(schedule: Any, *args: Any, **kwargs: Any) -> Any:
    """The pipeline schedule's forward-only pass: its `eval` where this torch has one, else the same switch by hand."""
    if hasattr(schedule, "eval"):
        return schedule.eval(*args, **kwargs)
    saved = schedule._has_backward
    try:
        schedule._has_backward = False
        return schedule.step(*args, **kwargs)
    finally:
        schedule._has_backward = saved


def _takes_attention_mask(model: nn.Module) -> bool:
    """Whether model(inputs, attention_mask=...) is a call its forward accepts (a Hugging Face model's, after the
    trainer set autoparallel.hf's forward on its copy, does)."""
    import inspect

    params = inspect.signature(model.forward).parameters.values()
    return any(p.name == "attention_mask" or p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
