"""§3.5 Positional encodings: the sinusoid, its Marian and fairseq layouts, and learned positions (Table 3,
row E)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnx.components.values import integer
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


def sines_first_table(max_len: int, d_model: int) -> Tensor:
    """Marian's layout of the paper's sinusoid: the same frequencies and positions (0 first), the sines of all
    frequencies in the first `ceil(D/2)` features and their cosines in the rest; `(max_len, D)` float64.
    Hugging Face's `MarianSinusoidalPositionalEmbedding` computes it in float64 too, then rounds to float32."""
    table = sinusoid_table(max_len, d_model)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


def fairseq_sinusoid_table(max_len: int, d_model: int, padding_idx: int = 1) -> Tensor:
    """fairseq's sinusoid (tensor2tensor's) at the positions of the first `max_len` tokens; `(max_len, D)`.

    `PE(p, i) = sin(p · e^(-i s))` and `PE(p, D/2 + i) = cos(p · e^(-i s))` for `i < D/2`, with
    `s = log(10000) / (D/2 - 1)` (the highest frequency 1, the lowest 1/10000, where the paper's lowest is
    `10000^(-(D-2)/D)`); an odd `D` gets a last feature of zeros. Token `t` of a sentence is at position
    `p = padding_idx + 1 + t` (fairseq's `make_positions`), so row `t` here is fairseq's row
    `padding_idx + 1 + t`. Computed in float32 with fairseq's own operations (Hugging Face's
    `M2M100SinusoidalPositionalEmbedding` alike): a model trained with those values gets the same ones.
    """
    half = d_model // 2
    if half < 2:
        raise ConfigError(f"fairseq_sinusoidal needs d_model >= 4 (two frequencies at least), got {d_model}")
    step = math.log(10000) / (half - 1)
    inv_freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)  # (D/2,)
    first = padding_idx + 1
    positions = torch.arange(first, first + max_len, dtype=torch.int64).float().unsqueeze(1)  # (L, 1)
    angles = positions * inv_freq.unsqueeze(0)  # (L, D/2)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if d_model % 2:
        table = torch.cat([table, torch.zeros(max_len, 1)], dim=1)
    return table


class FixedPositionalEncoding(nn.Module):
    """A fixed table added to the (scaled) embeddings, row `t` at position `t`. Not a parameter; not saved in
    checkpoints (each class rebuilds its table from its arguments)."""

    acts_on = "embeddings"

    def __init__(self, table: Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table, persistent=False)  # (max_len, D)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.table.shape[0]:
            raise ConfigError(
                f"sequence position {offset + t} exceeds max_len {self.table.shape[0]}; raise the model's max_len"
            )
        return x + self.table[offset : offset + t].to(x.dtype)  # (B, T, D)


class SinusoidalPositionalEncoding(FixedPositionalEncoding):
    """`sinusoidal`: §3.5 fixed sinusoids, sines and cosines interleaved (`PE(pos, 2i) = sin`,
    `PE(pos, 2i+1) = cos`), position 0 first.

    The table is kept in float64 and cast per call, so a float64 model gets exact sinusoids.
    """

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__(sinusoid_table(max_len, d_model))


class MarianSinusoidalPositionalEncoding(FixedPositionalEncoding):
    """`marian_sinusoidal`: the paper's sinusoids with the sines in the first half of the features and the
    cosines in the second ([`sines_first_table`][attnx.components.positional.sines_first_table]), position 0
    first: Marian's (OPUS-MT) layout. Kept in float64 like `sinusoidal`."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__(sines_first_table(max_len, d_model))


class FairseqSinusoidalPositionalEncoding(FixedPositionalEncoding):
    """`fairseq_sinusoidal`: fairseq's sinusoids (M2M-100, NLLB-200), sines then cosines with fairseq's
    frequencies, token `t` at position `padding_idx + 1 + t`
    ([`fairseq_sinusoid_table`][attnx.components.positional.fairseq_sinusoid_table]); float32 as fairseq.

    Args:
        padding_idx: fairseq's padding id, below the first position (1 in M2M-100 and NLLB-200); the
            positions of a sentence start at `padding_idx + 1`.
    """

    def __init__(self, d_model: int, max_len: int, padding_idx: int = 1) -> None:
        padding_idx = integer("padding_idx", padding_idx, 0, "fairseq's padding id; positions start above it")
        super().__init__(fairseq_sinusoid_table(max_len, d_model, padding_idx))
        self.padding_idx = padding_idx


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
    registry.add_positional("marian_sinusoidal", MarianSinusoidalPositionalEncoding)
    registry.add_positional("fairseq_sinusoidal", FairseqSinusoidalPositionalEncoding)
    registry.add_positional("learned", LearnedPositionalEncoding)
