"""Train a Hugging Face causal LM with AutoParallelTrainer: config -> plan -> train -> export.

    python examples/train_hf.py                                  # CPU, one process, a tiny Llama, seconds
    python examples/train_hf.py --model path/to/config.json      # any decoder-only HF config (random init)
    python examples/train_hf.py --model Qwen/Qwen3-0.6B --pretrained   # weights from the HF hub / cache
    torchrun --nproc-per-node 8 examples/train_hf.py --model meta-llama/Llama-3.2-1B --fix tp=2
    python examples/train_hf.py --output out/ && python -c "from transformers import AutoModelForCausalLM as A; A.from_pretrained('out/')"

The model is passed as it is (`transformers.PreTrainedModel`), batches follow HF's convention
({"input_ids", "labels"} with labels aligned to the inputs, -100 ignored) and no loss_fn is needed:
the trainer computes HF's causal-LM loss. `--output` writes a `save_pretrained` checkpoint that
`AutoModelForCausalLM.from_pretrained` loads. The data is synthetic but learnable: every sequence
follows an affine recurrence from a random start, so the loss falls within a few steps.
"""

from __future__ import annotations

import argparse
import time

import torch

from autoparallel import AutoParallelTrainer
from autoparallel.errors import UserError, exit_on_user_error


def build(model: str, pretrained: bool) -> torch.nn.Module:
    try:
        import transformers
    except ImportError:
        raise UserError("this example needs transformers: pip install 'autoparallel[hf]'") from None
    if model == "tiny-llama":
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    elif pretrained:
        return transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    else:
        config = transformers.AutoConfig.from_pretrained(model)
    return transformers.AutoModelForCausalLM.from_config(config)


def hf_batch(step: int, rows: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    """HF batch: rows follow t[i+1] = (5 t[i] + 3) mod vocab from a random start; labels are the inputs
    (HF's convention: the trainer shifts them)."""
    x = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(step))
    cols = []
    for _ in range(seq):
        cols.append(x)
        x = (5 * x + 3) % vocab
    ids = torch.stack(cols, dim=1)
    return {"input_ids": ids, "labels": ids.clone()}


def parse_fix(text: str | None) -> dict[str, str] | None:
    return dict(item.split("=", 1) for item in text.split(",") if item) if text else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama", help="tiny-llama, an HF model id or a config.json path")
    ap.add_argument("--pretrained", action="store_true", help="load the model's weights (else random init)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--plan", default=None, help="plan file from `autoparallel plan --output`")
    ap.add_argument("--fix", default=None, help="planner pins, e.g. tp=2,pp=2")
    ap.add_argument("--hardware", default="auto")
    ap.add_argument("--max-memory", default=None, help="planner budget per GPU, e.g. 80GB (default: the local card's usable memory)")
    ap.add_argument("--mixed-precision", default="bf16")
    ap.add_argument("--output", default=None, help="directory for a save_pretrained export at the end")
    ap.add_argument("--max-grad-norm", type=float, default=1.0,
                    help="clip the gradients to this global norm (Hugging Face Trainer's default); 0: no clipping")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = build(args.model, args.pretrained)
    trainer = AutoParallelTrainer(
        model, optimizer=torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0),
        max_memory_per_gpu=args.max_memory, global_batch_size=args.batch, seq_len=args.seq,
        hardware=args.hardware, plan=args.plan, fix=parse_fix(args.fix), mixed_precision=args.mixed_precision,
        max_grad_norm=args.max_grad_norm or None)
    main_rank = trainer.rank == 0
    if main_rank:
        p = trainer.plan
        print(f"{type(model).__name__}: dp={p.dp} tp={p.tp} pp={p.pp} ep={p.ep} zero={p.zero} "
              f"sp={p.sequence_parallel} micro_batch={p.micro_batch} x {p.num_micro_batches} on {trainer.device}")
    t0 = time.time()
    first = loss = None
    for step in range(args.steps):
        loss = trainer.step(hf_batch(step, args.batch, args.seq, model.config.vocab_size))
        first = loss if first is None else first
        if main_rank and (step % 5 == 0 or step == args.steps - 1):
            norm = "" if trainer.grad_norm is None else f"  grad norm {trainer.grad_norm:.3f}"
            print(f"step {step:4d}  loss {loss:.4f}{norm}  ({time.time() - t0:.1f}s)", flush=True)
    # a batch the steps did not train on, evaluated without an update (eval mode: dropout off)
    val = trainer.evaluate(hf_batch(args.steps, args.batch, args.seq, model.config.vocab_size))
    if main_rank:
        print(f"held-out loss {val:.4f}")
    if args.output:
        trainer.save_pretrained(args.output)
        if main_rank:
            print(f"exported to {args.output} (loads with AutoModelForCausalLM.from_pretrained)")
    if main_rank and first is not None:
        print(f"loss {first:.3f} -> {loss:.3f} in {args.steps} steps, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    exit_on_user_error(main)
