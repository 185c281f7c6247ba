"""The global batch every rank is handed, and this rank's slice of it.

`step(batch)` takes the GLOBAL batch on every rank (the same tensors everywhere, e.g. from a seeded
loader) in one of three forms:

  tokens [B, S+1] (integer tensor)        next-token prediction: inputs tokens[:, :-1], labels tokens[:, 1:]
  (inputs [B, S, ...], labels [B, S, ...]) a tuple or list
  {"input_ids": ..., "labels": ...}       a mapping ("inputs" is accepted for "input_ids"), optionally
                                          with "attention_mask" [B, S] (1 = token, 0 = padding)

For a Hugging Face causal LM, labels in a mapping or tuple follow HF's convention: aligned with the
inputs, shifted here as transformers shifts them (position t predicts labels[t + 1]; -100 ignored).

The rows are split over the dp*ep data-parallel ranks, dp-major: the rank at mesh coordinates (dp=d,
ep=e) takes rows [(d*ep + e) * B/(dp*ep), (d*ep + e + 1) * B/(dp*ep)). Its slice is cut into
micro-batches of plan.micro_batch rows (gradient accumulation, or the pipeline schedule's micro-batches).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from autoparallel.errors import UserError
from autoparallel.hf import IGNORE_INDEX, hf_labels


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.inputs.shape[0]

    @property
    def seq_len(self) -> int:
        return self.inputs.shape[1] if self.inputs.dim() > 1 else 1

    def slice(self, start: int, stop: int) -> Batch:
        mask = self.attention_mask
        return Batch(self.inputs[start:stop], self.labels[start:stop], None if mask is None else mask[start:stop])

    def to(self, device: torch.device) -> Batch:
        mask = self.attention_mask
        return Batch(self.inputs.to(device, non_blocking=True), self.labels.to(device, non_blocking=True),
                     None if mask is None else mask.to(device, non_blocking=True))


MAPPING_KEYS = ("input_ids", "inputs", "labels", "attention_mask")


def check_token_ids(batch: Batch, vocab: int | None, label_vocab: int | None) -> None:
    """Refuse, before any forward, token ids outside the model's vocabulary (`vocab`: its input embedding's rows)
    and labels outside its output (`label_vocab`; -100 ignored): torch fails on them inside the embedding or the
    loss (on a GPU a device-side assert that kills the process), after earlier micro-batches ran."""
    def bounds(t: torch.Tensor) -> tuple[int, int]:
        return int(t.min()), int(t.max())

    if vocab is not None:
        if batch.inputs.is_floating_point() or batch.inputs.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise UserError(f"batch: input_ids must be integer token ids, got dtype {batch.inputs.dtype}")
        if batch.inputs.numel():
            lo, hi = bounds(batch.inputs)
            if lo < 0 or hi >= vocab:
                raise UserError(f"batch: token id {lo if lo < 0 else hi} is outside the model's vocabulary of {vocab} "
                                f"(ids 0..{vocab - 1}); does the tokenizer match the model?")
    if label_vocab is not None:
        if batch.labels.is_floating_point() or batch.labels.dtype == torch.bool:
            raise UserError(f"batch: labels must be integer token ids (-100 ignored), got dtype {batch.labels.dtype}")
        used = batch.labels[batch.labels != IGNORE_INDEX]
        if used.numel():
            lo, hi = bounds(used)
            if lo < 0 or hi >= label_vocab:
                raise UserError(f"batch: label {lo if lo < 0 else hi} is outside the model's output of {label_vocab} "
                                f"tokens (0..{label_vocab - 1}, or -100 for an ignored position)")


def parse_batch(batch: Any, hf_shift: bool = False) -> Batch:
    """hf_shift: labels of a mapping / tuple are HF-style (aligned with the inputs): shift them."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() != 2 or batch.is_floating_point():
            raise UserError(f"batch: a single tensor must be integer tokens [batch, seq+1], got shape "
                            f"{tuple(batch.shape)} dtype {batch.dtype}; pass (inputs, labels) otherwise")
        if batch.shape[1] < 2:
            raise UserError("batch: tokens [batch, seq+1] need at least 2 columns (inputs and shifted labels)")
        return Batch(batch[:, :-1], batch[:, 1:])
    if isinstance(batch, Mapping):
        inputs = batch.get("input_ids", batch.get("inputs"))
        labels = batch.get("labels")
        if inputs is None or labels is None:
            raise UserError(f"batch: a mapping needs 'input_ids' and 'labels', got keys {sorted(batch)}")
        unread = sorted(str(k) for k in batch if k not in MAPPING_KEYS)
        if unread:
            # a packing collator's position_ids, GPT-2's token_type_ids: the model's own forward would read them,
            # and training without them would be another computation than the one the user asked for
            raise UserError(f"batch: {unread} would be ignored (the trainer reads only {list(MAPPING_KEYS)} and "
                            f"numbers each row's positions 0..S-1; packed sequences with position_ids are not "
                            f"supported); drop them from the batch")
        mask = batch.get("attention_mask")
        if mask is not None and tuple(mask.shape) != tuple(inputs.shape[:2]):
            raise UserError(f"batch: attention_mask {tuple(mask.shape)} must have the shape of input_ids "
                            f"{tuple(inputs.shape[:2])}")
        if mask is not None and bool(mask.all()):
            # no padding (a tokenizer's mask of ones): causal attention through SDPA's is_causal, as transformers
            # skips such a mask too; passed on, it made every layer's attention a masked kernel that computes all
            # S^2 scores (2.9-3.1x the causal time on an H200, benchmarks/attention_timing.py --masked)
            mask = None
        parsed = parse_batch((inputs, labels), hf_shift)
        return Batch(parsed.inputs, parsed.labels, mask)
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        inputs, labels = batch
        if inputs.dim() == 0 or labels.dim() == 0 or inputs.shape[0] != labels.shape[0]:
            raise UserError(f"batch: inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)} must share "
                            f"the leading batch dimension")
        return Batch(inputs, hf_labels(labels) if hf_shift else labels)
    raise UserError(f"batch: expected tokens [batch, seq+1], (inputs, labels) or a dict with input_ids/labels, "
                    f"got {type(batch).__name__}")


def check_against_plan(batch: Batch, global_batch: int, dp_ep: int, micro_batch: int, pipelined: bool,
                       seq_len: int, tp_seq_divisor: int) -> int:
    """Validate the batch against the plan; return the number of micro-batches per rank."""
    rows = batch.rows
    unit = dp_ep * micro_batch
    if rows % unit:
        raise UserError(f"batch of {rows} rows is not divisible by dp*ep*micro_batch = {unit} as planned; "
                        f"pass a multiple of {unit} rows (the plan expects {global_batch})")
    if pipelined and rows != global_batch:
        raise UserError(f"batch of {rows} rows: a pipelined plan runs exactly its global batch of {global_batch} "
                        f"rows per step")
    if pipelined and batch.seq_len != seq_len:
        raise UserError(f"batch sequence length {batch.seq_len}: a pipelined plan runs exactly its seq_len "
                        f"{seq_len}")
    if batch.seq_len > seq_len:  # shorter rows fit the plan's budget; longer ones grow every activation
        raise UserError(f"batch sequence length {batch.seq_len} is longer than the plan's seq_len {seq_len}, whose "
                        f"activation memory it was budgeted for; pass seq_len={batch.seq_len} (the longest your "
                        f"data has) to AutoParallelTrainer or the planner, or crop the sequences")
    if tp_seq_divisor > 1 and batch.seq_len % tp_seq_divisor:
        raise UserError(f"batch sequence length {batch.seq_len} is not divisible by tp={tp_seq_divisor}, which "
                        f"sequence parallelism needs; pad or crop the sequences")
    return rows // unit
