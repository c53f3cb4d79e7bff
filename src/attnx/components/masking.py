"""What every attention component does alike: the mask from padding and causality, and keys and values
through the decoding cache."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnx.components.protocols import KeyValueCache


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
