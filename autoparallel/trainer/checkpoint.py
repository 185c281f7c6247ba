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

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from autoparallel.errors import UserError
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


def save(path: str | Path, parts: list[nn.Module], opts: list[torch.optim.Optimizer], ties: list[list[str]],
         step: int, fp: str) -> None:
    sd, _ = _template(parts, opts, ties, step, fp)
    dcp.save(sd, checkpoint_id=str(path))


def load(path: str | Path, parts: list[nn.Module], opts: list[torch.optim.Optimizer], ties: list[list[str]],
         fp: str) -> int:
    """Load in place; returns the step count stored in the checkpoint."""
    if not Path(path).exists():
        raise UserError(f"checkpoint {path}: no such directory; pass a path written by save_checkpoint()")
    sd, per_part = _template(parts, opts, ties, 0, fp)
    try:
        dcp.load(sd, checkpoint_id=str(path))
    except Exception as e:  # DCP raises CheckpointException / RuntimeError with long multi-rank traces
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"checkpoint {path}: cannot load ({first}); was it written by save_checkpoint() for "
                        f"this model?") from None
    if sd["trainer"]["fingerprint"] != fp:
        raise UserError(f"checkpoint {path} was saved from a different model (parameter fingerprint "
                        f"{sd['trainer']['fingerprint']} != {fp})")
    for part, opt, (msd, osd) in zip(parts, opts, per_part, strict=True):
        model_sd = {k: sd["model"][k] for k in msd}
        optim_sd = {"state": {k: sd["optim"][k] for k in osd["state"]}, "param_groups": osd["param_groups"]}
        set_state_dict(part, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return int(sd["trainer"]["step"])
