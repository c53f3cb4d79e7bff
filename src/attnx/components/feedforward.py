"""§3.3 Position-wise feed-forward network."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnx.hookspecs import hookimpl


class ReluFeedForward(nn.Module):
    """§3.3 `FFN(x) = max(0, x W1 + b1) W2 + b2`, applied to each position separately.

    `dropout` acts on the hidden ReLU activations; the paper uses none there (0.0).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.dropout = dropout
        for layer in (self.w1, self.w2):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.relu(self.w1(x))  # (B, T, d_ff)
        return self.w2(F.dropout(hidden, self.dropout, self.training))  # (B, T, D)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_feedforward("relu", ReluFeedForward)
