"""What the model expects of each kind of component.

A plugin class is constructed with the shape arguments below plus the `args` mapping of its config entry,
and must behave as the matching protocol. Tensor shapes: `B` batch, `T` query length, `S` key length,
`D` d_model, `H` heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import Tensor


class KeyValueCache(Protocol):
    """What an attention component is handed as `cache` during incremental decoding (the model's
    [`AttentionCache`][attnx.model.cache.AttentionCache]); it holds keys and values `(B, H_kv, S, d)`: as many
    heads as the attention projects keys and values into, fewer than its query heads under grouped-query
    attention."""

    def keys_values(self, project: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, int]:
        """Keys and values to attend over, and the position of the first new query; `project()` computes
        this call's keys and values and is skipped when the cache already holds them."""
        ...

    def offset(self) -> int:
        """The position of this call's first query, known before its keys are computed: the positions a
        growing (self-attention) cache already holds, 0 for a static (encoder-decoder) one. Positions that
        act on keys place the new keys there before the cache stores them."""
        ...


class Attention(Protocol):
    """`cls(d_model: int, n_heads: int, **args)`.

    The model calls it inside [`attention_backends`][attnx.components.attention.attention_backends], entered
    once per pass: a component that runs `F.scaled_dot_product_attention` gets the same kernel choice as the
    built-in one, and sets no backend flag itself."""

    def __call__(
        self,
        query: Tensor,  # (B, T, D)
        key_value: Tensor,  # (B, S, D)
        *,
        key_mask: Tensor | None = None,  # (B, S) bool, True = real token
        causal: bool = False,
        cache: KeyValueCache | None = None,
        need_weights: bool = False,
        positions: PositionalEncoding | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:  # (B, T, D), and (B, H, T, S) weights if asked
        ...

    positions_accepted: tuple[str, ...]
    """Where a positional component may act inside this attention (`"queries_keys"`, `"scores"`): a class
    attribute, read when the model is built. The model passes `positions=` to self-attention only when the
    positional component acts inside attention, and only to a component whose `positions_accepted` names
    that place; any other pairing is refused at build time naming both. Without the attribute a component
    takes none, and is never passed `positions`. [`positioned_queries_keys`][attnx.components.masking.positioned_queries_keys]
    and [`score_bias`][attnx.components.masking.score_bias] apply them, for built-ins and plugins alike."""


class FeedForward(Protocol):
    """`cls(d_model: int, d_ff: int, **args)`; maps `(B, T, D)` to `(B, T, D)` position by position.

    `matrices`, a class attribute, is the number of `d_model x d_ff` matrices it multiplies each position by:
    2 for the paper's `W1`, `W2` (the count when it is absent), 3 for a gated network's `W`, `V`, `W2`. The
    model's FLOPs count ([`training_flops_per_token`][attnx.model.builders.training_flops_per_token]) reads it.
    """

    matrices: int

    def __call__(self, x: Tensor) -> Tensor: ...


POSITIONAL_PLACES = ("embeddings", "queries_keys", "scores")
"""Where a positional component may act: added to the scaled embeddings before the first layer, applied to
each head's queries and keys in self-attention, or added to self-attention's scaled scores."""


class PositionalEncoding(Protocol):
    """Position information, acting where its class attribute `acts_on` says (one of
    [`POSITIONAL_PLACES`][attnx.components.protocols.POSITIONAL_PLACES]); the model reads it before
    building the component, builds it with the shape arguments of that place, and applies it there
    (a value outside the three is refused at build time). Each stack (encoder, decoder) gets its own.

    - `"embeddings"`: `cls(d_model, max_len, **args)`; `__call__(x, offset)` maps `(B, T, D)` scaled
      embeddings to `(B, T, D)`; `offset` is the position of the first row of `x`.
    - `"queries_keys"`: `cls(head_dim, max_len, **args)`; `__call__(x, offset)` maps one projection's heads
      `(B, H, T, d_k)` at positions `offset..offset+T-1` to `(B, H, T, d_k)`; self-attention applies it to
      its queries and its new keys before they are cached (rotary positions).
    - `"scores"`: `cls(n_heads, max_len, **args)`; `__call__(t, s, offset, causal)` gives the bias
      `(H, T, S)` added to self-attention's scaled scores `Q K^T / sqrt(d_k)` of queries at positions
      `offset..offset+T-1` over keys at `0..S-1`; `causal` is True in the decoder (keys after a query are
      masked anyway) and False in the encoder (ALiBi, T5's relative buckets).

    During incremental decoding `offset` comes from the cache
    ([`KeyValueCache.offset`][attnx.components.protocols.KeyValueCache.offset]) inside attention, and from
    the number of positions decoded for embeddings.
    """

    acts_on: str

    def __call__(self, *args, **kwargs) -> Tensor: ...


class Norm(Protocol):
    """`cls(d_model: int, **args)`; normalizes `(B, T, D)` over `D`."""

    def __call__(self, x: Tensor) -> Tensor: ...
