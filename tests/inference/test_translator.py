"""``attnx.Translator``: one output per input, same order, whatever the input looks like; the one decoder."""

from __future__ import annotations

import logging

import pytest
import torch

import attnx
from attnx.data.batch import collate
from attnx.inference.config import SearchConfig
from attnx.inference.search import translate_batch
from attnx.inference.translator import Translator

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
