"""Terminology constraints as users write them: parsed, encoded, and refused in one line where no search can
meet them."""

from __future__ import annotations

import pytest

from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.lexical import PhraseIds
from attnx.inference.phrases import (
    PhraseConstraints,
    banned_phrases,
    check_phrases,
    encode_phrases,
    parse_line,
    to_constraints,
)


def test_a_line_is_a_json_object_or_tab_separated_phrases():
    assert parse_line('{"include": ["a b", "c"], "ordered": true}\n', "f:1") == PhraseConstraints(
        ("a b", "c"), (), True
    )
    assert parse_line("a b\tc\n", "f:1") == PhraseConstraints(("a b", "c"))
    assert parse_line("\n", "f:1") == PhraseConstraints() and not parse_line("", "f:1")
    assert to_constraints(["x"], "w") == to_constraints({"include": ["x"]}, "w")
    assert to_constraints(PhraseConstraints(("x",), ("y",)), "w") == PhraseConstraints(("x",), ("y",))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('{"include": ["a"', "f:2: not a JSON object"),
        ('{"include": ["a", "  "]}', 'f:2: an empty phrase in "include"'),
        ('{"exclude": [""]}', 'f:2: an empty phrase in "exclude"'),
        ('{"include": "a"}', 'f:2: "include" must be a list of phrases'),
        ('{"include": ["a"], "ordered": "yes"}', 'f:2: "ordered" must be true or false'),
        ('{"inclde": ["a"]}', "f:2: unknown constraint key 'inclde'"),
        ("a\t\tb", 'f:2: an empty phrase in "include"'),
    ],
)
def test_malformed_lines_are_one_line_naming_where(value, words):
    with pytest.raises(ConfigError) as err:
        parse_line(value, "f:2")
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_phrases_are_encoded_in_one_call_and_a_phrase_without_pieces_is_refused():
    calls = []

    def encode(texts):
        calls.append(texts)
        return [[len(t)] * len(t.split()) for t in texts]

    items = [PhraseConstraints(("a b",), ("c",), True), PhraseConstraints()]
    assert encode_phrases(encode, items, ["1", "2"]) == [PhraseIds([[3, 3]], [[1]], True), None]
    assert calls == [["a b", "c"]]
    with pytest.raises(ConfigError, match="^1: the phrase 'x' has no target pieces"):
        encode_phrases(lambda texts: [[]], [PhraseConstraints(("x",))], ["1"])


def test_what_no_search_can_meet_is_refused_naming_the_input():
    beam4 = SearchConfig(beam=4, max_len_a=0, max_len_b=5)
    check_phrases([PhraseIds([[5], [6], [7]]), None], [[9], [9]], None, beam4)
    with pytest.raises(ConfigError, match="^input 1: 4 phrases to include need a beam of at least 5"):
        check_phrases([PhraseIds([[5], [6], [7], [8]])], [[9]], None, beam4)
    with pytest.raises(
        ConfigError, match=r"^line 7: the phrases to include take 6 target pieces, more than the 5"
    ):
        check_phrases([PhraseIds([[5] * 6])], [[9]], None, beam4, ["line 7"])
    with pytest.raises(ConfigError, match="and the prefix take 6 target pieces"):
        check_phrases([PhraseIds([[5] * 3])], [[9]], [[1, 2, 3]], beam4)
    with pytest.raises(ConfigError, match="need beam search"):
        check_phrases([PhraseIds([[5]])], [[9]], None, SearchConfig(sampling=True))
    with pytest.raises(ConfigError, match="contains one to exclude"):
        check_phrases([PhraseIds([[5, 6, 7]], [[6, 7]])], [[9]], None, beam4)
    check_phrases([PhraseIds([[5] * 9])], [[]], None, beam4)  # a blank input is not searched
    check_phrases([PhraseIds(exclude=[[5, 6]])], [[9]], None, SearchConfig(sampling=True))


def test_an_engine_without_constrained_search_gets_the_banned_phrases_or_refuses():
    ids = [[9], [9]]
    assert banned_phrases(ids, None, None, "e") == [(), ()]
    assert banned_phrases(ids, None, [PhraseIds(exclude=[[5, 6]]), None], "e", str) == [(("5", "6"),), ()]
    with pytest.raises(ConfigError, match="^e cannot decode with phrases to include"):
        banned_phrases(ids, None, [PhraseIds([[5]]), None], "e")
    with pytest.raises(ConfigError, match="1 constraints for 2 inputs"):
        banned_phrases(ids, None, [None], "e")
