"""Fused pointwise kernels for the GPU-bound step: what follows each matrix product, compiled as one kernel.

At large batches a GPU step is the matrix products plus the pointwise passes between them, each a trip
through memory: after every sub-layer dropout, the residual add and LayerNorm (the paper's
`LayerNorm(x + Dropout(Sublayer(x)))`), and in every FFN the bias, ReLU and dropout (in a gated one, SwiGLU's or
GEGLU's activation, the product of its two branches and dropout). Fused, each is one read
and one write. [`fuse_pointwise`][attnx.training.fusion.fuse_pointwise] compiles exactly those methods
(`torch.compile` of a small function, shapes dynamic) and nothing else: the matrix products, attention and the
loss stay as they are, and the layers stay plain PyTorch that computes the same eagerly (on CPU, or with the
fusion off). Every instance of a method shares one compiled graph (the compiler lifts the module's parameters
to inputs), so a 6+6-layer model compiles a handful of graphs, not one per layer.

Dropout drawn inside a compiled kernel takes its masks from the compiler's own generator, seeded from
PyTorch's: a run is as reproducible (and resumes as exactly) as an eager one, but draws other masks than the
eager run with the same seed.

In `attnx fit` the fusion is the callback [`FusedKernels`][attnx.training.fusion.FusedKernels]
(`--trainer.callbacks+=attnx.training.fusion.FusedKernels`): off unless named, until it is measured against
the eager step on a GPU (`bench/bench_gpu.py --fused`).
"""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import nn

from attnx.components.feedforward import GeluFeedForward, ReluFeedForward, SwishFeedForward
from attnx.components.gated import GEGLUFeedForward, SwiGLUFeedForward
from attnx.model.layers import PostNorm, PreNorm

POINTWISE_METHODS: dict[type[nn.Module], str] = {
    PostNorm: "merge",
    PreNorm: "merge",
    ReluFeedForward: "hidden",
    SwishFeedForward: "hidden",
    GeluFeedForward: "hidden",
    SwiGLUFeedForward: "hidden",
    GEGLUFeedForward: "hidden",
}
"""The module classes whose pointwise tail is compiled, and the method that holds it. Components of other
classes (a plugin's FFN or norm) run as they are."""


def fuse_pointwise(model: nn.Module, backend: str = "inductor") -> int:
    """Compile the pointwise tail of every residual connection and FFN of `model` in place; returns how many
    modules now call a compiled tail (a second call compiles nothing more).

    The compile itself happens at the first call of each shape class, so the first training step takes
    longer. `backend` is `torch.compile`'s (`"inductor"` fuses; the tests use `"aot_eager"`, which traces the
    same graphs without generating kernels).
    """
    fused = 0
    for module in model.modules():
        name = POINTWISE_METHODS.get(type(module))
        if name is None:
            continue
        if name not in vars(module):  # not yet compiled: the class's method, not an instance's
            compiled = torch.compile(getattr(module, name), dynamic=True, backend=backend)
            object.__setattr__(module, name, compiled)
        fused += 1
    return fused


class FusedKernels(Callback):
    """`attnx fit` with the residual merges and FFN hidden layers of the model compiled into fused kernels
    ([`fuse_pointwise`][attnx.training.fusion.fuse_pointwise]) when it trains on CUDA.

    Says in one line what it did: how many modules it fused, or that on this device it leaves the layers as
    they are (compiled kernels pay on a GPU; on a CPU compiling made small models' steps slower). The first
    training step of each new shape class takes longer while it compiles; the time of the whole first step
    is printed too.
    """

    DEVICES: tuple[str, ...] = ("cuda",)
    """The device types it fuses on (the tests add `cpu`, with `BACKEND` `aot_eager`)."""
    BACKEND = "inductor"
    """`torch.compile`'s backend for the tails (see `fuse_pointwise`)."""

    def __init__(self) -> None:
        self.fused = 0
        self._first_step: float | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        device = trainer.strategy.root_device
        if device.type not in self.DEVICES:
            self._say(f"fused kernels: off on {device.type} (CUDA only); the layers run as they are")
            return
        self.fused = fuse_pointwise(pl_module.model, self.BACKEND)
        layers = [*pl_module.model.encoder_layers, *pl_module.model.decoder_layers]
        unfused = sorted(
            {type(layer.ffn).__name__ for layer in layers} - {c.__name__ for c in POINTWISE_METHODS}
        )
        if unfused:
            self._say(f"fused kernels: {', '.join(unfused)} left as it is (no compiled tail for its class)")
        self._say(
            f"fused kernels: the pointwise tails of {self.fused} residual connections and FFNs compiled "
            "(dropout + residual + norm, the FFN's activation + dropout); the first step compiles them"
        )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx
    ) -> None:
        if self.fused and self._first_step is None:
            self._first_step = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if self.fused and self._first_step is not None and self._first_step > 0:
            self._say(
                f"fused kernels: first batch, compile included, took {time.perf_counter() - self._first_step:.1f} s"
            )
            self._first_step = 0.0

    @staticmethod
    @rank_zero_only
    def _say(line: str) -> None:
        print(line, flush=True)
