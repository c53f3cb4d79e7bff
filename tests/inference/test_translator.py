"""``attnx.Translator``: one output per input, same order, whatever the input looks like; the one decoder."""

from __future__ import annotations

import logging

import pytest
import torch

import attnx
from attnx.data.batch import collate
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.search import translate_batch
from attnx.inference.translator import Translator
from tests.inference.test_phrases import FORMS

LONG = " ".join(["A man in a blue shirt is standing on a ladder cleaning windows."] * 30)
LINES = [
    "A man rides a bike.",
    "",
    "   \t ",
    "Ένας άντρας οδηγεί ποδήλατο.",
    "一个男人在骑自行车。",
    "🚲🚲 on the street 🎉",
    LONG,
    "Two dogs play in the snow.",
    "",
]
FAST = SearchConfig(beam=2, max_len_b=6)


@pytest.fixture()
def translator(checkpoint) -> Translator:
    return attnx.load(checkpoint, search=FAST)


def test_translate_keeps_line_count_order_and_blank_lines(translator, caplog):
    with caplog.at_level(logging.WARNING, logger="attnx"):
        got = translator.translate(LINES)
    assert len(got) == len(LINES)
    assert "input 7" in caplog.text and "truncated" in caplog.text  # the long line, with a warning
    for line, translation in zip(LINES, got, strict=True):
        if not line.strip():
            assert translation == ""
        assert "\n" not in translation
    alone = [translator.translate([line])[0] for line in LINES]  # each line on its own: same output
    assert got == alone


def test_translate_ids_is_the_search_of_each_sentence(translator, loaded):
    sources = ["A girl is jumping.", "Two dogs.", "A man rides a bike down a hill."]
    ids = [loaded.tokenizer.encode(s) for s in sources]
    got = translator.translate_ids(ids)
    for x, out in zip(ids, got, strict=True):
        batch = collate([(x, [])])
        assert out == translate_batch(loaded.model, batch.src, batch.src_mask, translator.search)[0]
    assert translator.translate_ids([[]]) == [[]]


def test_search_defaults_are_the_papers_and_capped_by_the_model(checkpoint, loaded):
    translator = attnx.load(checkpoint)
    assert (translator.search.beam, translator.search.alpha, translator.search.max_len_b) == (4, 0.6, 50)
    assert translator.search.max_positions == loaded.config.max_len == translator.max_positions
    greedy = translator.with_search(beam=1)
    assert greedy.search.beam == 1 and greedy.model is translator.model


def test_to_moves_the_model_and_a_string_is_refused(translator):
    assert translator.to("cpu") is translator and translator.device == torch.device("cpu")
    with pytest.raises(TypeError, match="list of lines"):
        translator.translate("A dog runs.")


# --- terminology constraints ---------------------------------------------------------------------------------

DECODED = {"object": {"include": ["Hund"], "exclude": ["Katze"]}, "array": ["Hund", "Ball"], "null": None}
"""The forms of a constraints file's line that the API also takes decoded."""


def spelled(phrase: str) -> str:
    """A phrase as its translation shows it: SentencePiece writes any run of whitespace as one space."""
    return " ".join(phrase.split())


@pytest.mark.parametrize("form", FORMS)
def test_a_line_s_constraints_take_every_form_of_a_constraints_file(translator, form):
    """A string is read as a line of `attnx translate --constraints`; a dict, a list or None as decoded."""
    line, expected = FORMS[form]
    search = translator.with_search(beam=3)
    plain = search.generate(["A dog runs.", "Two men."])
    for value in [line, *([DECODED[form]] if form in DECODED else [])]:
        found = search.generate(["A dog runs.", "Two men."], constraints=[value, None])
        assert found[1][0].text == plain[1][0].text  # a line without constraints decodes as it does alone
        if not expected.include:
            assert found[0][0].text == plain[0][0].text and not found[0][0].unmet
            continue
        assert found[0][0].unmet == []
        assert all(spelled(phrase) in found[0][0].text for phrase in expected.include), found[0][0].text


def test_constraints_may_be_any_iterable_of_one_entry_per_line(translator):
    lines = ["A dog runs.", "Two men."]
    search = translator.with_search(beam=3)
    expected = search.translate(lines, constraints=[["Hund"], None])
    assert search.translate(lines, constraints=(c for c in [["Hund"], None])) == expected
    assert search.translate(lines, constraints=iter([["Hund"], None])) == expected
    for wrong, words in [
        ((c for c in [["Hund"]]), "^1 constraints entries for 2 lines: give one"),
        ("Hund", "^constraints takes one entry .* per line, in a list"),
        ({"include": ["Hund"]}, "^constraints takes one entry"),
        (3, "^constraints must be a list with one entry .* got int"),
    ]:
        with pytest.raises(ConfigError, match=words):
            search.translate(lines, constraints=wrong)


def test_a_blank_line_with_phrases_to_include_reports_them_all_unmet(translator, caplog):
    """Nothing is searched for a blank line: its translation is blank, and its phrases say so."""
    search = translator.with_search(beam=3)
    with caplog.at_level(logging.WARNING, logger="attnx"):
        found = search.generate(
            ["", "A dog.", "  "], constraints=[["Hund", "Ball"], None, {"exclude": ["x"]}]
        )
    assert found[0][0].text == "" and found[0][0].unmet == [0, 1]
    assert found[1][0].unmet is None and found[2][0].unmet is None  # nothing to include: nothing unmet
    warned = [r.getMessage() for r in caplog.records if "phrases to include" in r.getMessage()]
    assert len(warned) == 1 and "1 blank line(s)" in warned[0] and warned[0].endswith("line 1"), warned


def test_the_warning_names_why_each_line_left_phrases_out(translator, caplog):
    """A phrase whose pieces repeat a run of `no_repeat_ngram` pieces is blamed on that setting, not on the
    maximum length; a blank line is said apart. (An engine that meets nothing, so that the words are the test's.)"""
    from attnx.inference.hypothesis import Hypothesis

    class MeetsNothing(Translator):
        search = SearchConfig(beam=3, no_repeat_ngram=1)
        tokenizer, max_positions = translator.tokenizer, translator.max_positions

        def generate_ids(self, ids, prefixes=None, progress=False, scores=True, constraints=None):
            return [[Hypothesis([], 0.0, 0.0, unmet=list(range(len(c.include))))] for c in constraints]

    lines = ["A dog.", "A cat.", ""]
    with caplog.at_level(logging.WARNING, logger="attnx"):
        MeetsNothing().generate(lines, constraints=[["Hund"], ["Katze Katze"], ["Ball"]])
    warned = [r.getMessage() for r in caplog.records if "to include" in r.getMessage()]
    assert len(warned) == 3, warned
    assert warned[0].startswith("1 blank line(s)") and warned[0].endswith("line 3")
    assert "search.no_repeat_ngram 1 forbids" in warned[1] and warned[1].endswith("line 2")
    assert "maximum output length" in warned[2] and warned[2].endswith("line 1")
