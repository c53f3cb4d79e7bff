"""§3.2 Scaled dot-product and multi-head attention against a plain float64 computation."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.components.attention import MultiHeadAttention
from attnx.components.protocols import AttentionCache
from tests.model.reference import attention as reference_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_multihead_matches_reference(causal, padded):
    attn = MultiHeadAttention(32, 4).double().eval()
    p = {f"m.{k}": v for k, v in attn.state_dict().items()}
    q = torch.randn(2, 5, 32, dtype=torch.float64)
    kv = q if causal else torch.randn(2, 5, 32, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]) if padded else None
    out = attn(q, kv, key_mask=key_mask, causal=causal)
    for b in range(2):
        allowed = torch.ones(5, 5, dtype=torch.bool)
        if causal:
            allowed = torch.tril(allowed)
        if padded:
            allowed = allowed & key_mask[b]
        expected = reference_attention(q[b], kv[b], p, "m", 4, allowed)
        torch.testing.assert_close(out[b], expected, rtol=1e-10, atol=1e-10)


def test_weights_path_equals_fused_path_and_rows_sum_to_one():
    attn = MultiHeadAttention(32, 4).eval()
    q, kv = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    key_mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    fused = attn(q, kv, key_mask=key_mask)
    explicit, weights = attn(q, kv, key_mask=key_mask, need_weights=True)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    assert weights.shape == (2, 4, 4, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 4))
    assert weights[1, :, :, 2:].abs().max() == 0


def test_scaled_by_sqrt_dk():
    """One head, identity projections: the output is softmax(q k^T / sqrt(d_k)) v exactly."""
    attn = MultiHeadAttention(4, 1, bias=False).double()
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        proj.weight.data = torch.eye(4, dtype=torch.float64)
    q, k = torch.randn(1, 2, 4, dtype=torch.float64), torch.randn(1, 3, 4, dtype=torch.float64)
    expected = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(4), -1) @ k
    torch.testing.assert_close(attn(q, k), expected)


def test_self_attention_cache_grows_and_static_cache_is_reused():
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    full = attn(x, x, causal=True)
    cache = AttentionCache()
    steps = [attn(x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache) for i in range(5)]
    assert cache.length == 5
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    memory = torch.randn(2, 7, 32)
    static = AttentionCache(static=True)
    first = attn(x[:, :1], memory, cache=static)
    # A static cache is not recomputed: a different memory is ignored once the cache is filled.
    again = attn(x[:, :1], torch.zeros_like(memory), cache=static)
    torch.testing.assert_close(first, again)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match=r"d_model \(30\) must be divisible by the number of heads \(4\)"):
        MultiHeadAttention(30, 4)


def test_key_and_value_sizes_can_differ_from_d_model_over_heads():
    """Table 3 (B): d_k reduced with h and d_model fixed; the output keeps d_model."""
    attn = MultiHeadAttention(32, 4, d_k=3, d_v=5)
    assert (
        attn.q_proj.out_features == 12 and attn.v_proj.out_features == 20 and attn.out_proj.in_features == 20
    )
    x = torch.randn(2, 4, 32)
    assert attn(x, x, causal=True).shape == (2, 4, 32)
    assert attn(x, x, need_weights=True)[1].shape == (2, 4, 4, 4)
