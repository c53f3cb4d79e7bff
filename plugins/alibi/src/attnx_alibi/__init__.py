"""ALiBi (Press et al. 2022, "Train Short, Test Long"): positions as a linear bias on the attention scores."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnx import hookimpl
from attnx.errors import ConfigError

__all__ = ["ALiBi", "alibi_slopes"]


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al. 2022 §3: head `h` of `n` (a power of 2) gets the slope `2^(-8h/n)`, `h = 1..n`; for
    other `n`, the slopes of the nearest lower power of 2, then every other slope of the next one."""
    if math.log2(n_heads).is_integer():
        return [2 ** (-8 * h / n_heads) for h in range(1, n_heads + 1)]
    lower = 2 ** math.floor(math.log2(n_heads))
    return alibi_slopes(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]


class ALiBi(nn.Module):
    """Attention with linear biases: head `h` adds `-m_h · |i - j|` to the scaled score of query `i` and key
    `j` (Press et al. 2022, eq. in §3); no position is added to the embeddings, and none is learned.

    Acts on the scores of self-attention (`acts_on = "scores"`), built as `cls(n_heads, max_len)`; in the
    decoder, keys after the query are masked, so the bias is the paper's `-m (i - j)`; in the encoder the
    distance is symmetric. It has no length limit (`max_len` is not needed) and no arguments.
    """

    acts_on = "scores"

    def __init__(self, n_heads: int, max_len: int) -> None:
        super().__init__()
        if n_heads <= 0:
            raise ConfigError(f"ALiBi needs at least one head, got n_heads {n_heads}")
        slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float64)
        self.register_buffer("slopes", slopes, persistent=False)  # (H,)

    def forward(self, t: int, s: int, offset: int = 0, causal: bool = False) -> Tensor:
        device = self.slopes.device
        query = torch.arange(offset, offset + t, device=device).unsqueeze(1)  # (T, 1)
        key = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
        distance = (query - key).abs().to(torch.float64)  # (T, S)
        return -self.slopes.view(-1, 1, 1) * distance  # (H, T, S), float64: cast where it is added


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_positional("alibi", ALiBi)
