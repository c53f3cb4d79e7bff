"""Rotary positions (RoFormer, Su et al. 2021) against the paper's rotation matrix, written out."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.components.rotary import RotaryPositionalEncoding


def rotation_matrix(m: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """RoFormer eq. 15: block-diagonal `R^d_{Θ,m}` of 2x2 rotations by `m θ_i`, `θ_i = base^(-2(i-1)/d)`."""
    r = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        angle = m * base ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, -s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = s, c
    return r


@pytest.mark.parametrize("offset", [0, 7])
def test_each_position_is_the_papers_rotation_matrix_times_the_vector(offset):
    rope = RotaryPositionalEncoding(8, 64)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # (B, H, T, d_k)
    out = rope(x, offset)
    for t in range(5):
        expected = x[:, :, t] @ rotation_matrix(offset + t, 8).T
        torch.testing.assert_close(out[:, :, t], expected, rtol=1e-12, atol=1e-12)


def test_query_key_products_depend_on_the_relative_position_alone():
    """RoFormer eq. 16: `(R_m q)^T (R_n k) = q^T R_{n-m} k`."""
    rope = RotaryPositionalEncoding(16, 64)
    q, k = torch.randn(2, 1, 1, 16, dtype=torch.float64).unbind(0)
    score = lambda m, n: float((rope(q, m) * rope(k, n)).sum())  # noqa: E731
    assert score(3, 1) == pytest.approx(score(12, 10), abs=1e-12)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-6)


def test_partial_rotary_turns_the_first_dim_features_and_keeps_the_rest():
    rope = RotaryPositionalEncoding(8, 64, dim=4, base=500.0)
    x = torch.randn(1, 1, 3, 8, dtype=torch.float64)
    out = rope(x, 2)
    torch.testing.assert_close(out[..., 4:], x[..., 4:])
    for t in range(3):
        expected = x[0, 0, t, :4] @ rotation_matrix(2 + t, 4, base=500.0).T
        torch.testing.assert_close(out[0, 0, t, :4], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"dim": 3}, "must be even"),
        ({"dim": 10}, "at most"),
        ({"dim": 4.0}, r"rotary dim \(4\.0\) must be even, positive, an integer"),
        ({"base": 1.0}, "base"),
        # NaN passed `base <= 1` and turned every angle into NaN: a run reported as diverged
        (
            {"base": float("nan")},
            r"^rotary base must be a finite number > 1 \(the paper's is 10000\), got nan$",
        ),
        ({"base": float("inf")}, r"^rotary base must be a finite number > 1 .*, got inf$"),
        ({"base": "10000"}, r"^rotary base must be a finite number > 1 .*, got '10000'$"),
    ],
)
def test_an_impossible_rotary_is_one_line_naming_the_value(args, message):
    with pytest.raises(ValueError, match=message):
        RotaryPositionalEncoding(8, 64, **args)


def test_bf16_queries_are_turned_in_fp32_and_cast_back():
    rope = RotaryPositionalEncoding(8, 64)
    x = torch.randn(1, 1, 4, 8)
    out = rope(x.bfloat16(), 500)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, rope(x.bfloat16().float(), 500).bfloat16(), rtol=0, atol=0)
