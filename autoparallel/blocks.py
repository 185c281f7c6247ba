"""Which modules of a model are its repeated blocks: one rule, read by the tracer (the planner's blocks) and by
the trainer (`trainer.structure.find_layout`, the blocks it wraps, checkpoints, compiles and splits into stages),
so that a plan's per-block fields always name the blocks the trainer runs."""

from __future__ import annotations

from torch import nn


def find_blocks(model: nn.Module) -> list[str]:
    """Module paths of the repeated blocks: the children of the longest ModuleList / ModuleDict /
    Sequential whose children all share one class (at least two) and hold parameters (a list of activations
    is not a model's layers), preferring the outermost such
    container (MoE expert lists nested in blocks do not win over the layer list); without one, a
    ModuleList / ModuleDict of a single block that holds parameters (a one-layer model). A Hugging Face
    causal LM's own layer list is its blocks whatever their classes (hf.hf_layer_list: a hybrid's, a multimodal
    model's language layers)."""
    from autoparallel.hf import hf_layer_list

    if (layers := hf_layer_list(model)) is not None:
        return [f"{layers}.{n}" for n, _ in model.get_submodule(layers).named_children()]
    candidates: list[tuple[str, int, int]] = []   # (path, children, depth)
    single: list[tuple[str, int, int]] = []       # a ModuleList / ModuleDict of one block with parameters
    for path, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            continue
        children = list(mod.children())
        if not children or not any(True for _ in children[0].parameters()):
            continue
        if len(children) == 1 and not isinstance(mod, nn.Sequential):
            single.append((path, 1, path.count(".") + 1 if path else 0))
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        candidates.append((path, len(children), path.count(".") + 1 if path else 0))
    # a one-layer model's layer list, where no longer one exists (its one block was found as none: "the model
    # has only 0 blocks" at pp = 1)
    candidates = candidates or single
    if not candidates:
        return []
    outer = [c for c in candidates
             if not any(o[0] != c[0] and (o[0] == "" or c[0].startswith(o[0] + ".")) for o in candidates)]
    path = max(outer, key=lambda c: (c[1], -c[2]))[0]
    container = model.get_submodule(path) if path else model
    return [f"{path}.{n}" if path else n for n, _ in container.named_children()]
