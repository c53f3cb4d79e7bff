"""What every attention component shares: the mask from padding and causality (queries after cached keys
included), and keys and values through the decoding cache."""

from __future__ import annotations

import torch

from attnx.components.masking import attention_mask, cached_keys_values
from attnx.model.cache import AttentionCache

CPU = torch.device("cpu")


def test_no_padding_and_no_causality_is_no_mask():
    assert attention_mask(None, False, 3, 5, 0, CPU) is None


def test_causal_queries_see_their_own_and_earlier_positions():
    mask = attention_mask(None, True, 3, 3, 0, CPU)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_queries_after_cached_keys_sit_at_their_offset():
    mask = attention_mask(None, True, 2, 5, 3, CPU)  # 3 keys cached, 2 new queries at positions 3 and 4
    assert mask[0, 0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_padding_hides_keys_of_each_row_and_combines_with_causality():
    key_mask = torch.tensor([[True, True, True], [True, True, False]])
    padded = attention_mask(key_mask, False, 2, 3, 0, CPU)
    assert padded.shape == (2, 1, 1, 3)  # broadcast over heads and queries, never expanded
    assert padded[:, 0, 0].tolist() == key_mask.tolist()
    both = attention_mask(key_mask, True, 3, 3, 0, CPU)
    assert both.shape == (2, 1, 3, 3)
    assert both[1, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]


def test_keys_and_values_without_a_cache_are_the_projection_at_offset_zero():
    k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    got_k, got_v, offset = cached_keys_values(None, lambda: (k, v))
    assert got_k is k and got_v is v and offset == 0


def test_with_a_cache_the_cache_decides():
    cache = AttentionCache()
    block = torch.randn(1, 2, 1, 8)
    cached_keys_values(cache, lambda: (block, block))
    k, _, offset = cached_keys_values(cache, lambda: (block + 1, block + 1))
    assert offset == 1 and k.shape == (1, 2, 2, 8)
    torch.testing.assert_close(k[:, :, 1:], block + 1)


def test_a_score_bias_joins_the_mask_as_one_float_mask_minus_infinity_where_forbidden():
    from attnx.components.masking import additive_mask

    bias = torch.randn(2, 3, 4)  # (H, T, S)
    mask = attention_mask(torch.tensor([[True, True, True, False]]), True, 3, 4, 1, torch.device("cpu"))
    out = additive_mask(bias, mask, torch.float64)
    assert out.shape == (1, 2, 3, 4) and out.dtype == torch.float64
    torch.testing.assert_close(out[0][mask[0].expand(2, 3, 4)], bias.double()[mask[0].expand(2, 3, 4)])
    assert bool((out[0][~mask[0].expand(2, 3, 4)] == float("-inf")).all())
    torch.testing.assert_close(additive_mask(bias, None, torch.float32), bias.unsqueeze(0))


def test_positions_are_applied_only_where_they_act():
    from attnx.components.masking import cache_offset, positioned_queries_keys, score_bias
    from attnx.model.cache import AttentionCache

    class Shift(torch.nn.Module):
        acts_on = "queries_keys"

        def forward(self, x, offset=0):
            return x + offset

    q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 1, 3, 4)
    assert positioned_queries_keys(None, q, k, 5) == (q, k)
    turned = positioned_queries_keys(Shift(), q, k, 5)
    assert bool((turned[0] == 5).all()) and bool((turned[1] == 5).all())
    assert score_bias(Shift(), 3, 3, 0, False) is None and score_bias(None, 3, 3, 0, False) is None
    cache = AttentionCache(k=torch.zeros(1, 1, 6, 4), v=torch.zeros(1, 1, 6, 4))
    assert cache_offset(None) == 0 and cache_offset(cache) == 6
    assert cache_offset(AttentionCache(static=True, k=cache.k, v=cache.v)) == 0
