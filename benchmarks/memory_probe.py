"""Peak memory of the trainer's default loss against a plain mean cross entropy (one GPU), to locate the
memory the final trainer sweep measured above the cost model. Prints one JSON line per variant.

    python3 benchmarks/memory_probe.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_sweep import CONFIGS, MODELS, _meta_model  # noqa: E402

from autoparallel import AutoParallelTrainer  # noqa: E402


def mean_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())


def main() -> None:
    cfg = next(c for c in CONFIGS if c.name == "1g-llama-eager")
    vocab = MODELS[cfg.model]["vocab_size"]
    batch = torch.randint(0, vocab, (cfg.rows, cfg.seq + 1), generator=torch.Generator().manual_seed(0))
    for name, loss_fn in (("default_loss", None), ("mean_ce_user_loss", mean_ce)):
        torch.cuda.empty_cache()
        trainer = AutoParallelTrainer(_meta_model(cfg), plan=cfg.plan_file, loss_fn=loss_fn)
        for _ in range(2):
            trainer.step(batch)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        trainer.step(batch)
        torch.cuda.synchronize()
        print(json.dumps({"variant": name, "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                          "between_steps_gib": base / 2**30}), flush=True)
        del trainer


if __name__ == "__main__":
    main()
