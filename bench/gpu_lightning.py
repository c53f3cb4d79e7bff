"""The Lightning rows of ``bench_gpu.py``: the real ``TranslationTask`` in a ``lightning.Trainer`` on the same
data, plain or with its steps captured as ``attnx fit`` captures them (``CapturedSteps``).

Timed as the loop of ``gpu_timing`` times itself: the device is synchronized where timing starts (the end of
the last warm-up batch) and where it ends (the end of the last batch), nowhere in between, so that the
comparison of ``attnx fit``'s step with the bare loop's is not biased by a wait the loop does not have."""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from gpu_timing import sync
from gpu_training import LABEL_SMOOTHING, TrainResult, finish
from harness import training_trainer

from attnx.data.batch import Batch
from attnx.data.datamodule import TranslationDataModule
from attnx.model import TransformerConfig

LIGHTNING_PRECISION = {"bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed", "fp32": "32-true"}


class Clock(pl.Callback):
    """Counts the timed batches' tokens as they end and reads the time twice, each after a synchronization:
    at the end of batch ``first`` (the last warm-up batch) and of batch ``last``."""

    def __init__(self, result: TrainResult, config: TransformerConfig, device: torch.device, first: int,
                 last: int) -> None:  # fmt: skip
        self.result, self.config, self.device = result, config, device
        self.first, self.last = first, last
        self.seen = 0
        self.start = self.end = 0.0

    def on_train_batch_end(self, trainer, module, outputs, batch: Batch, batch_idx: int) -> None:
        if self.seen > self.first:
            self.result.timed.count(self.config, batch)
        if self.seen in (self.first, self.last):
            sync(self.device)
            if self.seen == self.first:
                self.start = time.perf_counter()
            else:
                self.end = time.perf_counter()
        self.seen += 1


def train_lightning(
    config: TransformerConfig,
    data: Path,
    result: TrainResult,
    device: torch.device,
    warmup: int,
    steps: int,
    captured: bool = False,
) -> TrainResult:
    """``warmup`` (at least one) untimed and ``steps`` timed optimizer steps of ``TranslationTask`` in a
    ``Trainer`` (no logger, checkpoints or validation); with ``captured``, its steps captured."""
    from attnx.training.module import TranslationTask

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    warmup = max(warmup, 1)  # timing starts at the end of a batch
    acc = result.accumulate
    clock = Clock(result, config, device, warmup * acc - 1, (warmup + steps) * acc - 1)
    torch.manual_seed(0)
    task = TranslationTask(
        transformer=config, label_smoothing=LABEL_SMOOTHING, lr_factor=1.0, warmup_steps=4000
    )
    trainer = training_trainer(
        clock,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        precision=LIGHTNING_PRECISION[result.precision],
        max_steps=warmup + steps,
        accumulate_grad_batches=acc,
    )
    if captured:
        from attnx.training.captured_steps import CapturedSteps

        trainer.callbacks.append(CapturedSteps(True))
    trainer.fit(task, datamodule=TranslationDataModule(str(data), max_tokens=result.max_tokens, seed=1))
    result.timed.seconds = clock.end - clock.start
    result.timed.steps = steps
    return finish(result, device)
