"""What the trainer needs to know about a model's shape: its blocks, what comes before and after them,
tied parameters, and stable parameter names (FQNs) that survive wrappers.

The catalog models follow docs/architecture.md (`tok_embeddings [pos_embeddings] layers norm lm_head`,
blocks in a ModuleDict). A user model is handled the same way when it has one repeated-block
container (ModuleDict or ModuleList); pipeline parallelism additionally needs that container at the
root as a ModuleDict and a forward that skips submodules set to None (the torchtitan convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoparallel.errors import UserError
from autoparallel.plan import fingerprint

# Name pieces that wrappers insert; removing them gives the FQN of the unwrapped model.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_fqn(name: str) -> str:
    for piece in _WRAPPER_PREFIXES:
        name = name.replace(piece, "")
    return name


@dataclass(frozen=True)
class ModelLayout:
    container: str | None          # path of the block container ("layers"); None: no repeated blocks
    blocks: tuple[str, ...]        # keys of the blocks in the container, in execution order
    pre: tuple[str, ...]           # root children registered before the container (embeddings)
    post: tuple[str, ...]          # root children registered after it (final norm, lm_head)

    def block_path(self, key: str) -> str:
        return f"{self.container}.{key}"

    @property
    def block_paths(self) -> tuple[str, ...]:
        return tuple(self.block_path(k) for k in self.blocks)


def _param_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def find_layout(model: nn.Module) -> ModelLayout:
    """The largest ModuleDict/ModuleList whose children all share one class: the transformer blocks."""
    best: tuple[int, str, nn.Module] | None = None
    for path, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleDict, nn.ModuleList)) or len(mod) == 0:
            continue
        children = list(mod.children())
        if len({type(c) for c in children}) != 1 or not any(True for _ in children[0].parameters()):
            continue
        n = _param_count(mod)
        if best is None or n > best[0]:
            best = (n, path, mod)
    if best is None:
        return ModelLayout(None, (), (), ())
    _, path, container = best
    keys = tuple(container.keys()) if isinstance(container, nn.ModuleDict) else tuple(
        str(i) for i in range(len(container)))
    pre: list[str] = []
    post: list[str] = []
    if "." not in path:
        names = [n for n, _ in model.named_children()]
        idx = names.index(path)
        pre, post = names[:idx], names[idx + 1:]
    return ModelLayout(path, keys, tuple(pre), tuple(post))


def pipelineable(model: nn.Module, layout: ModelLayout) -> bool:
    """Pipeline stages delete blocks by key, which keeps parameter names only for a root-level
    nn.ModuleDict (a ModuleList renumbers): the one layout the trainer can split into stages."""
    container = layout.container or ""
    return bool(container) and "." not in container and isinstance(get_submodule(model, container), nn.ModuleDict)


def model_fingerprint(model: nn.Module) -> str:
    """autoparallel.plan.fingerprint over the model's (deduplicated) parameter names and shapes."""
    return fingerprint([(clean_fqn(n), tuple(p.shape)) for n, p in model.named_parameters()])


def tie_groups(model: nn.Module) -> list[list[str]]:
    """Parameter FQNs that share one tensor (e.g. lm_head.weight tied to tok_embeddings.weight)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(clean_fqn(name))
    return [names for names in by_id.values() if len(names) > 1]


def get_submodule(root: nn.Module, path: str) -> nn.Module | None:
    """root.get_submodule(path), or None where a piece is missing or None (deleted by a pipeline split)."""
    mod: nn.Module | None = root
    for piece in path.split(".") if path else []:
        mod = getattr(mod, piece, None) if mod is not None else None
        if mod is not None and not isinstance(mod, nn.Module):
            return None
    return mod


def set_param(root: nn.Module, fqn: str, param: nn.Parameter) -> None:
    mod_path, _, name = fqn.rpartition(".")
    mod = get_submodule(root, mod_path)
    if mod is None:
        raise KeyError(fqn)
    setattr(mod, name, param)


def check_has_parameters(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise UserError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not any(True for _ in model.parameters()):
        raise UserError(f"model {type(model).__name__} has no parameters: there is nothing to train; pass "
                        "the module whose parameters the optimizer should update")
