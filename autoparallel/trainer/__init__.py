"""Execute a Plan with torch.distributed: see autoparallel/trainer/trainer.py and docs/trainer.md."""

from autoparallel.trainer.trainer import AutoParallelTrainer, cross_entropy_loss

__all__ = ["AutoParallelTrainer", "cross_entropy_loss"]
