"""Train a GPT with AutoParallelTrainer: the planner picks the layout, the trainer executes it.

    python examples/train_gpt.py                          # CPU, one process, tiny-gpt, about a minute
    torchrun --nproc-per-node 8 examples/train_gpt.py --model gpt2 --batch 64 --seq 1024
    torchrun --nproc-per-node 4 examples/train_gpt.py --fix tp=2,pp=2      # pin part of the plan
    python examples/train_gpt.py --plan plan.yaml         # execute a plan file from `autoparallel plan`

Device and backend come from the environment (cuda + nccl under torchrun on GPUs, else cpu + gloo);
hardware="auto" matches the local GPU to a hardware profile. The data is synthetic but learnable:
each sequence follows t[i+1] = (a * t[i] + c) mod V from a random start, so the loss falls quickly.
Every rank builds the same global batch from the step number; the trainer takes its own slice.
"""

from __future__ import annotations

import argparse
import time

import torch

from autoparallel import AutoParallelTrainer
from autoparallel.errors import exit_on_user_error
from autoparallel.models import build_model, load_model_spec


def synthetic_batch(step: int, rows: int, seq: int, vocab: int) -> torch.Tensor:
    """tokens [rows, seq+1]: affine-recurrence sequences (learnable next-token structure)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    a, c = 5, 3
    cols = [start]
    for _ in range(seq):
        cols.append((a * cols[-1] + c) % vocab)
    return torch.cat(cols, dim=1)


def parse_fix(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    return dict(item.split("=", 1) for item in text.split(",") if item)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-gpt", help="catalog name or HF config.json (default tiny-gpt)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences per step)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--plan", default=None, help="plan file from `autoparallel plan --output`")
    ap.add_argument("--fix", default=None, help="planner pins, e.g. tp=2,pp=2")
    ap.add_argument("--hardware", default="auto")
    ap.add_argument("--max-memory", default=None, help="planner budget per GPU, e.g. 80GB (default: the local card's usable memory)")
    ap.add_argument("--mixed-precision", default="bf16")
    ap.add_argument("--meta", action="store_true", help="build on the meta device; shards are initialized in place")
    ap.add_argument("--checkpoint", default=None, help="directory to save a checkpoint to at the end")
    ap.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    args = ap.parse_args()

    torch.manual_seed(0)
    spec = load_model_spec(args.model)
    if args.meta:
        with torch.device("meta"):
            model = build_model(spec)
    else:
        model = build_model(spec)
        model.init_weights(seed=0)
    trainer = AutoParallelTrainer(
        model, optimizer=torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0),
        max_memory_per_gpu=args.max_memory, global_batch_size=args.batch, seq_len=args.seq,
        hardware=args.hardware, plan=args.plan, fix=parse_fix(args.fix), mixed_precision=args.mixed_precision)
    main_rank = trainer.rank == 0
    if main_rank:
        p = trainer.plan
        print(f"plan: dp={p.dp} tp={p.tp} pp={p.pp} ep={p.ep} vpp={p.vpp} zero={p.zero} sp={p.sequence_parallel} "
              f"micro_batch={p.micro_batch} x {p.num_micro_batches} param_dtype={p.param_dtype} on {trainer.device}")
    if args.resume:
        trainer.load_checkpoint(args.resume)
    t0 = time.time()
    first = None
    for step in range(trainer.steps, args.steps):
        loss = trainer.step(synthetic_batch(step, args.batch, args.seq, spec.vocab_size))
        first = loss if first is None else first
        if main_rank and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss:.4f}  ({time.time() - t0:.1f}s)", flush=True)
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)
    if main_rank and first is not None:
        print(f"loss {first:.3f} -> {loss:.3f} in {args.steps} steps, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    exit_on_user_error(main)
