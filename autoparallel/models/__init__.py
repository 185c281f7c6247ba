"""The project's model definitions: gpt, llama and moe families sharing one module layout.

    build_model(spec) -> nn.Module    on the current default device:
                                      `with torch.device("meta"): build_model(spec)` allocates nothing.

Materializing a meta model (what the trainer does): `model.to_empty(device=dev)` then
`model.init_weights(seed=None)` on the root, which re-ties tied embeddings (to_empty unties them)
and initializes every parameter deterministically from the torch RNG (see Transformer.init_weights).
Module paths are documented in docs/architecture.md ("Model modules").
"""

from __future__ import annotations

from autoparallel.models.gpt import GPT
from autoparallel.models.layers import MLP, Attention, Block, GeluMLP, Transformer
from autoparallel.models.llama import Llama
from autoparallel.models.moe import GroupedExperts, MoE, MoETransformer, Router
from autoparallel.specs import ModelSpec, load_model, load_model_spec

__all__ = [
    "GPT", "MLP", "Attention", "Block", "GeluMLP", "GroupedExperts", "Llama", "MoE", "MoETransformer",
    "Router", "Transformer", "build_model", "load_model", "load_model_spec",
]

_FAMILY_CLASSES: dict[str, type[Transformer]] = {"gpt": GPT, "llama": Llama, "moe": MoETransformer}


def build_model(spec: ModelSpec) -> Transformer:
    """The module for `spec`, on the current default device and dtype."""
    return _FAMILY_CLASSES[spec.family](spec)
