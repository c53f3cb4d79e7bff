"""A batch's phrases as tensors: the automata agree with the detokenized text however the output is segmented
(letter by letter, BPE-dropout, the model's own pieces), whole words and sub-words, several phrases of
different lengths in one table, `<unk>` (which the detokenizer drops) spelling nothing."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from attnx.data.batch import EOS_ID
from attnx.data.corpus import PreparedCorpus
from attnx.data.dropout import MergeTable
from attnx.data.tokenizer import Tokenizer
from attnx.inference.lexical import PhraseIds, compile_phrases
from attnx.inference.term_tables import TermTables
from attnx.inference.terms import Vocabulary, normalized, surface_contains, vocabulary


@pytest.fixture(scope="module")
def tok(corpus: Path) -> Tokenizer:
    return PreparedCorpus(corpus).tokenizer


def events(tables: TermTables, ids: list[int]) -> list[int]:
    """How many times each phrase of one sentence's tables is completed by writing `ids` then `</s>`."""
    sent = torch.tensor([0])
    state = tables.start(1)
    total = torch.zeros_like(state)
    for token in [*ids, EOS_ID]:
        state, hit = tables.advance(state, torch.tensor([[token]]), sent)
        state, total = state.squeeze(1), total + hit.squeeze(1)
    return total[0, : int((tables.lengths[0] > 0).sum())].tolist()


WORDS = [
    "Mann",
    "Männer",
    "Manns",
    "(Mann)",
    "[Mann]",
    "„Mann“",
    "Mann.",
    "Frau",
    "ein",
    "Ein",
    "Mann-Frau",
    "aMann",
]
WORDS += ["in", "im", "a", "aa", "der", "Hund", "New", "York", "Yorker"]


@pytest.mark.parametrize("whole_words", [True, False])
def test_the_automaton_counts_what_the_detokenized_text_holds_however_it_is_segmented(
    tok, whole_words
) -> None:
    vocab, merges = vocabulary(tok), MergeTable(tok.sp)
    phrases = ["Mann", "ein Mann", "aa", "Mann.", "New York", "Mann-Frau"]
    terms = [[vocab.term(normalized(tok, p), whole_words) for p in phrases]]
    tables = TermTables(vocab, terms, "cpu")
    rng, pick = np.random.default_rng(0), random.Random(0)
    for _ in range(200):
        text = " ".join(pick.choice(WORDS) for _ in range(pick.randint(1, 8)))
        ids = merges.sample(tok.encode(text), rng, pick.choice([0.0, 0.3, 0.9]))  # sampled segmentations
        out = tok.decode(ids)
        assert events(tables, ids) == [surface_contains(out, p, whole_words) for p in phrases], (out, ids)


def test_ids_without_a_tokenizer_match_as_id_sequences() -> None:
    vocab = Vocabulary.of_ids(20)
    terms, needs, _ = compile_phrases(vocab, [PhraseIds([[5, 6]])], include=True)
    tables = TermTables(vocab, terms, "cpu", needs)
    assert events(tables, [4, 5, 6, 7]) == [1] and events(tables, [5, 7, 6]) == [0]
