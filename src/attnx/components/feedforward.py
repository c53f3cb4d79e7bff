"""§3.3 Position-wise feed-forward network, with the paper's ReLU or the Swish and GELU of later models."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnx.components.values import integer, probability
from attnx.hookspecs import hookimpl


class TwoLayerFeedForward(nn.Module):
    """§3.3 `FFN(x) = act(x W1 + b1) W2 + b2`, applied to each position separately.

    Two linear layers with biases around an activation that each registered class defines: ReLU (the paper's,
    `max(0, x)`), Swish (`x · sigmoid(x)`, SiLU: Marian's `swish`) or GELU (the exact `x · Φ(x)`, BERT's and
    Hugging Face's `gelu`). `dropout` acts on the hidden activations; the paper uses none there (0.0).
    [`hidden`][attnx.components.feedforward.TwoLayerFeedForward.hidden] is the first layer with its bias,
    activation and dropout, a method of its own: where it is compiled
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

    def activation(self, x: Tensor) -> Tensor:
        """The hidden layer's activation; each registered class defines its own."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.hidden(x))  # (B, T, D)

    def hidden(self, x: Tensor) -> Tensor:
        """`Dropout(act(x W1 + b1))`, `(B, T, d_ff)`."""
        return F.dropout(self.activation(self.w1(x)), self.dropout, self.training)


class ReluFeedForward(TwoLayerFeedForward):
    """`relu`: §3.3 Eq. 2, `FFN(x) = max(0, x W1 + b1) W2 + b2`."""

    def activation(self, x: Tensor) -> Tensor:
        return F.relu(x)


class SwishFeedForward(TwoLayerFeedForward):
    """`swish`: `FFN(x) = Swish(x W1 + b1) W2 + b2`, `Swish(x) = x · sigmoid(x)` (SiLU; Ramachandran et al.
    2017), the activation of Marian's OPUS-MT models."""

    def activation(self, x: Tensor) -> Tensor:
        return F.silu(x)


class GeluFeedForward(TwoLayerFeedForward):
    """`gelu`: `FFN(x) = GELU(x W1 + b1) W2 + b2` with the exact `GELU(x) = x · Φ(x)` (Hendrycks & Gimpel
    2016), not the tanh approximation: Hugging Face's `gelu` (`MarianConfig`'s default activation)."""

    def activation(self, x: Tensor) -> Tensor:
        return F.gelu(x)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_feedforward("relu", ReluFeedForward)
    registry.add_feedforward("swish", SwishFeedForward)
    registry.add_feedforward("gelu", GeluFeedForward)
