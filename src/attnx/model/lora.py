"""LoRA (Hu et al., 2021): low-rank adapters on chosen projections of a Transformer, `W + (alpha / r) · B A`.

An adapter is a parametrization of the projection's weight (`torch.nn.utils.parametrize`), so every use of the
weight — the fused QKV projection, the slices cross-attention takes, an exporter reading it — sees the adapted
weight, and nothing in the layers knows of adapters. `B` starts at zero: the adapted model starts as the model.
"""

from __future__ import annotations

import fnmatch
import math

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from attnx.components.values import is_integer, is_number
from attnx.errors import ConfigError

PROJECTIONS = ("in_proj", "out_proj", "w1", "w2", "w", "v")
"""The projections adapters may go on: attention's stacked W^Q/W^K/W^V and W^O, the paper's FFN's two layers
`w1` and `w2`, a gated FFN's (SwiGLU, GEGLU) gate `w` and linear branch `v` (its output layer is `w2` too)."""


class LowRankDelta(nn.Module):
    """`weight ↦ weight + scale · B A`, with `A` `(r, in)` and `B` `(out, r)`."""

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, weight: Tensor) -> Tensor:
        return weight + self.scale * (self.lora_B @ self.lora_A).to(weight.dtype)  # (out, in)


def adapter_targets(model: nn.Module, projections: list[str], layers: list[str]) -> list[str]:
    """Names of the `nn.Linear` modules of `model` that are one of `projections` inside a layer matching one of
    `layers` (glob patterns over `encoder_layers.N` / `decoder_layers.N`, e.g. `decoder_layers.*`)."""
    unknown = sorted(set(projections) - set(PROJECTIONS))
    if unknown:
        raise ConfigError(f"lora.projections {unknown} unknown; choose among {list(PROJECTIONS)}")
    names = []
    for name, module in model.named_modules():
        parts = name.split(".")
        if not isinstance(module, nn.Linear) or parts[-1] not in projections or len(parts) < 3:
            continue
        layer = ".".join(parts[:2])
        if any(fnmatch.fnmatchcase(layer, pattern) for pattern in layers):
            names.append(name)
    if not names:
        raise ConfigError(
            f"lora: no projection {projections} in the layers {layers} (layers are named encoder_layers.N and "
            "decoder_layers.N; `*` matches any)"
        )
    return names


def check_lora(rank: object, alpha: object) -> None:
    """One line for a rank that is not an integer >= 1 or an alpha that is not a finite number > 0."""
    if not is_integer(rank) or rank < 1:
        raise ConfigError(f"lora.rank must be >= 1, an integer (8 or 16 are usual), got {rank!r}")
    if not is_number(alpha) or not (math.isfinite(alpha) and alpha > 0):
        raise ConfigError(
            f"lora.alpha must be a finite number > 0 (the scale is alpha / rank), got {alpha!r}"
        )


def check_rank(model: nn.Module, names: list[str], rank: int) -> None:
    """A rank above the smaller side of a projection named in `names` is refused in one line (as HF PEFT's
    LoRA requires, r <= min(in, out) features): its `B A` would be no low-rank update but a larger matrix."""
    linears = {name: model.get_submodule(name) for name in names}
    if not linears:
        return
    name, linear = min(linears.items(), key=lambda item: min(item[1].in_features, item[1].out_features))
    most = min(linear.in_features, linear.out_features)
    if rank > most:
        raise ConfigError(
            f"lora.rank {rank} exceeds the smaller side of projection {name} ({linear.out_features} x "
            f"{linear.in_features}): a rank is at most min(in, out) features, here {most}"
        )


def adapter_parameters(model: nn.Module, names: list[str], rank: int) -> int:
    """Parameters that adapters of `rank` on the projections `names` of `model` add: `r · (in + out)` each."""
    check_rank(model, names, rank)
    linears = [model.get_submodule(name) for name in names]
    return sum(rank * (linear.in_features + linear.out_features) for linear in linears)


def add_adapters(model: nn.Module, names: list[str], rank: int, alpha: float) -> None:
    """Freeze every weight of `model` and put a trainable adapter on each projection named in `names`."""
    check_lora(rank, alpha)
    check_rank(model, names, rank)
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        linear = model.get_submodule(name)
        delta = LowRankDelta(linear.out_features, linear.in_features, rank, alpha)
        parametrize.register_parametrization(linear, "weight", delta.to(linear.weight.device))


def adapted(model: nn.Module) -> dict[str, nn.Module]:
    """The modules of `model` whose weight has an adapter, by name."""
    return {name: m for name, m in model.named_modules() if parametrize.is_parametrized(m, "weight")}
