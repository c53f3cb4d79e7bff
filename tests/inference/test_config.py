"""`SearchConfig`: every option checked once, with one line naming it."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from attnx.inference.config import PAPER_SEARCH, SearchConfig, changed_search, layered_search
from attnx.inference.translator import fitted_search


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"beam": 0}, "search.beam must be at least 1, got 0"),
        ({"nbest": 0}, "search.nbest must be at least 1"),
        ({"beam": 2, "nbest": 3}, "search.nbest (3) cannot exceed search.beam (2)"),
        ({"sampling": True, "top_p": 0.0}, "search.top_p must be in (0, 1]"),
        ({"sampling": True, "top_p": 1.5}, "search.top_p must be in (0, 1]"),
        ({"sampling": True, "temperature": 0.0}, "search.temperature must be from 0.001 to 1000, got 0"),
        # values that reached the search and raised there (index out of bounds, OverflowError)
        (
            {"sampling": True, "temperature": 1e-300},
            "search.temperature must be from 0.001 to 1000, got 1e-300",
        ),
        (
            {"sampling": True, "temperature": 1e300},
            "search.temperature must be from 0.001 to 1000, got 1e+300",
        ),
        ({"sampling": True, "temperature": float("nan")}, "search.temperature must be from 0.001 to 1000"),
        ({"alpha": 1e308}, "search.alpha must be from -5 to 5, got 1e+308"),
        ({"alpha": float("nan")}, "search.alpha must be from -5 to 5, got nan"),
        ({"alpha": -float("inf")}, "search.alpha must be from -5 to 5, got -inf"),
        ({"max_len_a": float("inf")}, "search.max_len_a must be a finite number >= 0, got inf"),
        ({"max_positions": 0}, "search.max_positions must be at least 1"),
        ({"sampling": True, "seed": 2**80}, "search.seed must be from 0 to 2**64 - 1 = 18446744073709551615"),
        ({"sampling": True, "seed": -1}, "search.seed must be from 0 to 2**64 - 1"),
        # types, as the Python API or a serve request can give them (jsonargparse checks the command line's)
        ({"beam": 2.5}, "search.beam must be an integer, got 2.5 (a number)"),
        ({"nbest": "4"}, "search.nbest must be an integer, got '4' (a string)"),
        ({"sampling": 1}, "search.sampling must be a boolean, got 1 (an integer)"),
        ({"alpha": True}, "search.alpha must be a number, got True (a boolean)"),
        ({"sampling": True, "seed": 1.5}, "search.seed must be an integer or null, got 1.5"),
        ({"sampling": True, "top_k": -1}, "search.top_k must be >= 0"),
        ({"no_repeat_ngram": -2}, "search.no_repeat_ngram must be >= 0"),
        ({"min_length": -1}, "search.min_length must be >= 0"),
        ({"length_penalty": "wu"}, "search.length_penalty must be 'gnmt' or 'fairseq'"),
        ({"top_k": 5}, "search.top_k=5 only shape sampling: add --search.sampling true"),
        ({"temperature": 0.7, "seed": 3}, "search.temperature=0.7, search.seed=3 only shape sampling"),
        ({"sampling": True, "epsilon": 1.0}, "search.epsilon must be in [0, 1)"),
        ({"epsilon": 0.02}, "search.epsilon=0.02 only shape sampling"),
        ({"mbr": 1}, "search.mbr must be 0 (off) or at least 2 candidates"),
        ({"mbr": 8, "nbest": 2}, "search.nbest (2) does not apply to MBR"),
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


def test_a_refusal_names_the_setting_to_change_as_its_reader_sets_it():
    """The command line's wording by default; an interface that sets the beam otherwise (a server's request)
    names its own field, and the error survives pickling (a worker process's answer) with its parts."""
    import pickle

    from attnx.inference.config import SearchSettingError, worded

    with pytest.raises(SearchSettingError) as err:
        SearchConfig(beam=2, nbest=3)
    assert str(err.value).endswith("raise --search.beam to at least 3")
    assert worded(err.value, lambda name: f"the {name} field").endswith("raise the beam field to at least 3")
    assert worded(ValueError("as it is"), lambda name: name) == "as it is"
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.worded(str.upper).endswith("raise BEAM to at least 3")
    with pytest.raises(ValueError) as other:  # any other refusal: every --search.X it names
        SearchConfig(top_k=5)
    assert "--search.sampling true" in str(other.value)
    assert "the sampling field true" in worded(other.value, lambda name: f"the {name} field")
    assert "--search." not in worded(other.value, lambda name: f"the {name} field")


def test_sampling_draws_nbest_samples_and_leaves_the_beam_at_its_default():
    config = SearchConfig(sampling=True, nbest=8, top_k=10, top_p=0.9, temperature=0.8, seed=1)
    assert config.width == 8 and config.beam == 4
    assert SearchConfig(beam=5, nbest=3).width == 5
    assert (PAPER_SEARCH.beam, PAPER_SEARCH.nbest, PAPER_SEARCH.sampling) == (4, 1, False)


def test_mbr_by_sampling_takes_the_sampling_options_without_sampling_true():
    config = SearchConfig(mbr=16, mbr_candidates="epsilon", epsilon=0.02, temperature=0.9, seed=2)
    assert config.samples and not config.sampling
    assert not SearchConfig(mbr=4, beam=4, mbr_candidates="nbest").samples


def test_the_edges_of_every_range_are_accepted():
    SearchConfig(alpha=-5, length_penalty="fairseq")
    SearchConfig(alpha=5.0)
    SearchConfig(alpha=1)  # an integer is a number
    SearchConfig(sampling=True, temperature=0.001, seed=0)
    SearchConfig(sampling=True, temperature=1000, seed=2**64 - 1)
    SearchConfig(mbr=4, beam=4, mbr_candidates="nbest")  # the n-best list of a beam: the beam is used


def test_changes_that_sample_leave_the_beam_behind_unless_they_name_one():
    beam2 = SearchConfig(beam=2)
    assert changed_search(beam2, sampling=True, nbest=3) == SearchConfig(sampling=True, nbest=3)
    assert changed_search(beam2, mbr=8, seed=1) == SearchConfig(mbr=8, seed=1)
    assert changed_search(beam2, nbest=2) == SearchConfig(beam=2, nbest=2)
    assert changed_search(beam2, mbr=2, mbr_candidates="nbest") == SearchConfig(
        beam=2, mbr=2, mbr_candidates="nbest"
    )
    with pytest.raises(ValueError, match=r"search.beam \(2\) is not used by sampling"):
        changed_search(beam2, sampling=True, beam=2)
    with pytest.raises(ValueError, match=r"search.beam \(2\) is not used by MBR over sampled candidates"):
        changed_search(SearchConfig(), mbr=8, beam=2)


def test_settings_given_over_a_models_own_are_checked_once_layered():
    """A command line's `--search.*` over an export's stored settings (beam 5, `|Y|^alpha`): the stored ones
    stay unless named, `nbest 5` fits the stored beam, a search that samples leaves the beam behind, and a beam
    named beside sampling is left for the translator to say (as over SearchConfig's defaults)."""
    stored = SearchConfig(beam=5, length_penalty="fairseq", max_len_b=20)
    assert layered_search(stored, {"nbest": 5}) == dataclasses.replace(stored, nbest=5)
    assert layered_search(stored, {"beam": 2}).length_penalty == "fairseq"
    assert layered_search(stored, {"sampling": True, "seed": 3}) == SearchConfig(
        length_penalty="fairseq", max_len_b=20, sampling=True, seed=3
    )
    assert layered_search(stored, {"sampling": True, "beam": 8}).beam == 8
    assert layered_search(stored, {}) == stored
    with pytest.raises(ValueError, match=r"search.nbest \(6\) cannot exceed search.beam \(5\)"):
        layered_search(stored, {"nbest": 6})


def test_a_beam_beside_sampling_is_said_in_one_line_and_the_search_samples(caplog):
    """A config's beam (for beam search) beside `sampling` given on the command line: sampling uses no beam;
    the translator says so once and samples, rather than refusing the config file's own beam."""
    with caplog.at_level(logging.WARNING, logger="attnx"):
        assert fitted_search(SearchConfig(sampling=True, beam=8), 64).beam == 8
        fitted_search(SearchConfig(sampling=True), 64)  # the default beam: nothing to say
    (record,) = caplog.records
    assert record.getMessage().startswith("search.beam (8) is not used by sampling, which draws search.nbest")
    assert "for 8 samples give --search.nbest 8" in record.getMessage()
    assert SearchConfig(mbr=8, beam=2).unused_beam().startswith("search.beam (2) is not used by MBR")
    assert SearchConfig(mbr=2, beam=2, mbr_candidates="nbest").unused_beam() is None


def test_sampling_alone_says_it_draws_one_sample_where_fairseq_draws_beam_many():
    """`--sampling` at the default beam: fairseq draws --beam samples; attnx draws search.nbest (1)."""
    drawn = SearchConfig(sampling=True).samples_drawn()
    assert (
        drawn.startswith("sampling draws 1 sample per input (search.nbest)") and "--search.nbest N" in drawn
    )
    assert SearchConfig(sampling=True, nbest=2).samples_drawn() is None
    assert SearchConfig().samples_drawn() is None and SearchConfig(mbr=4).samples_drawn() is None
