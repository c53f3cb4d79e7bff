"""`SearchConfig`: every option checked once, with one line naming it."""

from __future__ import annotations

import dataclasses

import pytest

from attnx.inference.config import PAPER_SEARCH, SearchConfig


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"beam": 0}, "search.beam must be at least 1, got 0"),
        ({"nbest": 0}, "search.nbest must be at least 1"),
        ({"beam": 2, "nbest": 3}, "search.nbest (3) cannot exceed search.beam (2)"),
        ({"sampling": True, "top_p": 0.0}, "search.top_p must be in (0, 1]"),
        ({"sampling": True, "top_p": 1.5}, "search.top_p must be in (0, 1]"),
        ({"sampling": True, "temperature": 0.0}, "search.temperature must be > 0"),
        ({"sampling": True, "top_k": -1}, "search.top_k must be >= 0"),
        ({"no_repeat_ngram": -2}, "search.no_repeat_ngram must be >= 0"),
        ({"min_length": -1}, "search.min_length must be >= 0"),
        ({"length_penalty": "wu"}, "search.length_penalty must be 'gnmt' or 'fairseq'"),
        ({"top_k": 5}, "search.top_k=5 only shape sampling: add --search.sampling true"),
        ({"temperature": 0.7, "seed": 3}, "search.temperature=0.7, search.seed=3 only shape sampling"),
        ({"sampling": True, "epsilon": 1.0}, "search.epsilon must be in [0, 1)"),
        ({"epsilon": 0.02}, "search.epsilon=0.02 only shape sampling"),
        ({"mbr": 1}, "search.mbr must be 0 (off) or at least 2 candidates"),
        ({"mbr": 8, "nbest": 2, "beam": 2}, "search.nbest (2) does not apply to MBR"),
        ({"mbr": 8, "mbr_utility": "comet"}, "search.mbr_utility must be 'chrf' or 'bleu'"),
        (
            {"mbr": 8, "mbr_candidates": "beam"},
            "search.mbr_candidates must be 'sample', 'epsilon' or 'nbest'",
        ),
        ({"mbr": 8, "mbr_candidates": "epsilon"}, "search.mbr_candidates epsilon needs --search.epsilon > 0"),
        ({"mbr": 8, "mbr_candidates": "nbest"}, "raise --search.beam to at least 8"),
        ({"mbr": 4, "mbr_candidates": "nbest", "top_k": 3}, "search.top_k=3 only shape sampling"),
        ({"mbr": 4, "mbr_candidates": "nbest", "sampling": True}, "leave out search.sampling"),
        ({"mbr_utility": "bleu"}, "search.mbr_utility=bleu only apply to MBR: add --search.mbr N"),
    ],
)
def test_bad_settings_are_one_line_naming_the_option(changes, message):
    with pytest.raises(ValueError) as err:
        SearchConfig(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="search"):  # replace checks as well
        dataclasses.replace(PAPER_SEARCH, **changes)


def test_sampling_draws_nbest_samples_whatever_the_beam():
    config = SearchConfig(sampling=True, nbest=8, beam=2, top_k=10, top_p=0.9, temperature=0.8, seed=1)
    assert config.width == 8
    assert SearchConfig(beam=5, nbest=3).width == 5
    assert (PAPER_SEARCH.beam, PAPER_SEARCH.nbest, PAPER_SEARCH.sampling) == (4, 1, False)


def test_mbr_by_sampling_takes_the_sampling_options_without_sampling_true():
    config = SearchConfig(mbr=16, mbr_candidates="epsilon", epsilon=0.02, temperature=0.9, seed=2)
    assert config.samples and not config.sampling
    assert not SearchConfig(mbr=4, beam=4, mbr_candidates="nbest").samples
