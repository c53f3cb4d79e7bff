"""§3.3 Position-wise feed-forward network."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnx.components.values import integer, probability
from attnx.hookspecs import hookimpl


class ReluFeedForward(nn.Module):
    """§3.3 `FFN(x) = max(0, x W1 + b1) W2 + b2`, applied to each position separately.

    `dropout` acts on the hidden ReLU activations; the paper uses none there (0.0).
    [`hidden`][attnx.components.feedforward.ReluFeedForward.hidden] is the first layer with its bias, ReLU and
    dropout, a method of its own: where it is compiled
    ([`fuse_pointwise`][attnx.training.fusion.fuse_pointwise]) what follows the matrix product is one kernel.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        d_model, d_ff = integer("d_model", d_model), integer("d_ff", d_ff, what="the hidden width")
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.dropout = probability("dropout", dropout)
        for layer in (self.w1, self.w2):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.hidden(x))  # (B, T, D)

    def hidden(self, x: Tensor) -> Tensor:
        """`Dropout(max(0, x W1 + b1))`, `(B, T, d_ff)`."""
        return F.dropout(F.relu(self.w1(x)), self.dropout, self.training)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_feedforward("relu", ReluFeedForward)
