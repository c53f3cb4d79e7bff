"""Checkpoints as the paper keeps them: one every few minutes (§6.1: "written at 10-minute intervals"),
written atomically, and the last k averaged at the end of training (§6.1: 5 for base, 20 for big).

A run told to stop (SIGTERM from Slurm, Kubernetes or `timeout`; Ctrl+C; SIGUSR1, Slurm's requeue signal)
saves a checkpoint first, on every rank at the same optimizer step, and ends with
[TrainingInterrupted][attnx.training.stopping.TrainingInterrupted] ([stopping][attnx.training.stopping] holds
the signals' side).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from attnx.checkpoint import atomic_copy, atomic_save, average_checkpoints, read_checkpoint
from attnx.errors import ConfigError
from attnx.training.stopping import (
    StopRequested,
    StopSignals,
    TrainingInterrupted,
    requeue_slurm_job,
    slurm_requeue_signal,
    stop_signals,
)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files that are whole or absent, read with `weights_only=True`.

    Saving goes through [`atomic_save`][attnx.checkpoint.format.atomic_save]: stream to a temporary file beside the target,
    fsync, rename. (Lightning 2.6's own writer also renames, through an fsspec transaction, but first holds
    the whole serialized checkpoint in memory and never fsyncs, so a power cut can still leave an empty file.)
    Loading goes through [`read_checkpoint`][attnx.checkpoint.format.read_checkpoint]: a truncated file or a checkpoint of another
    program raises [`CheckpointError`][attnx.checkpoint.format.CheckpointError] naming the file.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None):
        checkpoint = read_checkpoint(path)
        # a checkpoint of weights only (attnx.checkpoint.save_model) records no Lightning version, which
        # Lightning's loader reads (`attnx test --ckpt_path` of one ended in KeyError)
        checkpoint.setdefault("pytorch-lightning_version", pl.__version__)
        return checkpoint


class PeriodicCheckpoint(Checkpoint):
    """Save a checkpoint every `minutes` of training (and/or every `every_n_steps` optimizer steps), at its
    end, and when the run is told to stop.

    Files are `step=N.ckpt` in `dirpath` (default: `<log_dir>/checkpoints`), plus `last.ckpt` (a copy
    of the newest, what `--ckpt_path` resumes from). A stop between two scheduled saves writes `last.ckpt`
    alone: the kept `step=N.ckpt` files, and so the average, are those of the run that was never stopped, and
    the time since the last scheduled save goes on counting in the resumed run. `minutes: 0` saves after every optimizer step.
    Saves happen only at optimizer-step boundaries (never mid-accumulation), and all ranks decide together
    (rank 0's clock), so every rank joins the same saves. A resumed run keeps counting the checkpoints its
    earlier segments kept (the list is part of the checkpoint), so `keep` and the averaging span the whole run.

    SIGTERM (from Slurm, Kubernetes, `timeout`), SIGINT (Ctrl+C; a second one stops without saving) and SIGUSR1
    are caught: at the next optimizer-step boundary all ranks learn that one of them received it, save, and
    training ends with [TrainingInterrupted][attnx.training.stopping.TrainingInterrupted]. Under
    Lightning's `SLURMEnvironment` with `auto_requeue`, its requeue signal (`SIGUSR1`) also makes rank 0 run
    `scontrol requeue`. A signal that arrives during validation takes effect after it.
    """

    def __init__(
        self,
        minutes: float | None = 10.0,
        keep: int = 5,
        dirpath: str | None = None,
        every_n_steps: int | None = None,
    ) -> None:
        """
        Args:
            minutes: Wall-clock minutes of training between two checkpoints (the paper: 10); None: none on time.
            keep: How many step checkpoints to keep on disk (at least as many as will be averaged).
            dirpath: Directory for the checkpoints; default `<log_dir>/checkpoints`.
            every_n_steps: Also save at every optimizer step that is a multiple of this (fairseq's
                `--save-interval-updates`); unlike minutes, the same steps in every run and on every machine.
        """
        if (
            (minutes is not None and minutes < 0)
            or keep < 1
            or (every_n_steps is not None and every_n_steps < 1)
        ):
            raise ConfigError(
                "PeriodicCheckpoint needs minutes >= 0 (or None), keep >= 1 and every_n_steps >= 1 (or None), "
                f"got {minutes}, {keep} and {every_n_steps}"
            )
        if minutes is None and every_n_steps is None:
            raise ConfigError("PeriodicCheckpoint needs minutes or every_n_steps (or both)")
        self.minutes = minutes
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.dirpath = dirpath
        self.saved: list[str] = []  # step checkpoints on disk, oldest first
        self._last_time = 0.0
        self._last_step = -1
        self._carried_seconds = 0.0  # training time since the last scheduled save, from a resumed checkpoint
        self._signals: StopSignals | None = None
        self._requeue_signal: int | None = None
        self._pending_stop: tuple[int, bool] | None = None

    @property
    def directory(self) -> Path:
        return Path(self.dirpath)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints")
        self.dirpath = trainer.strategy.broadcast(self.dirpath, src=0)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_clock(trainer.global_step)
        # Lightning has installed its own handlers by now; these replace them for the training loop
        self._requeue_signal = slurm_requeue_signal(trainer)
        self._signals = StopSignals(stop_signals(self._requeue_signal))
        if trainer.received_sigterm:  # it came before the loop started
            self._signals.received.add(signal.SIGTERM)
        self._signals.install()

    def start_clock(self, step: int) -> None:
        """Count the minutes to the next save from now, less the time a resumed checkpoint had already run."""
        self._last_time = time.monotonic() - self._carried_seconds
        self._last_step = step

    def _due(self, trainer: pl.Trainer) -> bool:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            return True
        if self.minutes is None or not trainer.is_global_zero:  # rank 0's clock decides
            return False
        return self.minutes == 0 or time.monotonic() - self._last_time >= 60 * self.minutes

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches or trainer.global_step == self._last_step:
            return
        received = self._signals.received if self._signals else set()
        third = self._requeue_signal or signal.SIGUSR1
        flags = [self._due(trainer), signal.SIGTERM in received, signal.SIGINT in received, third in received]
        if trainer.world_size > 1:  # any rank's signal (one process needs no tensor: its copy to a GPU waits)
            device = trainer.strategy.root_device
            reduced = trainer.strategy.reduce(
                torch.tensor(flags, dtype=torch.int32, device=device), reduce_op="max"
            )
            flags = [bool(flag) for flag in reduced.tolist()]
        due, terminate, interrupt, usr1 = flags
        if due or terminate or interrupt or usr1:
            if self._signals is not None and (terminate or interrupt or usr1):
                self._signals.stopping = True  # saving for the stop: a second signal must not cut it short
            if due:
                self.save(trainer)
            else:
                self.save_last(trainer)
        # the stop itself waits for the next hook: Lightning hands this step's metrics to the loggers after
        # this one, and the resumed run logs from the next step on
        if terminate or interrupt:
            self._pending_stop = (signal.SIGTERM if terminate else signal.SIGINT, False)
        elif usr1:
            self._pending_stop = (third, self._requeue_signal is not None)

    def _stop_if_asked(self, trainer: pl.Trainer) -> None:
        if self._pending_stop is not None:
            signum, requeue = self._pending_stop
            self._pending_stop = None
            self.stop(trainer, signum, requeue)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx
    ) -> None:
        self._stop_if_asked(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_if_asked(trainer)  # before a validation that was due at the saved step

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_if_asked(trainer)

    def stop(self, trainer: pl.Trainer, signum: int, requeue: bool) -> None:
        """End training after the save that a stop signal asked for (and requeue the Slurm job)."""
        requeued = requeue_slurm_job() if requeue and trainer.is_global_zero else None
        raise TrainingInterrupted(
            int(signum), trainer.global_step, self.directory / "last.ckpt", trainer.global_rank, requeued
        )

    def _restore_signals(self) -> None:
        if self._signals is not None:
            self._signals.restore()
            self._signals = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The weights training ends with are a checkpoint too (the last one averaged)."""
        self._stop_if_asked(trainer)
        if self._signals is not None:
            self._signals.stopping = True  # the last save runs whole
        # Also when a stop's `last.ckpt` holds this very step (stopped at the last step, then resumed): its step
        # checkpoint belongs to the kept set, as it does in the run that was never stopped.
        if trainer.global_step > 0 and str(self._step_path(trainer.global_step)) not in self.saved:
            self.save(trainer)
        self._restore_signals()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, (TrainingInterrupted, StopRequested)) and self._signals is not None:
            self._signals.stopping = True  # the process is ending: further signals must not cut it short
            return
        self._restore_signals()

    def save(self, trainer: pl.Trainer) -> Path:
        """Write `step=N.ckpt` and `last.ckpt` now; drop the oldest step checkpoints beyond `keep`."""
        step = trainer.global_step
        path = self._step_path(step)
        if str(path) not in self.saved:
            # listed before the write, so that the checkpoint's own list names it: a run resumed from it
            # keeps counting it (and later removes it) as the uninterrupted run would
            self.saved.append(str(path))
        self._last_time = time.monotonic()  # before the write, so that the checkpoint's clock starts at 0
        trainer.save_checkpoint(path, weights_only=False)
        if trainer.is_global_zero:
            atomic_copy(path, self.directory / "last.ckpt")
        while len(self.saved) > self.keep:
            old = self.saved.pop(0)
            if trainer.is_global_zero:
                Path(old).unlink(missing_ok=True)
        trainer.strategy.barrier("PeriodicCheckpoint")
        self._last_time = time.monotonic()
        self._last_step = step
        return path

    def _step_path(self, step: int) -> Path:
        return self.directory / f"step={step}.ckpt"

    def save_last(self, trainer: pl.Trainer) -> Path:
        """Write `last.ckpt` alone: the resume point of a stop that fell between two scheduled saves.

        The kept `step=N.ckpt` files stay as they are, so a run stopped and resumed keeps (and averages) the
        checkpoints of the run that was never stopped, whichever step the signal landed on.
        """
        path = self.directory / "last.ckpt"
        trainer.save_checkpoint(path, weights_only=False)
        trainer.strategy.barrier("PeriodicCheckpoint")
        self._last_step = trainer.global_step
        return path

    def state_dict(self) -> dict[str, Any]:
        since = time.monotonic() - self._last_time  # about 0 in a scheduled save (the clock restarts first)
        return {"saved": list(self.saved), "dirpath": self.dirpath, "seconds_since_save": since}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") == self.dirpath or self.dirpath is None:
            self.saved = [p for p in state_dict.get("saved", []) if Path(p).is_file()]
        self._carried_seconds = float(state_dict.get("seconds_since_save", 0.0))


def averaged_line(paths: list[str], last: int, path: Path) -> str:
    """What the end of `fit` says of its average: how many checkpoints went in and, for a run that kept fewer
    than `last` (a short run: nothing is wrong), that it averaged those it kept."""
    if len(paths) == 1:
        return f"{path} holds the weights of the run's one checkpoint, {Path(paths[0]).name} (nothing to average)"
    fewer = "" if len(paths) == last else f" (all the run kept; {last} in a longer run)"
    return f"averaged {len(paths)} checkpoints{fewer} into {path}"


class AverageCheckpoints(Callback):
    """At the end of `fit`, average the weights of the newest `last` checkpoints into `averaged.ckpt`.

    Reads the checkpoints the run's [PeriodicCheckpoint][attnx.training.checkpointing.PeriodicCheckpoint]
    kept and writes the result beside them; `attnx test --ckpt_path .../averaged.ckpt` decodes it.
    """

    def __init__(self, last: int = 5, filename: str = "averaged.ckpt") -> None:
        """
        Args:
            last: How many of the newest checkpoints to average (the paper: 5 for base, 20 for big).
            filename: Name of the averaged checkpoint, written in the checkpoint directory.
        """
        if last < 1:
            raise ConfigError(f"AverageCheckpoints needs last >= 1, got {last}")
        self.last = last
        self.filename = filename
        self.path: Path | None = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        periodic = [c for c in trainer.callbacks if isinstance(c, PeriodicCheckpoint)]
        if not periodic or not periodic[0].saved:
            rank_zero_warn("AverageCheckpoints: the run kept no checkpoints, so there is nothing to average")
            return
        paths = periodic[0].saved[-self.last :]
        self.path = Path(paths[-1]).parent / self.filename
        if trainer.is_global_zero:
            atomic_save(average_checkpoints(paths), self.path)
            rank_zero_info(averaged_line(paths, self.last, self.path))
        trainer.strategy.barrier("AverageCheckpoints")
