"""Output formats written once from Hypothesis lists: text, JSON Lines, Moses/Marian n-best."""

from __future__ import annotations

import json

import pytest

from attnx.inference.formats import alignment_text, hypothesis_fields, render
from attnx.inference.hypothesis import Hypothesis

BEST = Hypothesis(
    [5, 6], -0.5, -1.0, token_log_probs=[-0.25, -0.5, -0.25], alignment=[(0, 0), (2, 1)], text="Ein Hund"
)
NEXT = Hypothesis([7], -0.75, -1.25, token_log_probs=[-1.0, -0.25], alignment=[(1, 0)], text="Hund")
BLANK = Hypothesis([], 0.0, 0.0, text="")


def pieces(ids):
    return [f"p{i}" for i in ids]


def test_text_is_the_best_translation_with_its_alignment_after_three_bars():
    plain = Hypothesis([5], -1.0, -2.0, text="Ein Hund")
    assert render("text", [[plain], [BLANK]]) == "Ein Hund\n\n"
    assert (
        render("text", [[BEST, NEXT], [Hypothesis([], 0.0, 0.0, alignment=[], text="")]])
        == "Ein Hund ||| 0-0 2-1\n\n"
    )


def test_text_with_an_nbest_list_is_marian_s_short_nbest_form_one_line_per_hypothesis():
    """`translate --nbest 2` in text: `id ||| text ||| score` per hypothesis, ids from 0 (Marian's form)."""
    plain = [Hypothesis([5], -0.5, -1.0, text="Ein Hund"), Hypothesis([7], -0.75, -1.5, text="Hund")]
    assert render("text", [plain, [BLANK]], nbest=True).splitlines() == [
        "0 ||| Ein Hund ||| -0.5",
        "0 ||| Hund ||| -0.75",
        "1 |||  ||| 0.0",
    ]
    assert render("text", [[BEST, NEXT]], first=3, nbest=True).splitlines() == [
        "3 ||| Ein Hund ||| 0-0 2-1 ||| -0.5",
        "3 ||| Hund ||| 1-0 ||| -0.75",
    ]


def test_jsonl_is_one_object_a_line_with_every_hypothesis_and_what_was_asked():
    out = render("jsonl", [[BEST, NEXT], [BLANK]], token_scores=True, pieces=pieces).splitlines()
    first = json.loads(out[0])["hypotheses"]
    assert first[0] == {
        "text": "Ein Hund",
        "score": -0.5,
        "log_prob": -1.0,
        "tokens": 2,
        "pieces": ["p5", "p6", "</s>"],
        "token_log_probs": [-0.25, -0.5, -0.25],
        "alignment": [[0, 0], [2, 1]],
    }
    assert [h["text"] for h in first] == ["Ein Hund", "Hund"]
    assert json.loads(out[1]) == {"hypotheses": [{"text": "", "score": 0.0, "log_prob": 0.0, "tokens": 0}]}
    assert "pieces" not in hypothesis_fields(BEST)  # token scores only when asked


def test_moses_lines_number_inputs_from_first_and_put_the_scores_last():
    out = render("moses", [[BEST, NEXT], [BLANK]], first=10, token_scores=True).splitlines()
    assert out == [
        "10 ||| Ein Hund ||| 0-0 2-1 ||| WordScores= -0.25 -0.5 -0.25 ||| F0= -1.0 ||| -0.5",
        "10 ||| Hund ||| 1-0 ||| WordScores= -1.0 -0.25 ||| F0= -1.25 ||| -0.75",
        "11 |||  ||| F0= 0.0 ||| 0.0",
    ]
    assert alignment_text([]) == ""
    with pytest.raises(ValueError, match="format must be one of text, jsonl, moses"):
        render("csv", [[BEST]])  # type: ignore[arg-type]
