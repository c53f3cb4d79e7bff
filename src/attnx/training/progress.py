"""What a training run prints: one line per validation, and periodic lines where no progress bar is drawn.

A 12-hour run in a terminal, under `nohup` or in a Slurm log should all say how it is going. The progress
bar is drawn only when standard error is a terminal; otherwise (a log file) `ProgressLog` prints a plain
line every `every_n_steps` optimizer steps. Every validation prints one line wherever the output goes:

```text
step 1500/100000 | val loss 3.412 ppl 22.14 bleu 18.63 | 7,930 tok/s src+tgt, 3,981 tgt | 0:10:02 elapsed, ETA 10:59:30
```
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, RichProgressBar, Timer
from lightning.pytorch.utilities.rank_zero import rank_zero_only


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class ProgressLog(Callback):
    """Print a line per validation, and every `every_n_steps` optimizer steps when there is no progress bar.

    Lines go to standard output, from rank 0 only.
    """

    def __init__(self, every_n_steps: int = 100) -> None:
        """
        Args:
            every_n_steps: Optimizer steps between two training lines when no progress bar is shown
                (standard error is not a terminal, or `trainer.enable_progress_bar` is false); 0: none.
        """
        if every_n_steps < 0:
            raise ValueError(f"ProgressLog needs every_n_steps >= 0, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._start = 0.0
        self._last_step = -1

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.monotonic()

    def _eta(self, trainer: pl.Trainer) -> str:
        """Time left by steps (`max_steps`) or by `max_time`, whichever ends training first."""
        elapsed = time.monotonic() - self._start
        left: list[float] = []
        step = trainer.global_step
        if trainer.max_steps and trainer.max_steps > 0 and step > 0:
            left.append(elapsed / step * (trainer.max_steps - step))
        remaining = _time_remaining(trainer)
        if remaining is not None:
            left.append(max(0.0, remaining))
        return _clock(min(left)) if left else "?"

    def _line(self, trainer: pl.Trainer, parts: list[str]) -> str:
        steps = f"step {trainer.global_step}"
        if trainer.max_steps and trainer.max_steps > 0:
            steps += f"/{trainer.max_steps}"
        elapsed = time.monotonic() - self._start
        metrics = trainer.callback_metrics
        if "train/tokens_per_s" in metrics:  # source + target, then target only (fairseq's wps)
            speed = f"{float(metrics['train/tokens_per_s']):,.0f} tok/s src+tgt"
            if "train/tgt_tokens_per_s" in metrics:
                speed += f", {float(metrics['train/tgt_tokens_per_s']):,.0f} tgt"
            parts.append(speed)
        parts.append(f"{_clock(elapsed)} elapsed, ETA {self._eta(trainer)}")
        return " | ".join([steps, *parts])

    @rank_zero_only
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if not self.every_n_steps or step == self._last_step or step % self.every_n_steps:
            return
        if trainer.progress_bar_callback is not None and sys.stderr.isatty():
            return
        self._last_step = step
        metrics = trainer.callback_metrics
        parts = []
        if "train/loss" in metrics:
            parts.append(f"train loss {float(metrics['train/loss']):.3f}")
        if "train/lr" in metrics:
            parts.append(f"lr {float(metrics['train/lr']):.2e}")
        print(self._line(trainer, parts), flush=True)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        where = trainer.log_dir or trainer.default_root_dir  # a collective under DDP: every rank asks
        if trainer.is_global_zero:
            print(
                f"training ended at step {trainer.global_step} after {_clock(time.monotonic() - self._start)}; "
                f"logs and checkpoints in {where}",
                flush=True,
            )

    @rank_zero_only
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = trainer.callback_metrics
        val = []
        for key, label, fmt in (
            ("val/loss", "loss", ".3f"),
            ("val/ppl", "ppl", ".2f"),
            ("val/bleu", "bleu", ".2f"),
        ):
            if key in metrics:
                val.append(f"{label} {float(metrics[key]):{fmt}}")
        print(self._line(trainer, ["val " + " ".join(val)]), flush=True)


def _time_remaining(trainer: pl.Trainer) -> float | None:
    """Seconds left of `trainer.max_time`, from the Timer callback Lightning adds for it."""
    for callback in trainer.callbacks:
        if isinstance(callback, Timer):
            return callback.time_remaining("train")
    return None


def epoch_label(epoch: int, max_epochs: int | None, step: int, max_steps: int) -> str:
    """The progress bar's label: `Epoch 3/9` in a run of 10 epochs, `Epoch 3, step 1200/100000` in one
    bounded by steps, `Epoch 3` in one bounded by neither (time, or nothing)."""
    label = f"Epoch {epoch}"
    if max_epochs is not None and max_epochs > 0:
        label += f"/{max_epochs - 1}"
    if max_steps > 0:
        label += f", step {step}/{max_steps}"
    return label


class TrainingProgressBar(RichProgressBar):
    """Lightning's Rich progress bar, labelled by [epoch_label][attnx.training.progress.epoch_label].

    Lightning's own label reads `Epoch 3/-2` when `max_epochs` is -1 (every config that trains for a number
    of steps), and says nothing of the steps.
    """

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self.relabel(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)
        self.relabel(trainer)

    def relabel(self, trainer: pl.Trainer) -> None:
        if self.progress is None or self.train_progress_bar_id is None:
            return
        label = epoch_label(trainer.current_epoch, trainer.max_epochs, trainer.global_step, trainer.max_steps)
        style = self.theme.description
        self.progress.update(self.train_progress_bar_id, description=f"[{style}]{label}" if style else label)
