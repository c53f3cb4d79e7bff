"""Checkpoints as the paper keeps them: one every few minutes (§6.1: "written at 10-minute intervals"),
written atomically, and the last k averaged at the end of training (§6.1: 5 for base, 20 for big)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from attnx.checkpoint import atomic_save, read_checkpoint
from attnx.inference.average import average_checkpoints


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files that are whole or absent, read with ``weights_only=True``.

    Saving goes through :func:`attnx.checkpoint.atomic_save`: stream to a temporary file beside the target,
    fsync, rename. (Lightning 2.6's own writer also renames, through an fsspec transaction, but first holds
    the whole serialized checkpoint in memory and never fsyncs, so a power cut can still leave an empty file.)
    Loading goes through :func:`attnx.checkpoint.read_checkpoint`: a truncated file or a checkpoint of another
    program raises :class:`attnx.checkpoint.CheckpointError` naming the file.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None):
        return read_checkpoint(path)


class PeriodicCheckpoint(ModelCheckpoint):
    """Save a checkpoint every ``minutes`` of training and at its end, keeping the newest ``keep``.

    Files are ``step=N.ckpt`` in ``dirpath`` (default: ``<log_dir>/checkpoints``), plus ``last.ckpt`` (the
    newest, what ``--ckpt_path`` resumes from). ``minutes: 0`` saves after every optimizer step.
    """

    def __init__(self, minutes: float = 10.0, keep: int = 5, dirpath: str | None = None) -> None:
        """
        Args:
            minutes: Wall-clock minutes of training between two checkpoints (the paper: 10).
            keep: How many step checkpoints to keep on disk (at least as many as will be averaged).
            dirpath: Directory for the checkpoints; default ``<log_dir>/checkpoints``.
        """
        if minutes < 0 or keep < 1:
            raise ValueError(f"PeriodicCheckpoint needs minutes >= 0 and keep >= 1, got {minutes} and {keep}")
        super().__init__(
            dirpath=dirpath,
            filename="step={step}",
            auto_insert_metric_name=False,
            monitor="step",  # "best" k by step = the newest k
            mode="max",
            save_top_k=keep,
            save_last=True,
            train_time_interval=timedelta(minutes=minutes),
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The weights training ends with are a checkpoint too (the last one averaged)."""
        if self._last_global_step_saved != trainer.global_step and trainer.global_step > 0:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        super().on_train_end(trainer, pl_module)


class AverageCheckpoints(Callback):
    """At the end of ``fit``, average the weights of the newest ``last`` checkpoints into ``averaged.ckpt``.

    Reads the checkpoints the run's :class:`ModelCheckpoint` kept (e.g. :class:`PeriodicCheckpoint`) and
    writes the result beside them; ``attnx test --ckpt_path .../averaged.ckpt`` decodes it.
    """

    def __init__(self, last: int = 5, filename: str = "averaged.ckpt") -> None:
        """
        Args:
            last: How many of the newest checkpoints to average (the paper: 5 for base, 20 for big).
            filename: Name of the averaged checkpoint, written in the checkpoint directory.
        """
        if last < 1:
            raise ValueError(f"AverageCheckpoints needs last >= 1, got {last}")
        self.last = last
        self.filename = filename
        self.path: Path | None = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        checkpointer = trainer.checkpoint_callback
        if not isinstance(checkpointer, ModelCheckpoint) or not checkpointer.best_k_models:
            rank_zero_warn("AverageCheckpoints: the run kept no checkpoints, so there is nothing to average")
            return
        newest = sorted(checkpointer.best_k_models, key=lambda p: float(checkpointer.best_k_models[p]))
        paths = newest[-self.last :]
        if len(paths) < self.last:
            rank_zero_warn(
                f"AverageCheckpoints: only {len(paths)} checkpoints were kept, averaging those instead of "
                f"{self.last} (train longer, save more often, or keep more)"
            )
        self.path = Path(paths[-1]).parent / self.filename
        if trainer.is_global_zero:
            atomic_save(average_checkpoints(paths), self.path)
            rank_zero_info(f"averaged {len(paths)} checkpoints into {self.path}")
        trainer.strategy.barrier("AverageCheckpoints")
