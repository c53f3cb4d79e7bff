"""How training stops on a signal: which signals (SIGTERM from Slurm, Kubernetes or `timeout`; Ctrl+C; SIGUSR1,
Slurm's requeue signal), the handlers that defer them to the next optimizer step, Slurm's requeue, and the two
ways a run ends: [TrainingInterrupted][attnx.training.stopping.TrainingInterrupted] after the save that
[PeriodicCheckpoint][attnx.training.checkpointing.PeriodicCheckpoint] makes for it, or
[StopRequested][attnx.training.stopping.StopRequested] at once, where there is nothing to save (before the first
training step: setup, the sanity check) or no time to (a second Ctrl+C).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

__all__ = [
    "StopRequested",
    "StopSignals",
    "TrainingInterrupted",
    "requeue_slurm_job",
    "slurm_requeue_signal",
    "stop_signals",
]


class TrainingInterrupted(Exception):
    """Training stopped on a signal after saving `checkpoint` at optimizer step `step`.

    `exit_status` is what a shell reports for a process killed by that signal (128 + its number, e.g. 143
    for SIGTERM), so job schedulers and scripts see the run did not finish. `requeued` names the Slurm job
    that was put back in the queue, if any.
    """

    def __init__(
        self, signum: int, step: int, checkpoint: Path, rank: int, requeued: str | None = None
    ) -> None:
        self.signum, self.step, self.checkpoint, self.rank, self.requeued = (
            signum,
            step,
            checkpoint,
            rank,
            requeued,
        )
        self.signal_name = signal.Signals(signum).name
        self.exit_status = 128 + signum
        super().__init__(f"interrupted by {self.signal_name} at step {step}; checkpoint {checkpoint}")


class StopRequested(BaseException):
    """A stop signal where nothing is saved: before the first training step, or a second Ctrl+C; the message
    says which. A `BaseException`, as `KeyboardInterrupt` is, so that no `except Exception` on the way swallows
    it; `exit_status` is 128 + the signal's number."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum, self.message = signum, message
        self.signal_name = signal.Signals(signum).name
        self.exit_status = 128 + signum
        super().__init__(message)


def stop_signals(slurm_requeue: int | None = None) -> tuple[int, ...]:
    """The signals that stop `attnx fit`: SIGTERM, SIGINT and SIGUSR1, which Slurm's requeue signal replaces
    when Lightning's `SLURMEnvironment` requeues (`slurm_requeue`)."""
    return (signal.SIGTERM, signal.SIGINT, int(slurm_requeue or signal.SIGUSR1))


class StopSignals:
    """Remembers SIGTERM, SIGINT and SIGUSR1 (or Slurm's requeue signal) instead of dying at once, so that the
    run can save first; with `at_once`, raises [StopRequested][attnx.training.stopping.StopRequested]
    instead (`when` says when it came), for the moments where there is nothing to save.

    The recording handler does nothing else: no collective or file operation runs inside a signal handler,
    where ranks would meet at different points of their programs. A second Ctrl+C stops at once, without
    saving. Once the stop has begun (`stopping`), further signals are ignored: the save is under way.
    """

    def __init__(self, signums: tuple[int, ...], at_once: bool = False, when: str = "") -> None:
        self.signums = signums
        self.at_once, self.when = at_once, when
        self.received: set[int] = set()
        self.stopping = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.stopping:
            return
        if self.at_once:
            raise StopRequested(
                signum, f"stopped by {signal.Signals(signum).name} {self.when}; nothing was saved"
            )
        if signum == signal.SIGINT:
            if signum in self.received:
                raise StopRequested(
                    signum,
                    "stopped by a second Ctrl+C, at once and without saving; the last checkpoint, if any, is whole",
                )
            if os.environ.get("LOCAL_RANK", "0") == "0":  # the terminal signals every rank; one says so
                os.write(
                    2,
                    b"\nattnx fit: Ctrl+C: saving a checkpoint after this step (Ctrl+C again: stop without)\n",
                )
        self.received.add(signum)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._handler)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


def slurm_requeue_signal(trainer: pl.Trainer) -> int | None:
    """The signal Slurm sends ahead of preemption (`--signal=SIGUSR1@90`), when Lightning's
    `SLURMEnvironment` with `auto_requeue` is in charge; else None."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if not isinstance(environment, SLURMEnvironment):
        environment = SLURMEnvironment() if SLURMEnvironment.detect() else None
    if environment is None or not environment.auto_requeue:
        return None
    return int(environment.requeue_signal or signal.SIGUSR1)


def requeue_slurm_job() -> str | None:
    """`scontrol requeue` this Slurm job (an array task as `JOB_TASK`); the job id, or None if it failed."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except OSError as err:
        rank_zero_warn(f"could not requeue Slurm job {job}: {err}")
        return None
    if done.returncode != 0:
        rank_zero_warn(f"could not requeue Slurm job {job}: {done.stderr.strip() or done.returncode}")
        return None
    return job
