"""§6.1's length rules: the GNMT (and fairseq) length penalty, and the maximum output length."""

from __future__ import annotations

import pytest
import torch

from attnx.inference.lengths import length_penalty, max_output_length, max_output_lengths


def test_length_penalty_is_the_gnmt_form_of_the_paper():
    # ((5 + |Y|) / 6) ** 0.6, computed by hand
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2**0.6) == pytest.approx(1.515716566510398)
    assert length_penalty(10, 0.6) == pytest.approx(1.7328621)  # 2.5 ** 0.6
    assert length_penalty(25, 0.6) == pytest.approx(5**0.6)
    assert length_penalty(10, 0.6, "fairseq") == pytest.approx(3.9810717)  # 10 ** 0.6
    assert length_penalty(10, 0.0) == 1.0
    with pytest.raises(ValueError, match="gnmt"):
        length_penalty(3, 0.6, "wu")


def test_length_penalty_takes_a_tensor_of_lengths():
    lengths = torch.tensor([1.0, 7.0, 10.0])
    torch.testing.assert_close(length_penalty(lengths, 0.6), torch.tensor([1.0, 2**0.6, 2.5**0.6]))
    torch.testing.assert_close(length_penalty(lengths, 0.6, "fairseq"), lengths**0.6)


def test_maximum_output_length_is_the_floor_of_a_times_input_plus_b_capped_by_the_model():
    assert max_output_length(11, 1.0, 50) == 61  # the paper: input length + 50
    assert max_output_length(7, 0.5, 6) == 9  # floor(3.5 + 6)
    assert max_output_length(7, 1.2, 0) == 8  # floor(8.4)
    assert max_output_length(5, 0.0, 3) == 3
    assert max_output_length(200, 1.0, 50, max_positions=128) == 127  # L tokens and </s> fit 128 positions
    assert max_output_length(200, 1.0, 50, max_positions=1000) == 250
    assert max_output_length(3, 0.0, -10) == 0  # never below zero
    assert isinstance(max_output_length(200, 1.0, 50, max_positions=128), int)


def test_maximum_output_lengths_count_the_real_source_positions_of_each_row():
    src_mask = torch.tensor([[True] * 4 + [False] * 3, [True] * 7, [True] + [False] * 6])
    lengths = max_output_lengths(src_mask, 0.5, 6)  # 4, 7 and 1 real positions, the source </s> included
    assert lengths.dtype == torch.long and lengths.tolist() == [8, 9, 6]
    assert max_output_lengths(src_mask, 0.5, 6, max_positions=9).tolist() == [8, 8, 6]
