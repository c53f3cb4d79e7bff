"""Weights that are not numbers: a checkpoint whose weights hold NaN or an infinity is refused where it is read.

A run that diverged, a tool that wrote NaN into a tensor, or bytes changed with the archive's CRC-32 recomputed
give a checkpoint that every other check passes: its zip is whole, its config fits its weights. It would
translate empty lines, average into a model of NaN, export, and resume into a run that "diverges" at once.
[`read_checkpoint`][attnx.checkpoint.format.read_checkpoint] (the one loader of every command and of
`attnx.load`) refuses it in one line naming the tensor, with
[`non_finite_weight`][attnx.checkpoint.finite.non_finite_weight]: one pass of `torch.isfinite` over each
floating-point weight, once per file and command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def non_finite_weight(state: Mapping[str, Any]) -> str | None:
    """The first weight of `state` (a state dict) holding NaN or an infinity, said as
    `NAME (2 NaN, 1 infinite of 4096 values)`; None when every floating-point weight is finite."""
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor) or not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        if bool(torch.isfinite(tensor).all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        infinite = int(torch.isinf(tensor).sum())
        counts = ", ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (infinite, "infinite")) if n)
        return f"{name} ({counts} of {tensor.numel()} values)"
    return None
