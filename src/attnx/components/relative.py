"""T5's bucketed relative position bias (Raffel et al. 2020, §2.1): positions as a bias on the scores."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnx.components.values import integer, is_integer
from attnx.errors import ConfigError
from attnx.hookspecs import hookimpl


def relative_buckets(relative: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each key-minus-query distance: exact buckets for the nearest half of the range,
    logarithmically wider ones up to `max_distance`, one last bucket beyond. `bidirectional` gives keys
    after the query buckets of their own (the encoder); otherwise later keys share bucket 0 (the decoder,
    which masks them anyway)."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        bucket = bucket + (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = buckets // 2
    wide = (
        exact
        + (
            torch.log(distance.float().clamp(min=1) / exact)  # float32, as T5's own code and CTranslate2
            / math.log(max_distance / exact)
            * (buckets - exact)
        ).long()
    )
    wide = wide.clamp(max=buckets - 1)
    return bucket + torch.where(distance < exact, distance, wide)


class T5RelativeBias(nn.Module):
    """T5 §2.1: a learned scalar per head and bucket of relative position `j - i`, added to the attention
    scores of self-attention (`acts_on = "scores"`); bidirectional in the encoder, unidirectional in the
    decoder, one table per stack shared by its layers (as T5 does).

    Built as `cls(n_heads, max_len, buckets=32, max_distance=128)`: T5's 32 buckets, distances beyond 128
    sharing the last. The table starts at zero (no position preferred); `max_len` is not needed.
    """

    acts_on = "scores"

    def __init__(self, n_heads: int, max_len: int, buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        n_heads = integer("n_heads", n_heads)
        if (
            not (is_integer(buckets) and is_integer(max_distance))
            or buckets < 4
            or max_distance <= buckets // 2
        ):
            raise ConfigError(
                f"relative bias needs integers buckets >= 4 and max_distance > buckets / 2, got buckets "
                f"{buckets!r}, max_distance {max_distance!r}"
            )
        self.buckets = buckets
        self.max_distance = max_distance
        self.bias = nn.Embedding(buckets, n_heads)
        nn.init.zeros_(self.bias.weight)

    def forward(self, t: int, s: int, offset: int = 0, causal: bool = False) -> Tensor:
        device = self.bias.weight.device
        query = torch.arange(offset, offset + t, device=device).unsqueeze(1)  # (T, 1)
        key = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
        bucket = relative_buckets(key - query, not causal, self.buckets, self.max_distance)  # (T, S)
        return self.bias(bucket).permute(2, 0, 1)  # (H, T, S)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_positional("t5_relative", T5RelativeBias)
