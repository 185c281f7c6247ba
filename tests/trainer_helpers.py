"""Shared pieces of the trainer tests: tiny models, explicit plans, a single-process reference and a
multi-process runner (one torch.multiprocessing spawn per world size running many configurations).

Workers run on CPU with gloo, fp32, one thread each. Results travel back as files in a temp dir:
per configuration `<name>.json` (per-step losses, or an error line) and `<name>.rank<r>.pt` (the full
parameters this rank holds after training, gathered from its shards).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.plan import Plan

STEPS = 3  # enough for every wrong shard, scale or missing reduction to show (each moves a parameter by ~LR in step 1,
           # a hundred times PARAM_ATOL); each step is most of a spawned configuration's time
LR = 1e-3
# AdamW eps: Adam turns a gradient change d into an update change of at most LR * d / EPS (the update is
# LR * m_hat / (sqrt(v_hat) + EPS) and sqrt(v_hat) >= 0), so EPS caps how far summation-order noise can move
# a parameter whose gradient is tiny. At 1e-6 that gain was 1000 and plain micro-batching alone moved the
# tiny-llama embedding by 6.4e-6 (llama tp2+sp: 1.6e-5, over the old fixed 1e-5); at 1e-4 it is 10.
EPS = 1e-4
# The equivalence tolerances are derived, not fitted. A parallel plan sums the same fp32 terms in another
# order (sharded matmuls, reduce-scatters, micro-batch accumulation). Pairwise summation of n terms errs by
# at most ceil(log2 n) * u * sum|terms| (u = 2**-24); the gradient sums run over GLOBAL_BATCH * SEQ = 128
# token positions (depth 7), and sum|terms| is taken as GRAD_SCALE, a bound on the largest gradient entry
# of the tiny models (0.21, tiny-gpt; checked by test_trainer.test_gradient_scale_bounds_the_tolerance).
# Measured: full batch vs 8 one-row micro-batches differ by 1.9e-9 per gradient entry, under GRAD_NOISE.
FP32_UNIT_ROUNDOFF = 2.0**-24
GRAD_SCALE = 0.25
GRAD_NOISE = 7 * FP32_UNIT_ROUNDOFF * GRAD_SCALE            # 1.04e-7
# Every step's m_hat is a weighted mean of the step gradients (weights sum to 1), so each step's update
# moves by at most LR * GRAD_NOISE / EPS; x2 bounds the second-moment term (d v_hat / v_hat <= 2 d / |g|).
PARAM_ATOL = 2 * STEPS * LR * GRAD_NOISE / EPS              # 6.2e-6
# The loss is a mean of 128 cross entropies through 4 blocks: forward reordering noise ~ depth * u ~ 1e-6
# relative at most (measured 8.6e-8); a wrong shard or missing reduction changes it by far more than 1e-5.
LOSS_RTOL = 1e-5
SEQ = 16
GLOBAL_BATCH = 8


# ---- models -----------------------------------------------------------------------------------
def build(name: str, seed: int = 0) -> nn.Module:
    """A tiny model initialized from `seed` (on the meta device when built under torch.device("meta"))."""
    torch.manual_seed(seed)
    if name == "mha":
        return MHAModel()
    from autoparallel.models import build_model, load_model_spec

    model = build_model(load_model_spec(name))
    if not any(p.is_meta for p in model.parameters()):
        model.init_weights(seed=seed)
    return model


class MHABlock(nn.Module):
    def __init__(self, h: int, heads: int, f: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(h)
        self.attn = nn.MultiheadAttention(h, heads, batch_first=True)
        self.mlp_norm = nn.LayerNorm(h)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc1", nn.Linear(h, f))
        self.mlp.add_module("act", nn.GELU())
        self.mlp.add_module("fc2", nn.Linear(f, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        S = x.shape[1]
        mask = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
        y = self.attn_norm(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.mlp_norm(x))


class MHAModel(nn.Module):
    """A user model built on nn.MultiheadAttention (packed in_proj_weight q/k/v)."""

    def __init__(self, vocab: int = 64, h: int = 32, heads: int = 4, f: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(MHABlock(h, heads, f) for _ in range(layers))
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def vocab_of(name: str) -> int:
    return 64 if name == "mha" else 256


def batches(name: str, steps: int = STEPS, rows: int = GLOBAL_BATCH, seq: int = SEQ) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab_of(name), (rows, seq + 1), generator=g) for _ in range(steps)]


# ---- plans ------------------------------------------------------------------------------------
def placements(model: nn.Module, sequence_parallel: bool) -> dict[str, str]:
    """The Megatron layout for the project's module names (docs/architecture.md) or the MHA model."""
    out: dict[str, str] = {}
    norm = "sequence" if sequence_parallel else "replicate"
    for path, mod in model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)):
            out[path] = norm
        elif leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head", "fc1", "head"):
            out[path] = "colwise"
        elif leaf in ("o_proj", "down_proj", "fc2"):
            out[path] = "rowwise"
        elif leaf in ("tok_embeddings", "embed"):
            out[path] = "vocab"
        elif leaf in ("pos_embeddings", "gate", "shared_expert_gate"):
            out[path] = "replicate"
        elif leaf == "experts":
            out[path] = "expert"
        elif leaf == "attn" and isinstance(mod, nn.MultiheadAttention):
            out[path] = "replicate"
    return out


def num_blocks(model: nn.Module) -> int:
    return len(model.layers) if hasattr(model, "layers") else len(model.blocks)


def make_plan(model: nn.Module, *, dp: int = 1, tp: int = 1, pp: int = 1, ep: int = 1, vpp: int = 1, cp: int = 1,
              micro_batch: int = 1, zero: int = 0, sp: bool = False, recompute: str = "none",
              stage_layers: tuple[int, ...] = (), global_batch: int = GLOBAL_BATCH,
              replicate_ends: bool = False) -> Plan:
    """replicate_ends: token embedding and LM head replicated, as the planner leaves a vocabulary that
    does not divide tp (cost_models.estimate.CostModel._runnable)."""
    from autoparallel.trainer.structure import model_fingerprint

    n = num_blocks(model)
    if pp > 1 and not stage_layers:
        k = pp * vpp
        stage_layers = tuple(n // k + (1 if i < n % k else 0) for i in range(k))
    return Plan(model=type(model).__name__, hardware="cpu", gpus=dp * tp * pp * ep * cp, gpus_per_node=8,
                global_batch=global_batch, seq_len=SEQ, dp=dp, tp=tp, pp=pp, ep=ep, vpp=vpp, cp=cp,
                micro_batch=micro_batch, zero=zero, sequence_parallel=sp, recompute=(recompute,) * n,
                stage_layers=stage_layers, grad_reduce_dtype="fp32", param_dtype="fp32",
                placements=_ends_replicated(placements(model, sp), replicate_ends) if tp > 1 or ep > 1 else {},
                model_fingerprint=model_fingerprint(model))


def _ends_replicated(placements: dict[str, str], replicate: bool) -> dict[str, str]:
    if not replicate:
        return placements
    return {p: ("replicate" if p in ("tok_embeddings", "lm_head") else v) for p, v in placements.items()}


def user_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A user loss_fn (same value as the default): the trainer must hand it whole, gathered logits."""
    assert type(logits) is torch.Tensor, type(logits)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, labels.unsqueeze(-1)).mean()


# ---- reference --------------------------------------------------------------------------------
def reference(name: str, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain single-process training: full batch, one AdamW step per batch."""
    return adamw_loop(build(name), batches(name, steps), lambda model, tokens: F.cross_entropy(
        model(tokens[:, :-1]).flatten(0, -2).float(), tokens[:, 1:].flatten()))


def adamw_loop(model: nn.Module, data: list[Any], loss_of: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One AdamW step (LR, EPS) per batch on one thread; loss_of(model, batch) -> loss. Returns the
    per-step losses and the final parameters (tied names each)."""
    torch.set_num_threads(1)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    losses = []
    for batch in data:
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


# ---- multi-process runner ---------------------------------------------------------------------
@dataclass
class Config:
    """One trainer run inside the spawned group; `plan` holds make_plan keyword arguments (picklable)."""

    name: str
    model: str
    plan: dict[str, Any]
    steps: int = STEPS
    resume: dict[str, Any] = field(default_factory=dict)   # {"stop": k, "plan": {...}}: kill and resume
    rows: int = GLOBAL_BATCH                                # batch rows fed to step() (misuse tests)
    user_loss: bool = False                                 # pass user_loss as loss_fn (gathered logits)
    rank_seeds: bool = False    # every rank builds its model from another seed (rank 0: the reference's)
    meta: bool = False          # build on the meta device (ranks seeded differently): init_weights on shards


def _train(cfg: Config, out: Path, rank: int) -> dict[str, Any]:
    from autoparallel.trainer import AutoParallelTrainer

    if cfg.meta:
        with torch.device("meta"):
            model = build(cfg.model)
        torch.manual_seed(100 + rank)
    else:
        model = build(cfg.model, seed=rank if cfg.rank_seeds else 0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    data = batches(cfg.model, cfg.steps, rows=cfg.rows)
    loss_fn = user_loss if cfg.user_loss else None
    trainer = AutoParallelTrainer(model, opt, plan=make_plan(model, **cfg.plan), loss_fn=loss_fn)
    losses: list[float] = []
    stop = cfg.resume.get("stop")
    for i, tokens in enumerate(data):
        if stop is not None and i == stop:
            path = out / f"{cfg.name}.ckpt"
            trainer.save_checkpoint(path)
            # a fresh model (another seed: the checkpoint must overwrite every value) and trainer,
            # possibly under another plan
            model = build(cfg.model, seed=99)
            opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
            trainer = AutoParallelTrainer(model, opt, plan=make_plan(model, **cfg.resume.get("plan", cfg.plan)),
                                          loss_fn=loss_fn)
            trainer.load_checkpoint(path)
            assert trainer.steps == stop, (trainer.steps, stop)
        losses.append(trainer.step(tokens))
    params = trainer.full_state_dict()
    torch.save(params, out / f"{cfg.name}.rank{rank}.pt")
    return {"losses": losses}


def worker(rank: int, world: int, store: str, out: str, configs: list[Any], train: Any = None) -> None:
    """train(cfg, out, rank) -> result dict, default _train (other test modules bring their own). The ranks
    meet through a file (`store`, new for each group) rather than a TCP port: a port picked free in the
    parent can be taken by another process before rank 0 binds it, and that errors a whole module's fixture."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    outdir = Path(out)
    for cfg in configs:
        t0, groups = time.time(), len(dist.distributed_c10d._world.pg_map)
        try:
            result = (train or _train)(cfg, outdir, rank)
        except Exception as e:  # recorded per configuration so one failure does not hide the others
            result = {"error": f"{type(e).__name__}: {e}", "error_type": type(e).__name__,
                      "traceback": traceback.format_exc()}
        result["seconds"] = time.time() - t0
        result["groups_made"] = len(dist.distributed_c10d._world.pg_map) - groups  # process groups it added
        (outdir / f"{cfg.name}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


# The spawned group's deadline is a hang guard, not a speed claim: a stalled collective already raises after
# the group's 120 s gloo timeout. A configuration took up to ~12 s on a slow two-core VM (51 Hugging Face
# configurations in 550-650 s, four processes on two cores, before each rank traced each model once and
# trainers shared their process groups: ~110 s since), so 60 s each is at least 5x that; 600 s at least.
SECONDS_PER_CONFIG = 60.0


# Ranks start from a fork server that has imported the trainer (and transformers' model base, where installed:
# a missing module is skipped) once per session; forkserver's server is a fresh process, not a fork of pytest's,
# so no thread or process-group state leaks in. A spawned rank spent ~6-9 s importing them, ~12-18 s of wall
# time per group of four on two cores.
PRELOAD = ("torch", "torch.distributed", "autoparallel.trainer", "trainer_helpers", "transformers.modeling_utils")


def run_spawned(world: int, configs: list[Any], out: Path, timeout: float | None = None, train: Any = None) -> None:
    """Run `configs` on `world` gloo ranks. A group whose rank a signal killed runs once more, with a warning:
    a clean-clone CI run lost the context-parallel module's fixture (7 tests) to `malloc(): unaligned tcache
    chunk detected` (SIGABRT) in one rank's native code, and the same module then passed 5 of 5 runs. A rank
    that raises, a wrong number and a second signal still fail."""
    import torch.multiprocessing as mp

    try:
        _run_group(world, configs, out, timeout, train)
    except mp.ProcessExitedException as e:
        if not e.signal_name:
            raise
        warnings.warn(f"spawned rank {e.error_index} died of {e.signal_name}; running the group again", stacklevel=2)
        for f in out.glob("*.rank*.*"):
            f.unlink()
        _run_group(world, configs, out, timeout, train)


def _run_group(world: int, configs: list[Any], out: Path, timeout: float | None, train: Any) -> None:
    import multiprocessing

    import torch.multiprocessing as mp

    timeout = timeout if timeout is not None else max(600.0, SECONDS_PER_CONFIG * len(configs))
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))  # read when the server starts

    store = Path(tempfile.mkdtemp(prefix="pg_")) / "store"  # absent until the group creates it
    ctx = mp.start_processes(worker, args=(world, str(store), str(out), configs, train), nprocs=world, join=False,
                             start_method="forkserver")
    deadline = time.time() + timeout
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.time())):
            if time.time() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"spawned trainer group of {world} did not finish in {timeout:.0f}s")
    finally:
        shutil.rmtree(store.parent, ignore_errors=True)


def result(out: Path, name: str) -> dict[str, Any]:
    errors = sorted(out.glob(f"{name}.rank*.json"))
    for f in errors:
        data = json.loads(f.read_text())
        if "error" in data:
            return data
    return json.loads((out / f"{name}.rank0.json").read_text())


def assert_equivalent(out: Path, name: str, world: int, ref: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    """A configuration's run matches the single-process reference `ref` (losses, final parameters): every
    rank reports the same losses, each within LOSS_RTOL, each parameter within PARAM_ATOL (derived above).
    A gradient scaled twice (or not at all) by the micro-batch count moves Adam's first steps by ~LR, a
    hundred times PARAM_ATOL."""
    res = result(out, name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    per_rank = [result_of_rank(out, name, r)["losses"] for r in range(world)]
    assert all(losses == per_rank[0] for losses in per_rank), f"ranks disagree on the loss: {per_rank}"
    ref_losses, ref_params = ref
    for step, (a, b) in enumerate(zip(res["losses"], ref_losses, strict=True)):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"step {step}: loss {a} != single-process {b}"
    params = gathered_params(out, name)
    assert set(params) == set(ref_params), sorted(set(params) ^ set(ref_params))
    for pname, want in ref_params.items():
        diff = (params[pname] - want).abs().max().item()
        assert diff <= PARAM_ATOL, f"{pname}: max |param - single-process| = {diff:.2e}"


def rank_results(out: Path, name: str, world: int) -> list[dict[str, Any]]:
    """Every rank's recorded result of a configuration (rank order), once none of them raised."""
    res = result(out, name)
    assert "error" not in res, res.get("traceback", res.get("error"))
    return [result_of_rank(out, name, r) for r in range(world)]


def result_of_rank(out: Path, name: str, rank: int) -> dict[str, Any]:
    return json.loads((out / f"{name}.rank{rank}.json").read_text())


def params_of_rank(out: Path, name: str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(out / f"{name}.rank{rank}.pt")


def gathered_params(out: Path, name: str) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob(f"{name}.rank*.pt")):
        merged.update(torch.load(f))
    return merged


def with_plan(plan: Plan, **kw: Any) -> Plan:
    return replace(plan, **kw)
