"""`--cuda_graphs`: captured training steps inside `attnx fit`, from the run's first batch.

[`CapturedSteps`][attnx.training.captured_steps.CapturedSteps], a callback `attnx fit` always adds, decides at
the start of fit whether the run captures its steps and says so in one line; where it does, it gives the
module a [`StepEngine`][attnx.training.capture.StepEngine], captures every shape of the training batches'
plan before the first step (the most frequent first, up to the cap) and prints how many, their memory and the
time it took. Shapes captured later (batches from another datamodule, whose plan it cannot read) are
summed up at the next validation; the end of training prints what ran captured and what eagerly.

The module's training step asks the engine first: a replayed batch has its gradients already, so the
module's `backward` hook skips it; Lightning's precision plugin, accumulation, gradient clipping, optimizer
step, checkpoints and logging run as they do eagerly. While an engine is attached the module clears the
gradients in place wherever Lightning clears them (each step, before a validation, at the start of fit): the
graphs add into those very tensors, and the engine stops the run with one line where they are replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy

from attnx.training.capture import MAX_GRAPHS, CaptureBackend, CudaGraphs, StepEngine, size_text

BACKENDS: dict[str, Callable[[torch.device], CaptureBackend]] = {"cuda": CudaGraphs}
"""The device types steps are captured on, and how."""

OPTION = "--cuda_graphs"


def syncs_gradients(model: Any) -> bool:
    """Whether the backward of the batch being trained now all-reduces gradients: DDP outside `no_sync`
    (Lightning enters `no_sync` for all but the last batch of each accumulation window)."""
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel) and model.require_backward_grad_sync


def capture_plan(
    enabled: bool | None, trainer: pl.Trainer, module: Any, datamodule: Any = None
) -> tuple[bool, str]:
    """Whether this fit captures its steps, and the line that says so ("" where there is nothing to say:
    the default on a device that cannot capture). `datamodule`: default the trainer's."""
    device = trainer.strategy.root_device
    if device.type not in BACKENDS:
        if not enabled:
            return False, ""
        return False, f"{OPTION}: CUDA graphs need a CUDA device; this run trains on {device.type}, eagerly"
    if enabled is False:
        return False, f"captured steps: off ({OPTION} false)"
    strategy = trainer.strategy
    # DeepSpeed is a DDPStrategy to Lightning, but reduces gradients in its own backward, which a replay skips
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) or isinstance(
        strategy, DeepSpeedStrategy
    ):
        return False, (
            f"captured steps: off (strategy {type(strategy).__name__}: single-device and DDP runs capture)"
        )
    if not module.automatic_optimization:
        return False, "captured steps: off (the module optimizes manually)"
    loss = getattr(module, "loss", None)
    if not getattr(loss, "capturable", True):
        return False, (
            f"captured steps: off (loss {type(loss).__name__}: its batches have shapes that depend on the "
            "data)"
        )
    if getattr(getattr(module, "model", None), "checkpoint_layers", False):
        return False, (
            "captured steps: off (model.transformer.activation_checkpointing: a checkpoint's recomputation reads "
            "the CUDA generator's state to replay its dropout, which a capture cannot; the steps run eagerly)"
        )
    ddp = isinstance(strategy, DDPStrategy)
    accumulate = trainer.accumulate_grad_batches
    if ddp and accumulate == 1:
        return False, (
            "captured steps: off under DDP without gradient accumulation: every batch's backward all-reduces "
            "its gradients, which a graph does not hold (with --trainer.accumulate_grad_batches N, N-1 of "
            "every N batches replay)"
        )
    buckets = getattr(datamodule or trainer.datamodule, "resolved_shape_buckets", None)
    if enabled is None and buckets is not None and buckets() == 0:
        return False, (
            f"captured steps: off (data.shape_buckets 0: every batch has a shape of its own; {OPTION} true "
            f"captures anyway, up to {MAX_GRAPHS} shapes)"
        )
    line = f"captured steps: on, each batch shape captured once as a CUDA graph ({OPTION} false turns it off)"
    if ddp:
        line += (
            f"; under DDP {accumulate - 1} of every {accumulate} batches replay, the last of each step runs "
            "eagerly and all-reduces the gradients"
        )
    return True, line


def planned_shapes(datamodule: Any) -> list[tuple[int, int, int]]:
    """The `(pairs, source length, target length)` shapes of the training batches' plan, the most frequent
    first (ties in shape order); empty where the datamodule has no such plan."""
    sampler = getattr(datamodule, "train_sampler", None)
    shapes = getattr(sampler, "shapes", None)
    if shapes is None or len(shapes) == 0:
        return []
    unique, counts = np.unique(np.asarray(shapes), axis=0, return_counts=True)
    order = sorted(range(len(unique)), key=lambda i: -int(counts[i]))  # stable: ties keep shape order
    return [tuple(int(v) for v in unique[i]) for i in order]


class CapturedSteps(Callback):
    """Captured training steps (CUDA graphs) for `attnx fit`: see [attnx.training.captured_steps][].

    Args:
        enabled: `--cuda_graphs`: None (the default) captures on a CUDA device where batches come in shape
            buckets; True captures on a CUDA device whatever the buckets; False never.
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = enabled
        self.engine: StepEngine | None = None
        self._said = (0, 0)  # (shapes captured, batches run eagerly) as of the last line

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        on, line = capture_plan(self.enabled, trainer, pl_module)
        if line and trainer.is_global_zero:
            print(line, flush=True)
        if not on:
            return
        device = trainer.strategy.root_device
        self.engine = StepEngine(
            pl_module.model,
            pl_module.loss,
            BACKENDS[device.type](device),
            divisor=trainer.accumulate_grad_batches,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
        )
        pl_module.step_engine = self.engine

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.engine is None:
            return
        shapes = planned_shapes(trainer.datamodule)
        training = pl_module.model.training
        pl_module.model.train()
        try:
            with trainer.precision_plugin.train_step_context():
                self.engine.prepare(shapes)
        finally:
            pl_module.model.train(training)
        stats = self.engine.stats
        self._said = (stats.captured, sum(stats.eager.values()))
        if trainer.is_global_zero:
            over = len(stats.over_cap)
            beyond = f"; {over} rarer shapes beyond the cap of {MAX_GRAPHS} run eagerly" if over else ""
            print(
                f"captured steps: {stats.captured} shapes of the training batches captured before the first "
                f"step in {stats.seconds:.1f} s, {size_text(stats.bytes)} of graph memory (one pool shared by all "
                f"shapes){beyond}",
                flush=True,
            )

    def _summary(self, trainer: pl.Trainer, always: bool) -> None:
        if self.engine is None:
            return
        stats = self.engine.stats
        now = (stats.captured, sum(stats.eager.values()))
        if (always or now[0] != self._said[0]) and trainer.is_global_zero:
            print(stats.line(), flush=True)
        self._said = now

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._summary(trainer, always=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._summary(trainer, always=True)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.engine is not None:
            self.engine.release()
            self.engine = None
        if getattr(pl_module, "step_engine", None) is not None:
            pl_module.step_engine = None
