"""Checkpoints with torch.distributed.checkpoint (DCP), independent of the plan that wrote them.

Keys are the model's own FQNs (wrappers stripped by DCP's get_state_dict; ModuleDict blocks keep
`layers.<i>` under any pipeline split), values DTensors or tensors that DCP reshards on load. So a
checkpoint saved under dp2 x tp2 loads under pp2 x dp2 or on one process. Layout of the saved dict:

  model.<fqn>                    parameters and persistent buffers
  optim.<fqn>.<state key>        optimizer state per parameter (e.g. exp_avg, exp_avg_sq, step)
  trainer.step, trainer.fingerprint

Optimizer param groups are not saved: the hyperparameters come from the optimizer given to the
trainer. A tied parameter's optimizer state is stored under every name of the tie present in a part,
so a plan that splits the tie across pipeline stages finds it under the name it holds.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from autoparallel.errors import UserError
from autoparallel.trainer.materialize import fill_from_full
from autoparallel.trainer.structure import clean_fqn


def _part_state(part: nn.Module, opt: torch.optim.Optimizer, ties: list[list[str]]
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    msd, osd = get_state_dict(part, opt)
    state = dict(osd["state"])
    names = {clean_fqn(n) for n, _ in part.named_parameters(remove_duplicate=False)}
    for group in ties:
        present = [n for n in group if n in names]
        have = next((n for n in present if n in state), None)
        for n in present:
            if have is not None and n not in state:
                state[n] = state[have]
    return msd, state, osd


def _template(parts: list[nn.Module], opts: list[torch.optim.Optimizer], ties: list[list[str]], step: int,
              fp: str) -> tuple[dict[str, Any], list[tuple[dict, dict]]]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    per_part = []
    for part, opt in zip(parts, opts, strict=True):
        msd, state, osd = _part_state(part, opt, ties)
        model.update(msd)
        optim.update(state)
        per_part.append((msd, osd))
    sd = {"model": model, "optim": optim, "trainer": {"step": torch.tensor(step), "fingerprint": fp}}
    return sd, per_part


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it runs single-process whenever no process group exists: that is local mode."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def writable_dir(path: str | Path, what: str) -> None:
    """Refuse, in one line, a save target that is a file or cannot be created as a directory (DCP raised a
    BaseException there, which `except Exception` does not catch; transformers' save_pretrained logged a line
    and returned without writing)."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise UserError(f"{what}: {path} is a file; pass a directory (created if missing)")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{what}: cannot create the directory {path} ({e.strerror or e}); pass a writable "
                        f"directory") from None


def _dcp_load(sd: dict[str, Any], path: str | Path) -> None:
    try:
        with _quiet():
            dcp.load(sd, checkpoint_id=str(path), no_dist=_no_dist())
    except (Exception, CheckpointException) as e:  # DCP wraps per-rank failures in a BaseException
        text = str(e)
        missing = re.search(r"Missing key in checkpoint state_dict: ([^\s]+?)\.?(\s|$)", text)
        what = (f"it has no {missing.group(1)}" if missing
                else (text.strip().splitlines() or [type(e).__name__])[0])
        raise UserError(f"checkpoint {path}: cannot load ({what}); was it written by save_checkpoint() for "
                        f"this model?") from None


def _relayout_entries(sd: dict[str, Any], relayout: dict[str, Any]) -> Iterator[tuple[dict, str, Any]]:
    """(container, key, Relayout) of every saved tensor of a re-laid parameter: the parameter and its
    optimizer state of the parameter's shape (exp_avg, ...; not Adam's scalar step)."""
    for fqn, how in relayout.items():
        if fqn in sd["model"]:
            shape = tuple(sd["model"][fqn].shape)
            yield sd["model"], fqn, how
            for k, v in (sd["optim"].get(fqn) or {}).items():
                if isinstance(v, torch.Tensor) and tuple(v.shape) == shape:
                    yield sd["optim"][fqn], k, how


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def save(path: str | Path, parts: list[nn.Module], opts: list[torch.optim.Optimizer], ties: list[list[str]],
         step: int, fp: str, relayout: dict[str, Any] | None = None) -> None:
    """relayout: parameters held in another row order (fused projections under tp, see
    tensor_parallel.Relayout): saved whole in the model's order, so the checkpoint is plan-independent
    (a gather of those parameters and their optimizer state per save)."""
    writable_dir(path, "save_checkpoint")
    sd, _ = _template(parts, opts, ties, step, fp)
    for container, key, how in list(_relayout_entries(sd, relayout or {})):
        container[key] = how.to_model(_full(container[key]))
    with _quiet():
        dcp.save(sd, checkpoint_id=str(path), no_dist=_no_dist())


def load(path: str | Path, parts: list[nn.Module], opts: list[torch.optim.Optimizer], ties: list[list[str]],
         fp: str, relayout: dict[str, Any] | None = None) -> int:
    """Load in place; returns the step count stored in the checkpoint."""
    if not Path(path).is_dir() or not (Path(path) / ".metadata").is_file():
        # DCP would log two tracebacks of its own before failing
        what = "no such directory" if not Path(path).exists() else (
            "a file, not a directory" if not Path(path).is_dir() else "no checkpoint in it (no .metadata)")
        raise UserError(f"checkpoint {path}: {what}; pass a directory written by save_checkpoint()")
    head: dict[str, Any] = {"trainer": {"fingerprint": ""}}
    _dcp_load(head, path)  # check the model before reading any tensor
    if head["trainer"]["fingerprint"] != fp:
        raise UserError(f"checkpoint {path} was saved from another model (parameter fingerprint "
                        f"{head['trainer']['fingerprint']} != {fp}); load it into the model that wrote it")
    sd, per_part = _template(parts, opts, ties, 0, fp)
    # re-laid parameters load whole, in the model's order, and are re-laid into their shards here
    swapped = [(container, key, how, container[key]) for container, key, how in _relayout_entries(sd, relayout or {})]
    for container, key, _how, live in swapped:
        container[key] = torch.empty(tuple(live.shape), dtype=live.dtype, device=live.device)
    _dcp_load(sd, path)
    for container, key, how, live in swapped:
        fill_from_full(live, how.to_trainer(container[key]), key)
        container[key] = live
    for part, opt, (msd, osd) in zip(parts, opts, per_part, strict=True):
        model_sd = {k: sd["model"][k] for k in msd}
        optim_sd = {"state": {k: sd["optim"][k] for k in osd["state"]}, "param_groups": osd["param_groups"]}
        set_state_dict(part, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return int(sd["trainer"]["step"])
