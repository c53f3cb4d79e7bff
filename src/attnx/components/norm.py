"""Layer normalization (Ba et al., 2016), the paper's `LayerNorm` in `LayerNorm(x + Sublayer(x))`, and RMSNorm."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnx.components.values import integer, positive
from attnx.hookspecs import hookimpl


class LayerNorm(nn.LayerNorm):
    """Layer normalization over `d_model` with a learned gain and bias."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(integer("d_model", d_model), eps=positive("eps", eps, what="e.g. 1e-5"))


class RMSNorm(nn.Module):
    """Root mean square layer normalization (Zhang & Sennrich 2019, eq. 4): `x / RMS(x) · g`,
    `RMS(x) = sqrt(mean(x²) + eps)`; a learned gain, no bias and no centring. `eps` defaults to 1e-6."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = positive("eps", eps, what="e.g. 1e-6")
        self.weight = nn.Parameter(torch.ones(integer("d_model", d_model)))

    def forward(self, x: Tensor) -> Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)  # the mean of squares in fp32 under autocast
        rms = x.to(wide).pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt()  # (B, T, 1)
        return (x.to(wide) * rms * self.weight).to(x.dtype)  # (B, T, D), in the input's precision


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_norm("layernorm", LayerNorm)
    registry.add_norm("rmsnorm", RMSNorm)
