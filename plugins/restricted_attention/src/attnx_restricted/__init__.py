"""Restricted self-attention (§4): each query attends only to keys at most `window` positions away."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnx import hookimpl
from attnx.components.masking import cached_keys_values
from attnx.components.protocols import KeyValueCache
from attnx.errors import ConfigError

__all__ = ["RestrictedSelfAttention"]


class RestrictedSelfAttention(nn.Module):
    """Multi-head attention whose query at position i sees keys j with `|i - j| <= window` only.

    In causal (decoder) use that is `i - window <= j <= i`. Positions are absolute, so incremental decoding
    with a cache gives the same result as the full pass. Built as `cls(d_model, n_heads, window=..., dropout=...)`.
    """

    def __init__(self, d_model: int, n_heads: int, window: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads:
            raise ConfigError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if window < 0:
            raise ConfigError(f"window must be >= 0, got {window}")
        self.n_heads, self.d_k, self.window, self.dropout = n_heads, d_model // n_heads, window, dropout
        self.qkv = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(3))
        self.out = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        *,
        key_mask: Tensor | None = None,
        causal: bool = False,
        cache: KeyValueCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        b, t, d = query.shape
        q_proj, k_proj, v_proj = self.qkv
        q = self._heads(q_proj(query))
        k, v, offset = cached_keys_values(
            cache, lambda: (self._heads(k_proj(key_value)), self._heads(v_proj(key_value)))
        )
        s = k.shape[2]
        q_pos = torch.arange(t, device=query.device).unsqueeze(1) + offset  # (T, 1)
        k_pos = torch.arange(s, device=query.device).unsqueeze(0)  # (1, S)
        distance = q_pos - k_pos
        allowed = distance.abs() <= self.window
        if causal:
            allowed &= distance >= 0
        mask = allowed.view(1, 1, t, s)
        if key_mask is not None:
            mask = mask & key_mask.view(b, 1, 1, s)
        scores = q @ k.transpose(-2, -1) * self.d_k**-0.5  # (B, H, T, S)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        out = F.dropout(weights, self.dropout, self.training) @ v  # (B, H, T, d_k)
        out = self.out(out.transpose(1, 2).reshape(b, t, d))
        return (out, weights) if need_weights else out


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_attention("restricted", RestrictedSelfAttention)
