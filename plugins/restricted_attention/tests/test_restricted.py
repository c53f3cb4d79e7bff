"""The plugin's own tests: the window is honoured, and the cache gives the full-pass result."""

from __future__ import annotations

import torch

from attnx.model.cache import AttentionCache
from attnx_restricted import RestrictedSelfAttention


def test_positions_outside_the_window_are_not_seen():
    attn = RestrictedSelfAttention(16, 2, window=2).eval()
    x = torch.randn(1, 10, 16)
    before = attn(x, x)
    far = x.clone()
    far[:, 8:] = torch.randn(1, 2, 16)  # more than 2 positions away from 0..5
    torch.testing.assert_close(attn(far, far)[:, :6], before[:, :6])
    assert not torch.allclose(attn(far, far)[:, 6:], before[:, 6:])


def test_window_covering_everything_is_full_attention_weights():
    attn = RestrictedSelfAttention(16, 2, window=100).eval()
    x = torch.randn(1, 5, 16)
    _, weights = attn(x, x, need_weights=True)
    assert (weights > 0).all()


def test_incremental_decoding_with_cache_equals_full_pass():
    attn = RestrictedSelfAttention(16, 2, window=3).eval()
    x = torch.randn(2, 7, 16)
    full = attn(x, x, causal=True)
    cache = AttentionCache()
    steps = torch.cat([attn(x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache) for i in range(7)], 1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
