"""Gated feed-forward networks (Shazeer 2020, "GLU Variants Improve Transformer"): SwiGLU and GEGLU."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnx.components.values import flag, integer, probability
from attnx.hookspecs import hookimpl


class GatedFeedForward(nn.Module):
    """Shazeer 2020 eq. 6: `FFN(x) = (act(x W) ⊗ x V) W2`, applied to each position separately.

    `d_ff` is the hidden width of each of the three matrices `W`, `V` (`d_model x d_ff`) and `W2`
    (`d_ff x d_model`), as in LLaMA and T5 v1.1: at the same `d_ff` it has 1.5x the parameters and FLOPs
    of the paper's two-matrix network; `d_ff = 2/3 · 4 · d_model` matches them (Shazeer's choice). `bias`
    (default off, as in the paper) adds biases to all three; `dropout` acts on the gated hidden activations.
    The gate's activation is each registered class's own: SiLU for SwiGLU, GELU for GEGLU.
    [`hidden`][attnx.components.gated.GatedFeedForward.hidden] is everything before `W2`, a method of its own:
    where it is compiled ([`fuse_pointwise`][attnx.training.fusion.fuse_pointwise]) the activation, the
    product and the dropout after the two matrix products are one kernel.
    """

    matrices = 3

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        d_model, d_ff = integer("d_model", d_model), integer("d_ff", d_ff, what="the hidden width")
        bias = flag("bias", bias)
        self.w = nn.Linear(d_model, d_ff, bias=bias)
        self.v = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = probability("dropout", dropout)
        for layer in (self.w, self.v, self.w2):
            nn.init.xavier_uniform_(layer.weight)
            if bias:
                nn.init.zeros_(layer.bias)

    def activation(self, x: Tensor) -> Tensor:
        """The gate's activation; SwiGLU and GEGLU each define theirs."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.hidden(x))  # (B, T, D)

    def hidden(self, x: Tensor) -> Tensor:
        """`Dropout(act(x W) ⊗ x V)`, `(B, T, d_ff)`."""
        return F.dropout(self.activation(self.w(x)) * self.v(x), self.dropout, self.training)


class SwiGLUFeedForward(GatedFeedForward):
    """SwiGLU: the gate is `Swish_1(x W) = SiLU(x W)` (Shazeer 2020 eq. 6; LLaMA's feed-forward)."""

    def activation(self, x: Tensor) -> Tensor:
        return F.silu(x)


class GEGLUFeedForward(GatedFeedForward):
    """GEGLU: the gate is `GELU(x W)` (Shazeer 2020 eq. 6; T5 v1.1's feed-forward, exact GELU)."""

    def activation(self, x: Tensor) -> Tensor:
        return F.gelu(x)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_feedforward("swiglu", SwiGLUFeedForward)
    registry.add_feedforward("geglu", GEGLUFeedForward)
