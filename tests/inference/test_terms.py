"""Phrases matched on the text the pieces spell: the automaton agrees with the detokenized string however the
output is segmented; the search bans and meets phrases as words whatever pieces spell them (brackets, quotes,
sampled segmentations), lets compounds through, counts a phrase listed twice twice, and writes a phrase after an
opening bracket without a space."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attnx.data.batch import EOS_ID
from attnx.data.corpus import PreparedCorpus
from attnx.data.dropout import MergeTable
from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.decoder import EnsembleDecoder
from attnx.inference.lexical import PhraseIds
from attnx.inference.phrases import PhraseConstraints, check_phrases, encode_phrases
from attnx.inference.search import generate
from attnx.inference.term_tables import TermTables
from attnx.inference.terms import surface_contains, vocabulary
from tests.inference.test_term_tables import events


@pytest.fixture(scope="module")
def tok(corpus: Path) -> Tokenizer:
    return PreparedCorpus(corpus).tokenizer


class Scripted(nn.Module):
    """A decoder that prefers writing `script` (ids) and then `</s>`; every other token is far less likely."""

    def __init__(self, script: list[int], vocab_size: int) -> None:
        super().__init__()
        self.script, self.vocab_size, self.models = script, vocab_size, [self]

    def start(self, src, src_mask):
        return {"t": torch.zeros(src.shape[0], dtype=torch.long)}

    def step(self, tokens, state):
        t = state["t"]
        state["t"] = t + 1
        want = torch.tensor([*self.script, EOS_ID])[t.clamp(max=len(self.script))]
        logits = torch.zeros(t.numel(), self.vocab_size)
        logits[torch.arange(t.numel()), want] = 12.0
        return torch.log_softmax(logits, dim=-1)

    def reorder(self, state, index, same_sources=False):
        state["t"] = state["t"][index]


def search(
    tok: Tokenizer, script: list[int], constraints: PhraseIds, beam: int = 4, prefix: list[int] | None = None
) -> list[int]:
    decoder = EnsembleDecoder([Scripted(script, tok.vocab_size)])
    src, mask = torch.full((1, 5), 9), torch.ones(1, 5, dtype=torch.bool)
    config = SearchConfig(beam=beam, max_len_a=0, max_len_b=len(script) + 12)
    prefixes = None if prefix is None else [prefix]
    [hyps] = generate(
        decoder, src, mask, config, prefixes=prefixes, constraints=[constraints], vocabulary=vocabulary(tok)
    )
    assert hyps[0].unmet in (None, [])
    return hyps[0].tokens


def spelled(tok: Tokenizer, text: str) -> list[int]:
    """`text` written letter by letter (every merge dropped), as a model trained with subword sampling may."""
    ids = MergeTable(tok.sp).sample(tok.encode(text), np.random.default_rng(0), 1.0)
    assert tok.sp.unk_id() not in ids and tok.decode(ids) == text, text
    return ids


def phrase(tok: Tokenizer, include=(), exclude=()) -> PhraseIds:
    [ids] = encode_phrases(tok.encode_batch, [PhraseConstraints(tuple(include), tuple(exclude))], ["test"])
    return ids


def brackets(tok: Tokenizer) -> str:
    """The word in the first pair of brackets the model has pieces for."""
    pairs = [("(", ")"), ("[", "]"), ('"', '"'), ("«", "»")]
    return next(f"{a}Mann{b}" for a, b in pairs if tok.sp.unk_id() not in tok.encode(a + b))


def test_an_excluded_phrase_is_banned_in_brackets_in_quotes_and_spelled_letter_by_letter(tok) -> None:
    for script in (
        spelled(tok, brackets(tok)),
        spelled(tok, "„Mann“"),
        spelled(tok, "Mann ein"),
    ):
        assert surface_contains(tok.decode(script), "Mann")  # what the model would write
        out = search(tok, script, phrase(tok, exclude=["Mann"]))
        assert not surface_contains(tok.decode(out), "Mann"), tok.decode(out)


def test_an_excluded_word_leaves_its_compounds_alone(tok) -> None:
    script = tok.encode("Männer und Mannschaft")
    if not surface_contains(tok.decode(script), "Mannschaft"):
        pytest.skip("the tokenizer does not write the compound")
    assert search(tok, script, phrase(tok, exclude=["Mann"])) == script
    assert search(tok, tok.encode("der Mann"), phrase(tok, exclude=["Mann"])) != tok.encode("der Mann")


def test_an_included_phrase_the_model_spells_its_own_way_is_met_without_a_second_copy(tok) -> None:
    script = spelled(tok, brackets(tok))
    out = search(tok, script, phrase(tok, include=["Mann"]))
    assert out == script and surface_contains(tok.decode(out), "Mann") == 1


def test_a_phrase_listed_twice_appears_twice(tok) -> None:
    script = tok.encode("ein Mann")
    out = tok.decode(search(tok, script, phrase(tok, include=["Mann", "Mann"])))
    assert surface_contains(out, "Mann") == 2, out
    assert surface_contains(tok.decode(search(tok, script, phrase(tok, include=["Mann"]))), "Mann") == 1


def test_a_phrase_forced_after_an_opening_bracket_has_no_space_before_it(tok) -> None:
    script = spelled(tok, "„")
    out = tok.decode(search(tok, script, phrase(tok, include=["Frau"])))
    assert surface_contains(out, "Frau") == 1 and "„ Frau" not in out, out


def test_a_compound_does_not_meet_a_whole_word_but_meets_a_sub_word_phrase(tok) -> None:
    vocab = vocabulary(tok)
    ids = tok.encode("Mannschaft")
    whole = TermTables(vocab, [[vocab.term("Mann", True)]], "cpu")
    part = TermTables(vocab, [[vocab.term("Mann", False)]], "cpu")
    assert events(whole, ids) == [0] and events(part, ids) == [1]


def test_a_phrase_the_model_cannot_write_is_refused_naming_its_characters(tok) -> None:
    for text, char in (("שלום", "U+05E9"), ("狗", "U+72D7"), ("Ma\u200dnn", "U+200D")):
        with pytest.raises(ConfigError, match=rf"line 3: the phrase .* cannot write .*{re.escape(char)}"):
            encode_phrases(tok.encode_batch, [PhraseConstraints((text,))], ["line 3"])


def test_a_phrase_to_include_that_holds_one_to_exclude_is_refused(tok) -> None:
    with pytest.raises(ConfigError, match="contains the one to exclude"):
        encode_phrases(tok.encode_batch, [PhraseConstraints(("ein Mann",), ("Mann",))], ["line 1"])
    compound = encode_phrases(tok.encode_batch, [PhraseConstraints(("Mannschaft",), ("Mann",))], ["line 1"])
    check_phrases(compound, [[9]], None, SearchConfig(beam=4))  # a compound holds no word of its own


def test_whole_words_false_matches_inside_compounds_too(tok) -> None:
    script = tok.encode("Männer und Mannschaft")
    if not surface_contains(tok.decode(script), "Mannschaft"):
        pytest.skip("the tokenizer does not write the compound")
    [ids] = encode_phrases(tok.encode_batch, [PhraseConstraints((), ("Mann",), whole_words=False)], ["t"])
    out = tok.decode(search(tok, script, ids))
    assert "Mann" not in out, out


def test_a_phrase_right_after_an_opening_quote_is_not_written_with_a_space(tok) -> None:
    """The output must start with `„` (a prefix) and the model would go on with `▁Frau`: the phrase's spaced
    piece is withheld after the quote."""
    quote = tok.encode("„")
    script = [*quote, *tok.encode("Frau"), *tok.encode("“")]
    assert "„ Frau" in tok.decode(script)
    out = tok.decode(search(tok, script, phrase(tok, include=["Frau"]), prefix=quote))
    assert "„ Frau" not in out and surface_contains(out, "Frau") == 1, out
