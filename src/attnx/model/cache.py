"""The key/value cache of incremental decoding: model state that attention components read and fill
through the [`KeyValueCache`][attnx.components.protocols.KeyValueCache] contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class AttentionCache:
    """Keys and values an attention layer has already computed, each `(B, H_kv, S, d_k)` (only the key/value
    heads: grouped-query attention shrinks the cache by `n_heads / kv_heads`).

    `static` caches (encoder-decoder attention) are filled once from the encoder output and reused;
    the others (decoder self-attention) grow by one position per decoding step.
    """

    static: bool = False
    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def offset(self) -> int:
        """Position of the next call's first query: the positions held, 0 for a static cache."""
        return 0 if self.static else self.length

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search reordering and finished-sentence removal)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)

    def keys_values(self, project: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, int]:
        """Keys and values `(B, H, S, d)` to attend over, and the position of the first new query.

        `project()` computes this call's keys and values; it is skipped when a filled static cache already
        holds them. A growing cache gets them appended, and the offset is the number of positions it held before.
        """
        if self.static and self.k is not None:
            return self.k, self.v, 0
        k, v = project()
        offset = 0
        if not self.static and self.k is not None:
            offset = self.length
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v, offset
