"""What `attnx fit` prints before training: [the estimate][attnx.training.estimate] for the device it runs on,
read off the trainer, the model and the data (a resumed run's for what it has left), and how long Lightning's
sanity check will take."""

from __future__ import annotations

import dataclasses
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from attnx.model.builders import count_parameters, training_flops_per_token
from attnx.training.estimate import device_peak, duration_text, estimate_run, larger_batches
from attnx.training.lora import LowRankAdapters
from attnx.training.progress import no_validation_line, time_remaining
from attnx.training.throughput import gpu_peak, precision_dtype


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
    Lightning restores only once training starts); one that ends before its first validation says so."""
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
    lines = dataclasses.replace(estimate, resumed_at=resumed_step).lines()
    if estimate.steps is not None and (check := no_validation_line(trainer, resumed_step + estimate.steps)):
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
