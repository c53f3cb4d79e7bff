"""What `attnx fit` prints before training: [the estimate][attnx.training.estimate] for the device it runs on,
read off the trainer, the model and the data (a resumed run's for what it has left), how long Lightning's
sanity check will take, and whether a time budget will train what its config was written for
([RecipePace][attnx.training.fit_estimate.RecipePace])."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from attnx.errors import ConfigError
from attnx.model.builders import count_parameters, training_flops_per_token
from attnx.training.estimate import RunEstimate, device_peak, duration_text, estimate_run, larger_batches
from attnx.training.lora import LowRankAdapters
from attnx.training.progress import no_validation_line, time_remaining
from attnx.training.throughput import gpu_peak, precision_dtype

UNDERTRAINED_SHARE = 0.5
"""Below this share of the steps its config was written for, a run bounded by `trainer.max_time` is said to
leave the model undertrained (the README's 30-minute Multi30k run on a busy machine: 155 steps and 3.0 BLEU,
where the ~3,000 steps of a quiet one give 37.6)."""


class RecipePace(pl.Callback):
    """What a config whose budget is a time (`trainer.max_time`) was written for: `steps` optimizer steps in
    `minutes`, on the machine its quoted results come from. It trains nothing: `attnx fit` compares the steps
    it estimates this machine makes in `max_time` with the steps this pace makes in that time, and where they
    are below [UNDERTRAINED_SHARE][attnx.training.fit_estimate.UNDERTRAINED_SHARE] of them says so in its first
    lines, with the options that train those steps instead
    ([undertrained_line][attnx.training.fit_estimate.undertrained_line]); `attnx describe --device` does too.
    In a config's `trainer.callbacks`: `{class_path: attnx.training.fit_estimate.RecipePace, init_args:
    {steps: 3000, minutes: 30}}`. A pace, not a count, so that an override config with another `max_time`
    (`backtranslation/finetune`'s 5 minutes) expects its share of the steps."""

    def __init__(self, steps: int, minutes: float) -> None:
        """
        Args:
            steps: The optimizer steps the config's results were trained in.
            minutes: The minutes of training they took (the config's `trainer.max_time`, usually).
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(
                f"RecipePace (trainer.callbacks): steps must be a whole number >= 1, got {steps!r}"
            )
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not 0 < minutes < math.inf:
            raise ConfigError(
                f"RecipePace (trainer.callbacks): minutes must be a number > 0, got {minutes!r}"
            )
        self.steps, self.minutes = steps, float(minutes)

    def steps_in(self, seconds: float) -> int:
        """The steps this pace makes in `seconds` of training."""
        return round(self.steps * seconds / (60 * self.minutes))


def undertrained_line(
    pace: RecipePace, estimate: RunEstimate, max_time_seconds: float, max_steps: int | None = None
) -> str | None:
    """One line where `estimate`, a run that `max_time_seconds` of `trainer.max_time` ends, makes fewer than
    [UNDERTRAINED_SHARE][attnx.training.fit_estimate.UNDERTRAINED_SHARE] of the steps `pace` makes in that time
    (or of `max_steps`, where that is fewer): both counts, that the model will be undertrained, and the options
    that train those steps whatever the time, with the time they are estimated to take. None otherwise, and for a
    run that its `max_steps` ends first (a number of steps asked for is what it trains). A resumed run's
    `estimate` counts the steps after `estimate.resumed_at`."""
    if estimate.bounded_by != "max_time" or estimate.steps is None:
        return None
    time, made = duration_text(max_time_seconds), estimate.resumed_at + estimate.steps
    if max_steps is not None and 0 < max_steps < pace.steps_in(max_time_seconds):
        meant = max_steps
        why = (
            f"this run asks for {meant:,} steps (trainer.max_steps), and this machine is estimated to make "
            f"{made:,} in its {time} of trainer.max_time"
        )
    else:
        meant = pace.steps_in(max_time_seconds)
        # an override's other max_time (backtranslation/finetune's 5 minutes) expects the pace's share of it
        share = f" ({pace.steps:,} in {pace.minutes:g} minute{'s' * (pace.minutes != 1)})"
        share = "" if round(pace.minutes * 60) == round(max_time_seconds) else share
        why = (
            f"this config was written for about {meant:,} steps in its {time} of trainer.max_time{share}, and this "
            f"machine is estimated to make {made:,} in that time"
        )
    if made >= UNDERTRAINED_SHARE * meant:
        return None
    seconds = max(0, meant - estimate.resumed_at) * estimate.step_seconds
    return (
        f"warning: the model will be undertrained: {why}; --trainer.max_steps {meant} --trainer.max_time null "
        f"trains the {meant:,} steps, in an estimated {duration_text(seconds)}"
    )


def fit_estimate_lines(
    trainer: pl.Trainer,
    module: Any,
    datamodule: Any,
    mfu: float | None = None,
    captured: bool = False,
    resumed_step: int = 0,
    trained_seconds: float = 0.0,
) -> list[str]:
    """What `attnx fit` prints before training: the estimate for the device it runs on, and how long the
    sanity check that Lightning runs before the first step will take (it shows nothing until it ends).

    A resumed run is estimated for what is left after `resumed_step` and `trained_seconds` (its `Timer`, which
    Lightning restores only once training starts); one that ends before its first validation says so, and so
    does one whose `trainer.max_time` will train far fewer steps than its config's
    [RecipePace][attnx.training.fit_estimate.RecipePace]."""
    device = trainer.strategy.root_device
    precision = str(trainer.precision)
    dtype = precision_dtype(precision)
    if device.type == "cuda":
        found = gpu_peak(torch.cuda.get_device_name(device))
        if found is None or found.tflops(dtype) is None:
            return []  # no data-sheet figure: the first progress lines will say how fast it runs
        peak = (found.tflops(dtype) * 1e12, found.source, found.key.upper(), found.memory_gib)
    else:
        peak = device_peak("cpu", precision)
    train = datamodule.corpus.dataset(datamodule.train_split)
    src_len = float(np.mean(train.src_lengths)) + 1 if len(train) else 25.0
    tgt_len = float(np.mean(train.tgt_lengths)) + 1 if len(train) else 25.0
    config = module.config
    remaining = time_remaining(trainer)
    parameters, trainable = count_parameters(module.model), None
    for callback in trainer.callbacks:  # LoRA's adapters go on when fit starts, after this estimate
        if isinstance(callback, LowRankAdapters) and callback.rank is not None:
            parameters, trainable = callback.parameters(module.model)
    estimate = estimate_run(
        config,
        parameters,
        datamodule.max_tokens,
        precision,
        "cpu" if device.type == "cpu" else "cuda",
        accumulate=trainer.accumulate_grad_batches,
        max_steps=trainer.max_steps - resumed_step if trainer.max_steps and trainer.max_steps > 0 else None,
        max_time_seconds=max(0.0, remaining - trained_seconds) if remaining is not None else None,
        mfu=mfu,
        src_len=src_len,
        tgt_len=tgt_len,
        peak=peak,
        captured=captured,
        trainable=trainable,
    )
    estimate = dataclasses.replace(estimate, resumed_at=resumed_step)
    lines = estimate.lines()
    for pace in (c for c in trainer.callbacks if isinstance(c, RecipePace) and remaining is not None):
        warning = undertrained_line(pace, estimate, remaining, trainer.max_steps)
        lines += [warning] if warning else []
    built = getattr(datamodule, "_train_sampler", None)  # never built here: it needs the trainer's precision
    epoch_batches = len(built) if built is not None else None
    if estimate.steps is not None and (
        check := no_validation_line(
            trainer, resumed_step + estimate.steps, first_step=resumed_step, epoch_batches=epoch_batches
        )
    ):
        lines.append(check)
    if device.type == "cuda":
        hint = larger_batches(
            estimate, config, datamodule.max_tokens, src_len, tgt_len, trainer.val_check_interval
        )
        lines += [hint] if hint else []
    sanity = trainer.num_sanity_val_steps
    if sanity and sanity > 0:
        forward = training_flops_per_token(config, src_len, tgt_len)["per_token"] / 3  # no backward pass
        seconds = sanity * forward * 2 * datamodule.eval_max_tokens / (estimate.peak_flops * estimate.mfu)
        lines.append(
            f"first a sanity check: {sanity} validation batches of {datamodule.eval_max_tokens:,} tokens per side "
            f"before the first step, estimated {duration_text(seconds)} (--trainer.num_sanity_val_steps 0 skips it)"
        )
    return lines
