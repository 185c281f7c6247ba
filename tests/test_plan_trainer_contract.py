"""Property (issue 15): every plan the planner emits builds in the trainer, or the planner refuses with a
reason. Random models (catalog families at random widths, and user modules with their own module names,
widths from 8 to 256, vocabularies that do not divide tp), random clusters and random pins.

"Builds" means AutoParallelTrainer(model, plan=plan) runs its whole setup for rank 0 (and the last rank,
which holds the last pipeline stage): plan checks, DeviceMesh, DTensor tensor/sequence parallelism, expert
parallelism, FSDP2, pipeline stages and materialization. One process plays one rank of the plan's world
through torch's fake process group (collectives are no-ops), so a 16-device plan is checked in
milliseconds; a single training step then runs for the non-pipelined plans (shapes and DTensor layouts
through forward and backward; values are meaningless without real collectives).
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import nn

from autoparallel.api import plan_model
from autoparallel.errors import UserError
from autoparallel.models import build_model, load_model_spec
from autoparallel.trainer import AutoParallelTrainer

CASES = int(__import__("os").environ.get("CONTRACT_CASES", 220))
SEQ = 16


class UserBlock(nn.Module):
    """A pre-norm transformer block whose modules have names the planner has never seen."""

    def __init__(self, names: dict[str, str], h: int, heads: int, f: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.names, self.heads = names, heads
        self.head_dim = h // heads
        for key, mod in (("n1", norm(h)), ("q", nn.Linear(h, h)), ("k", nn.Linear(h, h)), ("v", nn.Linear(h, h)),
                         ("o", nn.Linear(h, h)), ("n2", norm(h)), ("up", nn.Linear(h, f)), ("down", nn.Linear(f, h))):
            self.add_module(names[key], mod)

    def _m(self, key: str) -> nn.Module:
        return getattr(self, self.names[key])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        y = self._m("n1")(x)
        q, k, v = (self._m(n)(y).view(B, S, -1, self.head_dim).transpose(1, 2) for n in ("q", "k", "v"))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, -1)
        x = x + self._m("o")(a)
        return x + self._m("down")(nn.functional.gelu(self._m("up")(self._m("n2")(x))))


class UserModel(nn.Module):
    def __init__(self, names: dict[str, str], vocab: int, h: int, heads: int, f: int, layers: int,
                 norm: type[nn.Module]) -> None:
        super().__init__()
        self.names = names
        self.add_module(names["embed"], nn.Embedding(vocab, h))
        self.add_module(names["blocks"], nn.ModuleList(UserBlock(names, h, heads, f, norm) for _ in range(layers)))
        self.add_module(names["final"], norm(h))
        self.add_module(names["head"], nn.Linear(h, vocab, bias=False))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = getattr(self, self.names["embed"])(tokens)
        for block in getattr(self, self.names["blocks"]):
            x = block(x)
        return getattr(self, self.names["head"])(getattr(self, self.names["final"])(x))


NAME = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6).map(lambda s: "m_" + s)
ROLES = ("n1", "q", "k", "v", "o", "n2", "up", "down", "embed", "blocks", "final", "head")


@st.composite
def user_model(draw: st.DrawFn) -> nn.Module:
    names = draw(st.lists(NAME, min_size=len(ROLES), max_size=len(ROLES), unique=True))
    h = draw(st.sampled_from([8, 16, 32, 64, 128, 256]))
    heads = draw(st.sampled_from([d for d in (1, 2, 4, 8) if h % d == 0 and h // d >= 2]))
    norm = draw(st.sampled_from([nn.LayerNorm, nn.RMSNorm]))
    return UserModel(dict(zip(ROLES, names)), draw(st.sampled_from([32, 50, 64, 96, 256])), h, heads,
                     h * draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 4)), norm)


@st.composite
def catalog_model(draw: st.DrawFn) -> nn.Module:
    family = draw(st.sampled_from(["llama", "gpt2", "qwen2_moe"]))
    h = draw(st.sampled_from([16, 32, 64, 128]))
    heads = draw(st.sampled_from([d for d in (2, 4, 8) if h // d >= 4]))
    cfg = {"model_type": family, "vocab_size": draw(st.sampled_from([48, 64, 100, 256])), "hidden_size": h,
           "num_hidden_layers": draw(st.integers(1, 4)), "num_attention_heads": heads,
           "intermediate_size": 2 * h, "max_position_embeddings": 64}
    if family == "gpt2":
        cfg.update(n_positions=64, n_embd=h, n_layer=cfg["num_hidden_layers"], n_head=heads)
    else:
        cfg["num_key_value_heads"] = draw(st.sampled_from([d for d in (1, 2, heads) if heads % d == 0]))
    if family == "qwen2_moe":
        cfg.update(moe_intermediate_size=h // 2, shared_expert_intermediate_size=h, num_experts=4,
                   num_experts_per_tok=2)
    torch.manual_seed(0)
    model = build_model(load_model_spec(cfg))
    model.init_weights(seed=0)
    return model


PIN_VALUES = {"tp": [1, 2, 4], "pp": [1, 2, 4], "dp": [1, 2, 4], "ep": [1, 2], "zero": [0, 1, 2, 3],
              "sp": [True, False], "recompute": ["none", "selective", "full"], "micro_batch": [1, 2]}


@st.composite
def pins(draw: st.DrawFn) -> dict:
    keys = draw(st.lists(st.sampled_from(sorted(PIN_VALUES)), max_size=3, unique=True))
    return {k: draw(st.sampled_from(PIN_VALUES[k])) for k in keys}


@contextlib.contextmanager
def fake_world(world: int, rank: int):
    """One process standing in for `rank` of a `world`-process group (no-op collectives)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def build_in_trainer(model: nn.Module, plan, rank: int) -> AutoParallelTrainer:
    with fake_world(plan.gpus, rank), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = AutoParallelTrainer(model, torch.optim.AdamW, plan=plan, mixed_precision="fp32")
        if plan.pp == 1:  # one step: forward/backward shapes and layouts (values meaningless)
            vocab = next(m for m in model.modules() if isinstance(m, nn.Embedding)).num_embeddings
            trainer.step(torch.randint(0, vocab, (plan.global_batch, SEQ + 1)))
        return trainer


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")


@settings(max_examples=CASES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(model=st.one_of(user_model(), catalog_model()), gpus=st.sampled_from([1, 2, 4, 8, 16]),
       global_batch=st.sampled_from([1, 2, 4, 8, 16]), fix=pins(), data=st.data())
def test_every_emitted_plan_builds_in_the_trainer(model, gpus, global_batch, fix, data):
    try:
        plan = plan_model(model, hardware="h100-sxm", gpus=gpus, gpus_per_node=8, global_batch=global_batch,
                          seq_len=SEQ, fix=fix or None)
    except UserError as e:  # a refusal is allowed, with a reason
        assert str(e).strip() and "\n" not in str(e)
        event("refused by the planner")
        return
    plan = plan.__class__(**{**plan.__dict__, "param_dtype": "fp32"})
    for rank in sorted({0, data.draw(st.sampled_from([0, plan.gpus - 1]))}):
        build_in_trainer(model, plan, rank)
    event(f"built: tp{plan.tp} pp{plan.pp} dp{plan.dp} ep{plan.ep}" if plan.gpus > 1 else "built: 1 device")
