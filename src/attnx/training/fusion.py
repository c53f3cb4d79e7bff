"""Fused pointwise kernels for the GPU-bound step: what follows each matrix product, compiled as one kernel.

At large batches a GPU step is the matrix products plus the pointwise passes between them, each a trip
through memory: after every sub-layer dropout, the residual add and LayerNorm (the paper's
`LayerNorm(x + Dropout(Sublayer(x)))`), and in every FFN the bias, ReLU and dropout. Fused, each is one read
and one write. [`fuse_pointwise`][attnx.training.fusion.fuse_pointwise] compiles exactly those methods
(`torch.compile` of a small function, shapes dynamic) and nothing else: the matrix products, attention and the
loss stay as they are, and the layers stay plain PyTorch that computes the same eagerly (on CPU, or with the
fusion off). Every instance of a method shares one compiled graph (the compiler lifts the module's parameters
to inputs), so a 6+6-layer model compiles a handful of graphs, not one per layer.

Dropout drawn inside a compiled kernel takes its masks from the compiler's own generator, seeded from
PyTorch's: a run is as reproducible (and resumes as exactly) as an eager one, but draws other masks than the
eager run with the same seed.
"""

from __future__ import annotations

import torch
from torch import nn

from attnx.components.feedforward import ReluFeedForward
from attnx.model.layers import PostNorm, PreNorm

POINTWISE_METHODS: dict[type[nn.Module], str] = {
    PostNorm: "merge",
    PreNorm: "merge",
    ReluFeedForward: "hidden",
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
