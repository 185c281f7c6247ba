"""Train a mixture-of-experts transformer with AutoParallelTrainer (expert parallelism when planned).

    python examples/train_moe.py                            # CPU, one process, tiny-moe, about a minute
    torchrun --nproc-per-node 4 examples/train_moe.py --fix ep=2   # experts split over 2 ranks (all-to-all)
    torchrun --nproc-per-node 8 examples/train_moe.py --model qwen3-30b-a3b --batch 32 --seq 2048

Same conventions as train_gpt.py: device/backend from the environment, hardware="auto", synthetic but
learnable data generated identically on every rank from the step number.
"""

from __future__ import annotations

import argparse
import time

import torch

from autoparallel import AutoParallelTrainer
from autoparallel.errors import exit_on_user_error
from autoparallel.models import build_model, load_model_spec


def synthetic_batch(step: int, rows: int, seq: int, vocab: int) -> torch.Tensor:
    """tokens [rows, seq+1]: half the rows follow t+1 = 5t+3, half t+1 = 7t+1 (mod V), so routing
    has two distinct token populations to specialize experts on."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    a = torch.where(torch.arange(rows)[:, None] % 2 == 0, 5, 7)
    c = torch.where(torch.arange(rows)[:, None] % 2 == 0, 3, 1)
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
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--plan", default=None, help="plan file from `autoparallel plan --output`")
    ap.add_argument("--fix", default=None, help="planner pins, e.g. ep=2 or ep=2,dp=2")
    ap.add_argument("--hardware", default="auto")
    ap.add_argument("--max-memory", default=None, help="planner budget per GPU, e.g. 80GB (default: the local card's usable memory)")
    ap.add_argument("--mixed-precision", default="bf16")
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args()

    torch.manual_seed(0)
    spec = load_model_spec(args.model)
    if not spec.is_moe:
        raise SystemExit(f"{args.model} is not a mixture-of-experts model; use examples/train_gpt.py")
    model = build_model(spec)
    model.init_weights(seed=0)
    trainer = AutoParallelTrainer(
        model, optimizer=torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0),
        max_memory_per_gpu=args.max_memory, global_batch_size=args.batch, seq_len=args.seq,
        hardware=args.hardware, plan=args.plan, fix=parse_fix(args.fix), mixed_precision=args.mixed_precision)
    main_rank = trainer.rank == 0
    if main_rank:
        p = trainer.plan
        experts = sorted(k for k, v in p.placements.items() if v == "expert")
        print(f"plan: dp={p.dp} tp={p.tp} pp={p.pp} ep={p.ep} zero={p.zero} micro_batch={p.micro_batch} x "
              f"{p.num_micro_batches} param_dtype={p.param_dtype} on {trainer.device}; "
              f"{spec.num_experts} experts/layer, top-{spec.num_experts_per_tok}, "
              f"{len(experts)} expert groups placed 'expert'")
    t0 = time.time()
    first = loss = None
    for step in range(args.steps):
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
