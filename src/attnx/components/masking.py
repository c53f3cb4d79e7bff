"""What every attention component does alike: the mask from padding and causality, and keys and values
through the decoding cache."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnx.components.protocols import KeyValueCache, PositionalEncoding


def cached_keys_values(
    cache: KeyValueCache | None, project: Callable[[], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor, int]:
    """Keys and values `(B, H, S, d)` to attend over, and the position of the first new query.

    `project()` computes this call's keys and values; without a cache that is all, and the offset is 0.
    With one, the cache decides ([`AttentionCache.keys_values`][attnx.model.cache.AttentionCache.keys_values]).
    """
    if cache is None:
        k, v = project()
        return k, v, 0
    return cache.keys_values(project)


def attention_mask(
    key_mask: Tensor | None, causal: bool, t: int, s: int, offset: int, device: torch.device
) -> Tensor | None:
    """Boolean `(B|1, 1, T, S)` mask, True = may attend, combining padding and causality.

    With `offset` keys already cached, query `i` sits at position `offset + i` and may see keys
    `j <= offset + i`.
    """
    mask = None
    if causal:
        q_pos = torch.arange(t, device=device).unsqueeze(1) + offset  # (T, 1)
        mask = torch.arange(s, device=device).unsqueeze(0) <= q_pos  # (T, S)
        mask = mask.view(1, 1, t, s)
    if key_mask is not None:
        keys = key_mask.view(key_mask.shape[0], 1, 1, s)  # (B, 1, 1, S)
        mask = keys if mask is None else mask & keys
    return mask


def cache_offset(cache: KeyValueCache | None) -> int:
    """The position of a call's first query before its keys are projected: 0 without a cache."""
    return 0 if cache is None else cache.offset()


def acts_on(positions: PositionalEncoding | None, place: str) -> bool:
    """Whether `positions` is given and acts on `place` (`"queries_keys"` or `"scores"`)."""
    return positions is not None and positions.acts_on == place


def positioned_queries_keys(
    positions: PositionalEncoding | None, q: Tensor, k: Tensor, offset: int
) -> tuple[Tensor, Tensor]:
    """Queries `(B, H, T, d)` and new keys `(B, H_kv, T, d)` with positions applied where they act on
    queries and keys (at positions `offset..offset+T-1`); unchanged otherwise. Call it before the keys
    go into the cache: cached keys keep the positions they were given."""
    if not acts_on(positions, "queries_keys"):
        return q, k
    return positions(q, offset), positions(k, offset)


def score_bias(
    positions: PositionalEncoding | None, t: int, s: int, offset: int, causal: bool
) -> Tensor | None:
    """The `(H, T, S)` bias `positions` adds to the scaled scores, or None where it acts elsewhere."""
    if not acts_on(positions, "scores"):
        return None
    return positions(t, s, offset, causal)


def additive_mask(bias: Tensor, mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """A score bias `(H, T, S)` and a boolean mask `(B|1, 1, T|1, S)` (True = may attend) as one float mask
    `(B|1, H, T, S)` in `dtype`, -inf where the mask forbids: what `scaled_dot_product_attention` adds to
    its scaled scores."""
    bias = bias.to(dtype).unsqueeze(0)  # (1, H, T, S)
    if mask is None:
        return bias
    return bias.masked_fill(~mask, float("-inf"))
