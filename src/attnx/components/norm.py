"""Layer normalization (Ba et al., 2016), the paper's `LayerNorm` in `LayerNorm(x + Sublayer(x))`."""

from __future__ import annotations

from torch import nn

from attnx.hookspecs import hookimpl


class LayerNorm(nn.LayerNorm):
    """Layer normalization over `d_model` with a learned gain and bias."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(d_model, eps=eps)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_norm("layernorm", LayerNorm)
