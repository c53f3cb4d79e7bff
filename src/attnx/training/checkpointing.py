"""Checkpoints as the paper keeps them: one every few minutes (§6.1: "written at 10-minute intervals"),
written atomically, and the last k averaged at the end of training (§6.1: 5 for base, 20 for big)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from attnx.checkpoint import atomic_save, read_checkpoint
from attnx.inference.average import average_checkpoints


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files that are whole or absent, read with ``weights_only=True``.

    Saving goes through [`atomic_save`][attnx.checkpoint.atomic_save]: stream to a temporary file beside the target,
    fsync, rename. (Lightning 2.6's own writer also renames, through an fsspec transaction, but first holds
    the whole serialized checkpoint in memory and never fsyncs, so a power cut can still leave an empty file.)
    Loading goes through [`read_checkpoint`][attnx.checkpoint.read_checkpoint]: a truncated file or a checkpoint of another
    program raises [`CheckpointError`][attnx.checkpoint.CheckpointError] naming the file.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None):
        return read_checkpoint(path)


class PeriodicCheckpoint(Checkpoint):
    """Save a checkpoint every ``minutes`` of training and at its end, keeping the newest ``keep``.

    Files are ``step=N.ckpt`` in ``dirpath`` (default: ``<log_dir>/checkpoints``), plus ``last.ckpt`` (a copy
    of the newest, what ``--ckpt_path`` resumes from). ``minutes: 0`` saves after every optimizer step.
    Saves happen only at optimizer-step boundaries (never mid-accumulation), and rank 0 decides when, so every
    rank joins the same saves.
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
        self.minutes = minutes
        self.keep = keep
        self.dirpath = dirpath
        self.saved: list[str] = []  # step checkpoints on disk, oldest first
        self._last_time = 0.0
        self._last_step = -1

    @property
    def directory(self) -> Path:
        return Path(self.dirpath)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints")
        self.dirpath = trainer.strategy.broadcast(self.dirpath, src=0)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_time = time.monotonic()
        self._last_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches or trainer.global_step == self._last_step:
            return
        due = self.minutes == 0 or time.monotonic() - self._last_time >= 60 * self.minutes
        if trainer.strategy.broadcast(due, src=0):
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The weights training ends with are a checkpoint too (the last one averaged)."""
        if trainer.global_step > 0 and trainer.global_step != self._last_step:
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> Path:
        """Write ``step=N.ckpt`` and ``last.ckpt`` now; drop the oldest step checkpoints beyond ``keep``."""
        step = trainer.global_step
        path = self.directory / f"step={step}.ckpt"
        trainer.save_checkpoint(path, weights_only=False)
        if trainer.is_global_zero:
            copy_atomically(path, self.directory / "last.ckpt")
        if str(path) not in self.saved:
            self.saved.append(str(path))
        while len(self.saved) > self.keep:
            old = self.saved.pop(0)
            if trainer.is_global_zero:
                Path(old).unlink(missing_ok=True)
        trainer.strategy.barrier("PeriodicCheckpoint")
        self._last_time = time.monotonic()
        self._last_step = step
        return path

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved), "dirpath": self.dirpath}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") == self.dirpath or self.dirpath is None:
            self.saved = [p for p in state_dict.get("saved", []) if Path(p).is_file()]


def copy_atomically(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file beside it: ``target`` is whole or the old one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class AverageCheckpoints(Callback):
    """At the end of ``fit``, average the weights of the newest ``last`` checkpoints into ``averaged.ckpt``.

    Reads the checkpoints the run's [PeriodicCheckpoint][attnx.training.checkpointing.PeriodicCheckpoint]
    kept and writes the result beside them; ``attnx test --ckpt_path .../averaged.ckpt`` decodes it.
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
        periodic = [c for c in trainer.callbacks if isinstance(c, PeriodicCheckpoint)]
        if not periodic or not periodic[0].saved:
            rank_zero_warn("AverageCheckpoints: the run kept no checkpoints, so there is nothing to average")
            return
        paths = periodic[0].saved[-self.last :]
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
