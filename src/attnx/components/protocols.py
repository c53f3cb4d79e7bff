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
    [`AttentionCache`][attnx.model.cache.AttentionCache]); it holds keys and values `(B, H, S, d)`."""

    def keys_values(self, project: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, int]:
        """Keys and values to attend over, and the position of the first new query; `project()` computes
        this call's keys and values and is skipped when the cache already holds them."""
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
    ) -> Tensor | tuple[Tensor, Tensor]:  # (B, T, D), and (B, H, T, S) weights if asked
        ...


class FeedForward(Protocol):
    """`cls(d_model: int, d_ff: int, **args)`; maps `(B, T, D)` to `(B, T, D)` position by position."""

    def __call__(self, x: Tensor) -> Tensor: ...


class PositionalEncoding(Protocol):
    """`cls(d_model: int, max_len: int, **args)`; adds position information to scaled embeddings.

    `acts_on` says where it acts; every built-in acts on `"embeddings"` (added before the first layer),
    the only place the Transformer applies one: a component saying anything else is refused when the model
    is built ([`Transformer.POSITIONAL_ACTS_ON`][attnx.model.transformer.Transformer.POSITIONAL_ACTS_ON]).
    `offset` is the position of the first row of `x` (non-zero during incremental decoding).
    """

    acts_on: str

    def __call__(self, x: Tensor, offset: int = 0) -> Tensor: ...


class Norm(Protocol):
    """`cls(d_model: int, **args)`; normalizes `(B, T, D)` over `D`."""

    def __call__(self, x: Tensor) -> Tensor: ...
