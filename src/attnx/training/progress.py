"""What a training run prints: one line per validation, and periodic lines where no progress bar is drawn.

A 12-hour run in a terminal, under `nohup` or in a Slurm log should all say how it is going. Training
starts with one line on its batches (how many an epoch, in how many tensor shapes, their share of padding).
The progress bar is drawn only when standard error is a terminal; otherwise (a log file) `ProgressLog`
prints a plain line after the first optimizer step (of the run, or of a resumed segment), then every
`every_n_steps` steps or `every_seconds`, whichever comes first, so that a slow run is never silent for long.
Every validation prints one line wherever the output goes:

```text
step 1500/100000 | val loss 3.412 ppl 22.14 bleu 18.63 | 7,930 tok/s src+tgt, 3,981 tgt | 0:10:02 elapsed, ETA 10:59:30
```

The ETA, in these lines and on the bar, is that of the run: by `max_steps` or `max_time`, whichever ends
training first (not of the epoch).
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, RichProgressBar, Timer
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.errors import ConfigError

try:
    from rich.progress import ProgressColumn, Task
    from rich.text import Text
except (
    ImportError
):  # Rich is optional: without it Lightning draws its tqdm bar and this module's bar is unused
    ProgressColumn = object  # type: ignore[assignment,misc]


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def run_eta(trainer: pl.Trainer, elapsed: float, first_step: int = 0) -> str:
    """Time left of the run after `elapsed` seconds in which it went from `first_step` (a resumed run's
    checkpoint) to now: by steps (`max_steps`) or by `max_time`, whichever ends training first; `?` while
    neither is known."""
    left: list[float] = []
    step = trainer.global_step
    if trainer.max_steps and trainer.max_steps > 0 and step > first_step:
        left.append(elapsed / (step - first_step) * (trainer.max_steps - step))
    remaining = time_remaining(trainer)
    if remaining is not None:
        left.append(max(0.0, remaining))
    return _clock(min(left)) if left else "?"


def batch_plan_line(trainer: pl.Trainer) -> str | None:
    """The training batches' summary from the datamodule's sampler, where it has one."""
    sampler = getattr(getattr(trainer, "datamodule", None), "train_sampler", None)
    summary = getattr(sampler, "summary", None)
    return summary() if callable(summary) else None


class ProgressLog(Callback):
    """Print a line per validation, and every `every_n_steps` optimizer steps when there is no progress bar.

    Lines go to standard output, from rank 0 only.
    """

    def __init__(self, every_n_steps: int = 100, every_seconds: float = 60.0) -> None:
        """
        Args:
            every_n_steps: Optimizer steps between two training lines when no progress bar is shown
                (standard error is not a terminal, or `trainer.enable_progress_bar` is false); 0: no training
                lines at all.
            every_seconds: Also a training line once this many seconds passed since the last line, at the next
                optimizer step (a big model on a CPU takes minutes for 100 steps); 0: by steps only.
        """
        if every_n_steps < 0 or every_seconds < 0:
            raise ConfigError(
                f"ProgressLog needs every_n_steps >= 0 and every_seconds >= 0, got {every_n_steps} and {every_seconds}"
            )
        self.every_n_steps = every_n_steps
        self.every_seconds = every_seconds
        self._shown = 0.0
        self._start = 0.0
        self._first_step = 0
        self._last_step = -1

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = self._shown = time.monotonic()

    @rank_zero_only
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_step = trainer.global_step  # a resumed run's steps before it took none of this time
        line = batch_plan_line(trainer)
        if line:
            print(line, flush=True)

    def _eta(self, trainer: pl.Trainer) -> str:
        return run_eta(trainer, time.monotonic() - self._start, self._first_step)

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
        if not self.every_n_steps or step < 1 or step == self._last_step:
            return  # step 0: the batches of the first optimizer step are still accumulating
        due = time.monotonic() - self._shown >= self.every_seconds > 0
        if step % self.every_n_steps and step != self._first_step + 1 and not due:
            return
        if trainer.progress_bar_callback is not None and sys.stderr.isatty():
            return
        self._last_step = step
        self._shown = time.monotonic()
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


def time_remaining(trainer: pl.Trainer) -> float | None:
    """Seconds left of `trainer.max_time`, from the Timer callback Lightning adds for it (all of it before
    training starts); None without a `max_time`."""
    for callback in trainer.callbacks:
        if isinstance(callback, Timer):
            return callback.time_remaining("train")
    return None


def epoch_length(trainer: pl.Trainer, epoch_batches: int) -> int:
    """The training batches of one epoch of `epoch_batches` that Lightning takes under
    `trainer.limit_train_batches` (a count, or a fraction of the epoch)."""
    limit = trainer.limit_train_batches
    if limit is None:
        return epoch_batches
    return min(epoch_batches, limit) if isinstance(limit, int) else int(epoch_batches * limit)


def next_validation(trainer: pl.Trainer, after: int, epoch_batches: int | None = None) -> int | None:
    """The training batch, counted from the run's start across epochs and restarts, at whose end Lightning
    validates next after batch `after`: every `trainer.val_check_interval` batches (`check_val_every_n_epoch`
    null), or in every n-th epoch of `epoch_batches` batches (`check_val_every_n_epoch` n), at its end (`1.0`),
    at each fraction of it (`0.25`) or every so many of its batches (`100`). None where that cannot be told
    before training: an interval of time (`00:00:10:00`), epochs whose length is not given, or an interval
    Lightning refuses (longer than the epoch)."""
    every, epochs = trainer.val_check_interval, trainer.check_val_every_n_epoch
    if isinstance(every, bool) or not isinstance(every, int | float):
        return None  # by the clock
    if epochs is None:
        return (after // every + 1) * every if isinstance(every, int) and every > 0 else None
    if not epoch_batches or (length := epoch_length(trainer, epoch_batches)) < 1:
        return None
    interval = every if isinstance(every, int) else max(1, int(length * every))
    if interval > length:
        return None
    epoch = after // length
    while True:  # at most `epochs` epochs until one that validates
        if (epoch + 1) % epochs == 0:
            done = max(0, after - epoch * length)  # batches of this epoch before the one sought
            at = (done // interval + 1) * interval
            if at <= length:
                return epoch * length + at
        epoch += 1


def no_validation_line(
    trainer: pl.Trainer, steps: int, first_step: int = 0, epoch_batches: int | None = None
) -> str | None:
    """One line where a run that ends at optimizer step `steps` validates before it ends no more (after
    `first_step`, where a resumed run starts; [next_validation][attnx.training.progress.next_validation], with
    `epoch_batches` the batches of an epoch where known), with the option that changes it; None where it
    validates, or where that cannot be told.

    A run that `trainer.max_time` ends (not its `max_steps`) validates once as it stops, as Lightning does for
    every run told to stop: said so, not "no validation". A run without validation batches
    (`limit_val_batches` 0) says that instead of an option that would not help."""
    accumulate = trainer.accumulate_grad_batches
    first, batches = first_step * accumulate, steps * accumulate
    at = next_validation(trainer, first, epoch_batches)
    if at is None or at <= batches:
        return None
    if trainer.limit_val_batches == 0:  # not even as max_time stops it
        return "no validation in this run: trainer.limit_val_batches is 0"
    suggested = max(1, (batches - first) // 4)
    suggested -= suggested % 10 if suggested > 20 else 0
    option = f"--trainer.val_check_interval {suggested} validates about 4 times"
    if trainer.check_val_every_n_epoch is None:
        rule = "trainer.val_check_interval"
    else:
        rule = f"trainer.check_val_every_n_epoch {trainer.check_val_every_n_epoch}"
        option = f"--trainer.check_val_every_n_epoch null {option}"
    first_or_next = "next" if first else "first"
    by_steps = trainer.max_steps is not None and 0 < trainer.max_steps <= steps
    if time_remaining(trainer) is not None and not by_steps:
        return (
            f"one validation in this run, when trainer.max_time stops it after about {batches:,} batches: its "
            f"{first_or_next} by {rule} would come at batch {at:,}; {option}"
        )
    rest = "the rest of this run" if first else "this run"
    return (
        f"no validation in {rest}: it ends after about {batches:,} batches, before its {first_or_next} validation "
        f"at {at:,} ({rule}); {option}"
    )


def epoch_label(epoch: int, max_epochs: int | None, step: int, max_steps: int) -> str:
    """The progress bar's label: `Epoch 3/9` in a run of 10 epochs, `Epoch 3, step 1200/100000` in one
    bounded by steps, `Epoch 3` in one bounded by neither (time, or nothing)."""
    label = f"Epoch {epoch}"
    if max_epochs is not None and max_epochs > 0:
        label += f"/{max_epochs - 1}"
    if max_steps > 0:
        label += f", step {step}/{max_steps}"
    return label


def status_text(metrics: dict[str, Any], eta: str) -> str:
    """The bar's one line of numbers: the run's ETA first, then loss, learning rate (`1.8e-03`, where
    Lightning's `.3f` shows `0.000` for the whole run) and speed."""
    parts = [f"ETA {eta}"]
    for key, label, fmt in (
        ("train/loss", "loss", ".3f"),
        ("train/lr", "lr", ".1e"),
        ("train/tokens_per_s", "tok/s", ",.0f"),
        ("val/loss", "val loss", ".3f"),
    ):
        if key in metrics:
            parts.append(f"{label} {float(metrics[key]):{fmt}}")
    return " · ".join(parts)


class StatusColumn(ProgressColumn):
    """The training bar's numbers on one line, cut with an ellipsis where the terminal is too narrow (Rich
    wraps Lightning's metrics column one word per line at 80 columns)."""

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.task_id: Any = None

    def render(self, task: Task) -> Text:
        if task.id != self.task_id:
            return Text("")
        return Text(self.text, no_wrap=True, overflow="ellipsis", style="dim")


class TrainingProgressBar(RichProgressBar):
    """Lightning's Rich progress bar, labelled by [epoch_label][attnx.training.progress.epoch_label], with
    the run's ETA, the loss, learning rate and speed on one line ([status_text][attnx.training.progress.status_text]).

    Lightning's own label reads `Epoch 3/-2` when `max_epochs` is -1 (every config that trains for a number
    of steps), and says nothing of the steps; its time column counts down the epoch, not the run.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.status = StatusColumn()
        self._start = time.monotonic()
        self._first_step = 0

    def configure_columns(self, trainer: pl.Trainer) -> list:
        description, bar, batches, *_ = super().configure_columns(
            trainer
        )  # without the epoch's time and it/s
        bar.bar_width = 16
        return [description, bar, batches, self.status]

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return {}  # the status column shows them, on one line

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._start = time.monotonic()
        self._first_step = trainer.global_step

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self.relabel(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.update_status(trainer)
        super().on_train_batch_end(trainer, pl_module, *args)
        self.relabel(trainer)

    def update_status(self, trainer: pl.Trainer) -> None:
        """Snapshot the numbers here, in the training loop: Rich renders from its own thread."""
        self.status.task_id = self.train_progress_bar_id
        metrics = {key: value for key, value in trainer.callback_metrics.items()}
        eta = run_eta(trainer, time.monotonic() - self._start, self._first_step)
        self.status.text = status_text(metrics, eta)

    def relabel(self, trainer: pl.Trainer) -> None:
        if self.progress is None or self.train_progress_bar_id is None:
            return
        label = epoch_label(trainer.current_epoch, trainer.max_epochs, trainer.global_step, trainer.max_steps)
        style = self.theme.description
        self.progress.update(self.train_progress_bar_id, description=f"[{style}]{label}" if style else label)
