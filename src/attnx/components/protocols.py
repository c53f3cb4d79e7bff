"""What the model expects of each kind of component.

A plugin class is constructed with the shape arguments below plus the ``args`` mapping of its config entry,
and must behave as the matching protocol. Tensor shapes: ``B`` batch, ``T`` query length, ``S`` key length,
``D`` d_model, ``H`` heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass
class AttentionCache:
    """Keys and values an attention layer has already computed, each ``(B, H, S, d_k)``.

    ``static`` caches (encoder-decoder attention) are filled once from the encoder output and reused;
    the others (decoder self-attention) grow by one position per decoding step.
    """

    static: bool = False
    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reordering and finished-sentence removal)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def cached_keys_values(
    cache: AttentionCache | None, project: Callable[[], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor, int]:
    """Keys and values ``(B, H, S, d)`` to attend over, and the position of the first new query.

    ``project()`` computes this call's keys and values; it is skipped when a filled static cache already
    holds them. A growing cache gets them appended, and the offset is the number of positions it held before.
    """
    if cache is not None and cache.static and cache.k is not None:
        return cache.k, cache.v, 0
    k, v = project()
    offset = 0
    if cache is not None:
        if not cache.static and cache.k is not None:
            offset = cache.length
            k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
        cache.k, cache.v = k, v
    return k, v, offset


class Attention(Protocol):
    """``cls(d_model: int, n_heads: int, **args)``."""

    def __call__(
        self,
        query: Tensor,  # (B, T, D)
        key_value: Tensor,  # (B, S, D)
        *,
        key_mask: Tensor | None = None,  # (B, S) bool, True = real token
        causal: bool = False,
        cache: AttentionCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:  # (B, T, D), and (B, H, T, S) weights if asked
        ...


class FeedForward(Protocol):
    """``cls(d_model: int, d_ff: int, **args)``; maps ``(B, T, D)`` to ``(B, T, D)`` position by position."""

    def __call__(self, x: Tensor) -> Tensor: ...


class PositionalEncoding(Protocol):
    """``cls(d_model: int, max_len: int, **args)``; adds position information to scaled embeddings.

    ``acts_on`` says where it acts; every built-in acts on ``"embeddings"`` (added before the first layer).
    ``offset`` is the position of the first row of ``x`` (non-zero during incremental decoding).
    """

    acts_on: str

    def __call__(self, x: Tensor, offset: int = 0) -> Tensor: ...


class Norm(Protocol):
    """``cls(d_model: int, **args)``; normalizes ``(B, T, D)`` over ``D``."""

    def __call__(self, x: Tensor) -> Tensor: ...


def attention_mask(
    key_mask: Tensor | None, causal: bool, t: int, s: int, offset: int, device: torch.device
) -> Tensor | None:
    """Boolean ``(B|1, 1, T, S)`` mask, True = may attend, combining padding and causality.

    With ``offset`` keys already cached, query ``i`` sits at position ``offset + i`` and may see keys
    ``j <= offset + i``.
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
