"""What the trainer needs to know about a model's shape: its blocks, what comes before and after them,
tied parameters, and stable parameter names (FQNs) that survive wrappers.

The catalog models follow docs/architecture.md (`tok_embeddings [pos_embeddings] layers norm lm_head`,
blocks in a ModuleDict). A user model is handled the same way when it has one repeated-block
container (ModuleDict, ModuleList or Sequential, at the root or nested like Hugging Face's `model.layers`: the
blocks the planner traced, `autoparallel.blocks.find_blocks`);
pipeline parallelism additionally needs a forward that skips submodules set to None (the torchtitan
convention; Hugging Face models get one from autoparallel/hf.py).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
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
    pre: tuple[str, ...]           # parametric modules registered before the container (embeddings)
    post: tuple[str, ...]          # and after it (final norm, lm_head); paths may be dotted (HF models)
    positions: tuple[str, ...] = ()  # learned position tables besides `pos_embeddings` (GPT-2's wpe)

    def block_path(self, key: str) -> str:
        return f"{self.container}.{key}"

    @property
    def block_paths(self) -> tuple[str, ...]:
        return tuple(self.block_path(k) for k in self.blocks)


def find_layout(model: nn.Module) -> ModelLayout:
    """The blocks the planner traced (`blocks.find_blocks`: one rule for both, so a plan's per-block fields name
    the blocks run here), their container and what runs before and after it."""
    from autoparallel.blocks import find_blocks

    paths = find_blocks(model)
    if not paths:
        return ModelLayout(None, (), (), ())
    path = paths[0].rpartition(".")[0]
    keys = tuple(p.rpartition(".")[2] for p in paths)
    pre, post = _around(model, path)
    return ModelLayout(path, keys, pre, post)


class _SelfUses(ast.NodeVisitor):
    """`self.<name>` uses of a forward in the order they run: a call's arguments before the call
    (`self.norm(self.proj(h))` runs proj first), an assignment's value before its targets; the rest in
    source order. A call of one of the class's own methods (`cls`: Gemma 4's `self.get_per_layer_inputs(..)`, which
    runs `self.embed_tokens_per_layer`) counts the uses in that method's body where the call runs."""

    def __init__(self, cls: type | None = None, inside: frozenset[str] = frozenset()) -> None:
        self.order: list[str] = []
        self.cls = cls
        self.inside = inside  # the methods being read (a recursive one is read once)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            self.order.append(node.attr)

    def visit_Call(self, node: ast.Call) -> None:
        for arg in (*node.args, *node.keywords):
            self.visit(arg)
        self.visit(node.func)
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            self.order += _method_uses(self.cls, func.attr, self.inside)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)


def _method_uses(cls: type | None, name: str, inside: frozenset[str]) -> list[str]:
    """The `self.<name>` uses (_SelfUses) in the body of `cls`'s own method `name`, [] for anything else (a child
    module, an attribute, a method without readable source, `forward` or a method already being read)."""
    from autoparallel.hf import source_of

    method = inspect.getattr_static(cls, name, None) if cls is not None else None
    if not inspect.isfunction(method) or name == "forward" or name in inside:
        return []
    source = source_of(method)
    try:
        tree = ast.parse(textwrap.dedent(source)) if source else None
    except SyntaxError:
        return []
    if tree is None:
        return []
    uses = _SelfUses(cls, inside | {name})
    uses.visit(tree)
    return uses.order


def _mentions(parent: nn.Module, names: list[str]) -> dict[str, list[int]] | None:
    """Where `parent`'s class forward uses each of `names` (`self.<name>`; [] where it does not), as
    indices in the order the uses run (`_SelfUses`); None where the source cannot be read."""
    from autoparallel.hf import source_of  # (hf reads this module's helpers at call time too)

    source = source_of(type(parent).forward)
    if not source:
        return None
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    uses = _SelfUses(type(parent))
    uses.visit(tree)
    return {n: [i for i, u in enumerate(uses.order) if u == n] for n in names}


def forward_mentions(parent: nn.Module, names: list[str]) -> dict[str, tuple[int, int]] | None:
    """Where `parent`'s class forward first and last names each of `names`; None where the source cannot be
    read or does not name each of them (a forward that reaches a child another way)."""
    hits = _mentions(parent, names)
    if hits is None or not all(hits.values()):
        return None
    return {n: (h[0], h[-1]) for n, h in hits.items()}


def mentioned_before(parent: nn.Module, names: list[str], piece: str) -> list[str]:
    """Those of `names` that `parent`'s forward names before it first names `piece` ([] without its source)."""
    hits = _mentions(parent, [*names, piece])
    if hits is None or not hits[piece]:
        return []
    return [n for n in names if n != piece and hits[n] and hits[n][0] < hits[piece][0]]


def forward_order(parent: nn.Module, names: list[str]) -> list[str]:
    """`names` (children of `parent`) in the order its class's forward first names them, which is the order
    they run in; registration order is not, for every model (OPT registers its final norm and output
    projection before its blocks). The registration order given where `forward_mentions` has none."""
    where = forward_mentions(parent, names)
    return names if where is None else sorted(names, key=lambda n: where[n][0])


def runs_around(parent: nn.Module, names: list[str], piece: str) -> set[str]:
    """Children of `names` that `parent`'s forward names both before and after `piece` (NanoChat applies one
    parameter-free norm before its blocks and after them): every pipeline stage keeps them."""
    where = forward_mentions(parent, names if piece in names else [*names, piece])
    if where is None:
        return set()
    first, last = where[piece]
    return {n for n in names if n != piece and where[n][0] < first and where[n][1] > last}


def _around(model: nn.Module, path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Modules that compute, run before / after the container at each level of its path (an HF model's
    `model.embed_tokens` before `model.layers`, `model.norm` and `lm_head` after; `forward_order`),
    outermost first for `pre`, innermost first for `post` (execution order); `hf.computes` says which
    modules compute (OLMo's parameter-free final LayerNorm does: a stage that does not own it must not
    apply it)."""
    pre: list[str] = []
    post: list[str] = []
    from autoparallel.hf import computes

    parent, prefix = model, ""
    for piece in path.split("."):
        names = forward_order(parent, [n for n, c in parent.named_children() if n == piece or computes(c)])
        names = [n for n in names if n not in runs_around(parent, names, piece)]  # kept on every stage
        idx = names.index(piece) if piece in names else len(names)
        pre += [prefix + n for n in names[:idx]]
        post[:0] = [prefix + n for n in names[idx + 1:]]
        parent, prefix = getattr(parent, piece), f"{prefix}{piece}."
    return tuple(pre), tuple(post)


def pipelineable(model: nn.Module, layout: ModelLayout) -> bool:
    """Whether the trainer can split the model into pipeline stages: stages drop other stages' blocks
    from the container's registry (names kept) and set the ends they do not own to None, so the forward
    must skip missing modules. The project's models do (blocks in a root-level nn.ModuleDict), and so
    does the forward the trainer installs on a Hugging Face causal LM (`model.model.layers`, a
    ModuleList); a user module's own forward may not."""
    from autoparallel.hf import is_hf_causal_lm

    container = layout.container or ""
    if not container:
        return False
    blocks = get_submodule(model, container)
    if is_hf_causal_lm(model):
        return isinstance(blocks, (nn.ModuleDict, nn.ModuleList))
    return "." not in container and isinstance(blocks, nn.ModuleDict)


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
    # quantized weights (bitsandbytes' 4/8-bit, torchao's int8, GPTQ/AWQ packed ints) are stored as integers FSDP2
    # and the planner would treat as plain tensors: one line here, not an error deep in the first forward
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None or getattr(model, "is_quantized", False):
        method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
        raise UserError(f"model {type(model).__name__} is quantized{f' ({method})' if method else ''}: "
                        f"AutoParallelTrainer trains floating-point parameters; load it unquantized, e.g. "
                        f"from_pretrained(..., dtype=torch.bfloat16)")
    bad = next(((n, p.dtype) for n, p in model.named_parameters() if not p.is_floating_point()), None)
    if bad is not None:
        raise UserError(f"model {type(model).__name__}: parameter {bad[0]} is {str(bad[1]).removeprefix('torch.')}, "
                        f"not floating point (a quantized weight?); AutoParallelTrainer shards and trains "
                        f"floating-point parameters: load the model unquantized")
