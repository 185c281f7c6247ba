"""The operator graph type lives with its consumer, cost_models.graph (the dependency order is
hardware_profiles <- cost_models <- autoparallel); re-exported here for the tracer and users."""

from cost_models.graph import PARAM_KINDS, ExpertGroup, Launches, OpGraph, ParamOp, RegionCost

__all__ = ["PARAM_KINDS", "ExpertGroup", "Launches", "OpGraph", "ParamOp", "RegionCost"]
