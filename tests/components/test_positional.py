"""§3.5 Positional encodings, and the sinusoid tables of Marian and fairseq against transformers' own."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.components.positional import (
    FairseqSinusoidalPositionalEncoding,
    FixedPositionalEncoding,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    fairseq_sinusoid_table,
    sines_first_table,
    sinusoid_table,
)
from attnx.errors import ConfigError
from attnx.plugins import registry
from attnx.registry import Kind


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


def test_marian_layout_is_the_paper_s_table_with_the_sines_first():
    table, marian = sinusoid_table(50, 16), sines_first_table(50, 16)
    torch.testing.assert_close(marian[:, :8], table[:, 0::2], rtol=0, atol=0)
    torch.testing.assert_close(marian[:, 8:], table[:, 1::2], rtol=0, atol=0)
    odd = sines_first_table(10, 7)  # ceil(D/2) sines, as Marian's `sentinel`
    torch.testing.assert_close(odd[:, :4], sinusoid_table(10, 7)[:, 0::2], rtol=0, atol=0)


def test_fairseq_table_matches_its_formula_from_position_padding_idx_plus_one():
    table = fairseq_sinusoid_table(50, 16, padding_idx=1)
    step = math.log(10000) / 7
    for t in (0, 1, 30, 49):
        for i in range(8):
            angle = (t + 2) * math.exp(-i * step)
            assert math.isclose(table[t, i].item(), math.sin(angle), abs_tol=1e-5)
            assert math.isclose(table[t, 8 + i].item(), math.cos(angle), abs_tol=1e-5)
    assert (fairseq_sinusoid_table(5, 9)[:, 8] == 0).all()  # an odd width ends with a feature of zeros
    torch.testing.assert_close(fairseq_sinusoid_table(5, 16, padding_idx=0)[1:], table[:4], rtol=0, atol=0)


@pytest.mark.parametrize("d_model", [16, 15])
def test_marian_positions_equal_transformers_marian_embedding(d_model):
    """`MarianSinusoidalPositionalEmbedding` from position 0, in one pass or one step at a cache length."""
    marian_module = pytest.importorskip("transformers.models.marian.modeling_marian")
    theirs = marian_module.MarianSinusoidalPositionalEmbedding(64, d_model)
    with torch.no_grad():
        theirs.weight.copy_(theirs.create_weight())  # what the model's weight initialization does
    ours = registry().build(Kind.POSITIONAL, "marian_sinusoidal", d_model, 64)
    x = torch.zeros(2, 9, d_model)
    full = float((ours(x) - theirs(x.shape[:2])).abs().max())
    step = float((ours(x[:, :1], offset=9) - theirs((2, 1), cache_length=9)).abs().max())
    print(f"marian_sinusoidal D={d_model}: max |Δ| {full:.1e} (9 positions), {step:.1e} (step at 9)")
    assert full <= 1e-6 and step <= 1e-6
    assert ours.state_dict() == {}


@pytest.mark.parametrize("d_model", [16, 15])
def test_fairseq_positions_equal_transformers_m2m100_embedding(d_model):
    """`M2M100SinusoidalPositionalEmbedding` on right-padded ids: token `t` at position `t + padding_idx + 1`;
    a decoding step at cache length `k` gets the row of position `k` of the full pass."""
    m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    padding_idx = 1
    theirs = m2m.M2M100SinusoidalPositionalEmbedding(64, d_model, padding_idx)
    ours = registry().build(Kind.POSITIONAL, "fairseq_sinusoidal", d_model, 64, padding_idx=padding_idx)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, padding_idx, padding_idx, padding_idx]])
    real = ids != padding_idx
    x = torch.zeros(2, 6, d_model)
    full = float((ours(x) - theirs(ids))[real].abs().max())
    step = float((ours(x[:, :1], offset=4) - theirs(ids[:1, :1], cache_length=4)).abs().max())
    print(f"fairseq_sinusoidal D={d_model}: max |Δ| {full:.1e} (real tokens), {step:.1e} (step at 4)")
    assert full <= 1e-6 and step <= 1e-6
    assert ours.state_dict() == {}


def test_fairseq_positions_refuse_a_width_without_two_frequencies_or_a_negative_padding_idx():
    with pytest.raises(
        ConfigError, match=r"^fairseq_sinusoidal needs d_model >= 4 \(two frequencies at least\), got 3$"
    ):
        FairseqSinusoidalPositionalEncoding(3, 10)
    with pytest.raises(ConfigError, match=r"^padding_idx must be an integer >= 0 .*got -1$"):
        FairseqSinusoidalPositionalEncoding(16, 10, padding_idx=-1)


@pytest.mark.parametrize("name", ["sinusoidal", "marian_sinusoidal", "fairseq_sinusoidal"])
def test_every_fixed_table_refuses_positions_past_max_len_in_one_line(name):
    pe = registry().build(Kind.POSITIONAL, name, 8, 4)
    assert isinstance(pe, FixedPositionalEncoding) and pe.table.shape == (4, 8)
    with pytest.raises(
        ConfigError, match=r"^sequence position 5 exceeds max_len 4; raise the model's max_len$"
    ):
        pe(torch.zeros(1, 2, 8), offset=3)
