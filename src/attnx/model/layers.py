"""§3.1 Encoder and decoder layers: sub-layers wrapped in residual connections, dropout and normalization."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from attnx.model.cache import AttentionCache


class PostNorm(nn.Module):
    """The paper's residual connection: `LayerNorm(x + Dropout(Sublayer(x)))`.

    What follows the sub-layer is [`merge`][attnx.model.layers.PostNorm.merge], a method of its own: pointwise
    work that one compiled kernel does where [`fuse_pointwise`][attnx.training.fusion.fuse_pointwise] compiles
    it, and plain PyTorch otherwise.
    """

    def __init__(self, norm: nn.Module, dropout: float) -> None:
        super().__init__()
        self.norm = norm
        self.dropout = dropout

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.merge(x, sublayer(x))

    def merge(self, x: Tensor, y: Tensor) -> Tensor:
        """`LayerNorm(x + Dropout(y))`: the residual `x` `(B, T, D)` and the sub-layer's output `y`."""
        return self.norm(x + F.dropout(y, self.dropout, self.training))


class PreNorm(nn.Module):
    """The pre-norm variant `x + Dropout(Sublayer(LayerNorm(x)))`; the stack then ends in one more norm.

    [`merge`][attnx.model.layers.PreNorm.merge] is the pointwise work after the sub-layer, as in
    [`PostNorm`][attnx.model.layers.PostNorm].
    """

    def __init__(self, norm: nn.Module, dropout: float) -> None:
        super().__init__()
        self.norm = norm
        self.dropout = dropout

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.merge(x, sublayer(self.norm(x)))

    def merge(self, x: Tensor, y: Tensor) -> Tensor:
        """`x + Dropout(y)`: the residual `x` `(B, T, D)` and the sub-layer's output `y`."""
        return x + F.dropout(y, self.dropout, self.training)


RESIDUALS: dict[str, type[nn.Module]] = {"post": PostNorm, "pre": PreNorm}


def in_attention(positions: nn.Module | None) -> dict[str, nn.Module]:
    """The keyword that hands self-attention a positional component acting inside it; none otherwise, so an
    attention component that takes no positions is never passed the argument."""
    return {} if positions is None else {"positions": positions}


class EncoderLayer(nn.Module):
    """§3.1 Encoder layer: multi-head self-attention, then the position-wise FFN."""

    def __init__(
        self, self_attn: nn.Module, ffn: nn.Module, attn_residual: nn.Module, ffn_residual: nn.Module
    ):
        super().__init__()
        self.self_attn = self_attn
        self.ffn = ffn
        self.attn_residual = attn_residual
        self.ffn_residual = ffn_residual

    def forward(
        self,
        x: Tensor,
        src_mask: Tensor | None,
        weights: list | None = None,
        positions: nn.Module | None = None,
    ) -> Tensor:
        """`positions`: the encoder's positional component where it acts inside attention, else None."""
        where = in_attention(positions)

        def attend(h: Tensor) -> Tensor:
            if weights is None:
                return self.self_attn(h, h, key_mask=src_mask, **where)
            out, w = self.self_attn(h, h, key_mask=src_mask, need_weights=True, **where)
            weights.append(w)
            return out

        x = self.attn_residual(x, attend)  # (B, S, D)
        return self.ffn_residual(x, self.ffn)


class DecoderLayer(nn.Module):
    """§3.1 Decoder layer: masked self-attention, encoder-decoder attention, then the FFN."""

    def __init__(
        self,
        self_attn: nn.Module,
        cross_attn: nn.Module,
        ffn: nn.Module,
        self_residual: nn.Module,
        cross_residual: nn.Module,
        ffn_residual: nn.Module,
    ):
        super().__init__()
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.self_residual = self_residual
        self.cross_residual = cross_residual
        self.ffn_residual = ffn_residual

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        cache: tuple[AttentionCache, AttentionCache] | None = None,
        weights: list | None = None,
        positions: nn.Module | None = None,
    ) -> Tensor:
        """`positions`: the decoder's positional component where it acts inside attention, else None; it
        reaches self-attention only (encoder-decoder attention compares positions of two sequences)."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        where = in_attention(positions)

        def attend_self(h: Tensor) -> Tensor:
            return self.self_attn(h, h, causal=True, cache=self_cache, **where)

        def attend_source(h: Tensor) -> Tensor:
            if weights is None:
                return self.cross_attn(h, memory, key_mask=src_mask, cache=cross_cache)
            out, w = self.cross_attn(h, memory, key_mask=src_mask, cache=cross_cache, need_weights=True)
            weights.append(w)
            return out

        x = self.self_residual(x, attend_self)  # (B, T, D)
        x = self.cross_residual(x, attend_source)
        return self.ffn_residual(x, self.ffn)
