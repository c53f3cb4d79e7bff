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
    read_constraint,
    repeats_run,
    to_constraints,
    unmet_lines,
    unmet_reason,
    unmet_warnings,
)

FORMS = {
    "object": ('{"include": ["Hund"], "exclude": ["Katze"]}', PhraseConstraints(("Hund",), ("Katze",))),
    "array": ('["Hund", "Ball"]', PhraseConstraints(("Hund", "Ball"))),
    "null": ("null", PhraseConstraints()),
    "string": ('"Hund"', PhraseConstraints(("Hund",))),
    "tsv": ("Hund\tBall", PhraseConstraints(("Hund", "Ball"))),
    "bom": ('\ufeff{"include": ["Hund"]}', PhraseConstraints(("Hund",))),
    "line separator": ('["Hund\u2028Ball"]', PhraseConstraints(("Hund\u2028Ball",))),
    "blank": ("", PhraseConstraints()),
}
"""Every form a line of a constraints file takes, and what it means: each entry point's tests run them all."""


def test_a_line_is_a_json_object_or_tab_separated_phrases():
    assert parse_line('{"include": ["a b", "c"], "ordered": true}\n', "f:1") == PhraseConstraints(
        ("a b", "c"), (), True
    )
    assert parse_line("a b\tc\n", "f:1") == PhraseConstraints(("a b", "c"))
    assert parse_line("\n", "f:1") == PhraseConstraints() and not parse_line("", "f:1")
    assert to_constraints(["x"], "w") == to_constraints({"include": ["x"]}, "w")
    assert to_constraints(PhraseConstraints(("x",), ("y",)), "w") == PhraseConstraints(("x",), ("y",))


@pytest.mark.parametrize("form", FORMS)
def test_a_line_of_every_form_reads_as_its_constraints(form):
    line, expected = FORMS[form]
    assert parse_line(line, "f:1") == expected
    assert parse_line(line + "\r\n", "f:1") == expected
    assert read_constraint(line, "f:1") == expected  # a string of the API or a request: the same line


def test_json_that_is_no_constraint_is_text_and_a_value_is_read_decoded():
    assert parse_line("1984", "f:1") == PhraseConstraints(
        ("1984",)
    )  # a number is a phrase, as fairseq reads it
    assert parse_line("true\tNaN", "f:1") == PhraseConstraints(("true", "NaN"))
    assert parse_line('"null"', "f:1") == PhraseConstraints(
        ("null",)
    )  # a JSON string: one phrase, as written
    assert parse_line('["Hund\tKatze"]', "f:1") == PhraseConstraints(("Hund\tKatze",))
    assert parse_line('["Hund\x0bBall"]', "f:1") == PhraseConstraints(("Hund\x0bBall",))  # a raw control char
    assert parse_line("\ufeff\ufeffHund", "f:1") == PhraseConstraints(("\ufeffHund",))  # one mark dropped
    assert read_constraint(None, "w") == PhraseConstraints()
    assert read_constraint(["Hund\tKatze"], "w") == PhraseConstraints(("Hund\tKatze",))
    assert read_constraint({"include": ["a"], "ordered": True}, "w") == PhraseConstraints(("a",), (), True)
    assert to_constraints("Hund", "w") == PhraseConstraints(("Hund",))


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
        ('["Hund", "Ball"', "f:2: not a JSON array"),
        ('""', 'f:2: an empty phrase in "include"'),
        ("[1, 2]", 'f:2: "include" must be a list of phrases'),
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
        return [[len(t) + 4] * len(t.split()) for t in texts]

    items = [PhraseConstraints(("a b",), ("c",), True), PhraseConstraints()]
    assert encode_phrases(encode, items, ["1", "2"]) == [PhraseIds([[7, 7]], [[5]], True), None]
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
        check_phrases([PhraseIds([[5, 6, 7]], [[6, 7]], whole_words=False)], [[9]], None, beam4)
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


def test_a_phrase_no_repeat_ngram_keeps_out_is_named_as_the_reason_it_is_unmet():
    """A phrase whose pieces repeat a run of `no_repeat_ngram` pieces (in itself or with another phrase of its
    line) cannot be written so: the warning names that setting, not the maximum length; a blank line is not
    searched at all."""
    one, two = SearchConfig(no_repeat_ngram=1), SearchConfig(no_repeat_ngram=2)
    assert repeats_run(PhraseIds([[5, 6, 5]]), 0, 1) and not repeats_run(PhraseIds([[5, 6, 5]]), 0, 2)
    assert repeats_run(PhraseIds([[9], [5, 6], [6, 7]]), 2, 1) and not repeats_run(
        PhraseIds([[9], [5]]), 0, 1
    )
    assert unmet_reason(PhraseIds([[5, 6, 5]]), [0], [9], one) == "no_repeat_ngram"
    assert unmet_reason(PhraseIds([[5, 6, 5]]), [0], [9], two) == "length"
    assert unmet_reason(PhraseIds([[5, 6, 5]]), [0], [9], SearchConfig()) == "length"
    assert unmet_reason(PhraseIds([[5, 6, 5], [7]]), [1], [9], one) == "length"  # phrase 1 is not the one
    assert unmet_reason(PhraseIds([[5]]), [0], [], one) == "blank"
    assert unmet_reason(PhraseIds([[5]]), [], [9], one) is None and unmet_reason(None, None, [9], one) is None
    said = unmet_warnings({"length": [4], "blank": [2, 3], "no_repeat_ngram": [1]}, one, "--search.")
    assert said == [
        "2 blank line(s) have phrases to include, which their blank translation leaves out: line 2, 3",
        "1 translation(s) left out a phrase to include whose pieces repeat a run of 1 (in the phrase or with "
        "another phrase of its line), which --search.no_repeat_ngram 1 forbids writing: lower it (0: off): line 1",
        "1 translation(s) reached the maximum output length before writing all their phrases to include (raise "
        "--search.max_len_b): line 4",
    ]
    assert unmet_warnings({}, one, "search.") == []
    assert unmet_lines(None, [None], [[9]], one) == {}
    phrases = [PhraseIds([[5, 5]]), None, PhraseIds([[5]]), PhraseIds([[6]])]
    found = unmet_lines(phrases, [[0], None, [0], []], [[9], [9], [], [9]], one, first=11)
    assert found == {"no_repeat_ngram": [11], "blank": [13]}
    assert unmet_warnings({"length": list(range(1, 13))}, one, "search.")[0].endswith(
        "line 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 ..."
    )


def test_whole_words_is_a_key_of_its_own_true_unless_set():
    assert parse_line('{"include": ["Hund"]}', "l").whole_words is True
    assert parse_line('{"include": ["Hund"], "whole_words": false}', "l").whole_words is False
    with pytest.raises(ConfigError, match='"whole_words" must be true or false'):
        parse_line('{"include": ["Hund"], "whole_words": "no"}', "l")
