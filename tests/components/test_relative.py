"""T5's bucketed relative position bias (Raffel et al. 2020) against its bucket rule computed one pair at a time."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.components.relative import T5RelativeBias, relative_buckets
from attnx.errors import ConfigError


def t5_bucket(relative: int, bidirectional: bool, buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's `_relative_position_bucket`, for one key-minus-query distance, in plain Python."""
    n = -relative  # T5 writes it query minus key
    ret = 0
    if bidirectional:
        buckets //= 2
        ret += buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = buckets // 2
    if n < exact:
        return ret + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact))
    return ret + min(large, buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 20)])
def test_buckets_follow_t5s_rule_for_every_distance(bidirectional, buckets, max_distance):
    relative = torch.arange(-300, 301)
    got = relative_buckets(relative, bidirectional, buckets, max_distance)
    expected = [t5_bucket(int(r), bidirectional, buckets, max_distance) for r in relative]
    assert got.tolist() == expected
    assert int(got.max()) == buckets - 1


def test_bias_is_the_learned_scalar_of_each_heads_bucket():
    bias = T5RelativeBias(3, 64, buckets=8, max_distance=20).double()
    with torch.no_grad():
        bias.bias.weight.copy_(torch.randn(8, 3, dtype=torch.float64))
    for causal in (False, True):
        out = bias(4, 9, 5, causal)  # queries at 5..8, keys at 0..8
        assert out.shape == (3, 4, 9)
        for i in range(4):
            for j in range(9):
                bucket = t5_bucket(j - (5 + i), not causal, 8, 20)
                torch.testing.assert_close(out[:, i, j], bias.bias.weight[bucket])


def test_unidirectional_buckets_keep_later_keys_in_the_nearest_bucket():
    bias = T5RelativeBias(2, 64)
    bucket = relative_buckets(torch.tensor([3, 1, 0, -1]), False, 32, 128)
    assert bucket.tolist() == [0, 0, 0, 1]
    assert (bias(3, 3, 0, False) == 0).all()  # starts at zero: no position preferred
    with pytest.raises(ValueError, match="max_distance"):
        T5RelativeBias(2, 64, buckets=32, max_distance=16)


@pytest.mark.parametrize(("buckets", "max_distance"), [(32.0, 128), (32, 128.0), (2, 128), (True, 128)])
def test_buckets_and_distances_that_are_not_integers_in_range_are_one_line(buckets, max_distance):
    with pytest.raises(ConfigError, match=r"^relative bias needs integers buckets >= 4 and max_distance > "):
        T5RelativeBias(2, 64, buckets=buckets, max_distance=max_distance)
