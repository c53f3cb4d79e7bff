"""§3.5 Positional encodings: the sinusoid, and learned positions (Table 3, row E)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnx.errors import ConfigError
from attnx.hookspecs import hookimpl


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """`PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`; `(max_len, D)`."""
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


class SinusoidalPositionalEncoding(nn.Module):
    """§3.5 fixed sinusoids added to the (scaled) embeddings. Not a parameter; not saved in checkpoints.

    The table is kept in float64 and cast per call, so a float64 model gets exact sinusoids.
    """

    acts_on = "embeddings"

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.table.shape[0]:
            raise ConfigError(
                f"sequence position {offset + t} exceeds max_len {self.table.shape[0]}; raise the model's max_len"
            )
        return x + self.table[offset : offset + t].to(x.dtype)  # (B, T, D)


class LearnedPositionalEncoding(nn.Module):
    """Table 3 (E): one learned vector per position, added to the (scaled) embeddings."""

    acts_on = "embeddings"

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.embedding.num_embeddings:
            raise ConfigError(
                f"sequence position {offset + t} exceeds max_len {self.embedding.num_embeddings}; "
                "learned positions cannot extrapolate, raise the model's max_len"
            )
        positions = torch.arange(offset, offset + t, device=x.device)
        return x + self.embedding(positions)  # (B, T, D)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_positional("sinusoidal", SinusoidalPositionalEncoding)
    registry.add_positional("learned", LearnedPositionalEncoding)
