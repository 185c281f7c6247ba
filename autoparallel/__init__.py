"""autoparallel: automatic parallel-strategy planner and trainer for PyTorch.

    import autoparallel
    plan = autoparallel.plan("llama3-8b", hardware="h100-sxm", gpus=64, global_batch=512, seq_len=4096,
                             max_memory_per_gpu="80GB")
    print(plan); plan.save("plan.yaml")
"""

from __future__ import annotations

from typing import Any

# Load the `plan` submodule (the Plan dataclass) before defining the `plan()` function below: a
# submodule import binds its name on the package only when it first loads, so the function keeps the
# name `autoparallel.plan` while `from autoparallel.plan import Plan` still finds the module.
from autoparallel import plan as _plan_module  # noqa: E402,F401

__version__ = "0.1.0"


def plan(*args: Any, **kwargs: Any):
    """The fastest plan that fits (see autoparallel.api.plan)."""
    from autoparallel.api import plan as _plan
    return _plan(*args, **kwargs)


def compare(*args: Any, **kwargs: Any):
    """Plan one model on several hardware profiles (see autoparallel.api.compare)."""
    from autoparallel.api import compare as _compare
    return _compare(*args, **kwargs)


def __getattr__(name: str) -> Any:
    # The trainer pulls in torch.distributed; import it only when asked for.
    if name == "AutoParallelTrainer":
        from autoparallel.trainer import AutoParallelTrainer
        return AutoParallelTrainer
    if name == "Plan":
        from autoparallel.plan import Plan
        return Plan
    raise AttributeError(f"module 'autoparallel' has no attribute {name!r}")
