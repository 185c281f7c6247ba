"""Rebuild the user's optimizer on the parallel parameters.

The optimizer handed to the trainer was built on the unsharded model. The trainer creates one optimizer
of the same class per model part (the whole model, or each local pipeline stage, as torchtitan does),
with the same defaults and, parameter by parameter (matched by name), the same param-group
hyperparameters. Optimizer *state* of the given instance is not carried over (it is normally empty);
resume from a checkpoint instead. A factory `callable(params) -> Optimizer` is called per part with
that part's parameters.

Adam and AdamW whose caller left the implementation open (foreach and fused both None) run fused on
CUDA, as torchtitan's default: one kernel reads p, g, m, v and writes p, m, v (28 B per fp32
parameter), the update the cost model prices (cost_models/compute.py fsdp_update_time); torch's default
there is the multi-tensor (foreach) path, about three times the memory traffic.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autoparallel.errors import UserError
from autoparallel.trainer.structure import clean_fqn

OptimizerFactory = Callable[[list[tuple[str, nn.Parameter]]], torch.optim.Optimizer]


def _implementation(cls: type, defaults: dict[str, Any], params: list[nn.Parameter]) -> dict[str, Any]:
    """`defaults` with fused=True for Adam/AdamW on CUDA parameters when no implementation was chosen."""
    open_choice = defaults.get("fused") is None and defaults.get("foreach") is None
    on_cuda = bool(params) and all(p.device.type == "cuda" for p in params)
    if cls in (torch.optim.Adam, torch.optim.AdamW) and open_choice and on_cuda:
        return {**defaults, "fused": True}
    return defaults


def make_optimizer_factory(optimizer: Any, model: nn.Module) -> OptimizerFactory:
    if optimizer is None:
        def default(named: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
            params = [p for _, p in named]
            return torch.optim.AdamW(params, **_implementation(torch.optim.AdamW, {"lr": 3e-4}, params))
        return default
    if isinstance(optimizer, torch.optim.Optimizer):
        return _rebuild_factory(optimizer, model)
    if callable(optimizer):
        def call(named: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
            opt = optimizer([p for _, p in named])
            if not isinstance(opt, torch.optim.Optimizer):
                raise UserError(f"optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
            return opt
        return call
    raise UserError(f"optimizer: expected a torch.optim.Optimizer or a callable(params) -> Optimizer, got "
                    f"{type(optimizer).__name__}")


def _rebuild_factory(optimizer: torch.optim.Optimizer, model: nn.Module) -> OptimizerFactory:
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(clean_fqn(name))
    group_of: dict[str, int] = {}
    hyper: list[dict[str, Any]] = []
    for gi, group in enumerate(optimizer.param_groups):
        hyper.append({k: v for k, v in group.items() if k != "params"})
        for p in group["params"]:
            if id(p) not in names_of:
                raise UserError(f"optimizer: a parameter of shape {tuple(p.shape)} in param group {gi} is not a "
                                f"parameter of the model; build the optimizer on model.parameters()")
            for n in names_of[id(p)]:
                group_of[n] = gi
    cls = type(optimizer)
    # Pass only the defaults the constructor accepts (AdamW keeps Adam's decoupled_weight_decay in
    # .defaults but does not take it); the param groups carry every hyperparameter anyway.
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}

    def build(named: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        groups: dict[int, list[nn.Parameter]] = {}
        for name, p in named:
            gi = group_of.get(clean_fqn(name))
            if gi is not None:
                groups.setdefault(gi, []).append(p)
        param_groups = [{"params": ps, **hyper[gi]} for gi, ps in sorted(groups.items())]
        if not param_groups:  # a stage whose parameters the user chose not to optimize
            param_groups = [{"params": [], **hyper[0]}]
        params = [p for g in param_groups for p in g["params"]]
        impl = _implementation(cls, defaults, params)
        if impl is not defaults:  # param groups carry the implementation flags too
            param_groups = [{**g, "fused": True, "foreach": None} for g in param_groups]
        return cls(param_groups, **impl)

    return build
