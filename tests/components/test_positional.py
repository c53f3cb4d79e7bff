"""§3.5 Positional encodings."""

from __future__ import annotations

import math

import torch

from attnx.components.positional import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoid_table,
)


def test_sinusoid_table_matches_the_formula():
    table = sinusoid_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-12)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-12)


def test_sinusoids_are_added_at_the_offset_and_not_saved():
    pe = SinusoidalPositionalEncoding(16, 50)
    x = torch.randn(2, 4, 16)
    torch.testing.assert_close(pe(x, offset=3) - x, sinusoid_table(50, 16)[3:7].float().expand(2, 4, 16))
    assert pe.state_dict() == {}


def test_learned_positions_are_parameters():
    pe = LearnedPositionalEncoding(16, 50)
    x = torch.zeros(1, 3, 16)
    torch.testing.assert_close(pe(x, offset=2)[0], pe.embedding.weight[2:5])
    assert sum(p.numel() for p in pe.parameters()) == 50 * 16
