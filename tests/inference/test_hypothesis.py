"""The `Hypothesis` every search and forced scoring return: its fields, and the numbers they promise."""

from __future__ import annotations

import dataclasses

import pytest

from attnx.data.batch import BOS_ID, EOS_ID
from attnx.inference.config import SearchConfig
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lengths import length_penalty
from attnx.inference.scoring import force_decode
from attnx.inference.search import generate
from tests.inference.toys import make_model, sources


def test_fields_in_order_and_what_is_left_out_by_default():
    """Searches and engines build hypotheses positionally: tokens, score, log_prob, per-token, alignment."""
    assert [f.name for f in dataclasses.fields(Hypothesis)] == [
        "tokens",
        "score",
        "log_prob",
        "token_log_probs",
        "alignment",
        "text",
        "expected_utility",
        "unmet",
    ]
    h = Hypothesis([5, 6], -0.5, -1.0)
    assert (h.token_log_probs, h.alignment, h.text, h.expected_utility) == (None, None, "", None)
    assert Hypothesis([5, 6], -0.5, -1.0) == h and Hypothesis([5], -0.5, -1.0) != h


@pytest.mark.parametrize(
    "config",
    [
        SearchConfig(beam=4, nbest=3, max_len_a=0.5, max_len_b=6),
        SearchConfig(beam=3, nbest=2, alpha=1.0, length_penalty="fairseq", max_len_a=0.5, max_len_b=6),
        SearchConfig(sampling=True, nbest=3, seed=2, temperature=2.0, top_p=0.8, max_len_a=0.5, max_len_b=6),
    ],
    ids=["beam-gnmt", "beam-fairseq", "sampling"],
)
def test_search_and_forced_scoring_keep_the_documented_numbers(config):
    """`token_log_probs`: one per token and one for `</s>`, summing to `log_prob`; `score` is `log_prob` over
    `lp(len(tokens) + 1)`; `tokens` hold neither `<s>` nor `</s>`; forced scoring gives the same numbers back."""
    model = make_model()
    src, src_mask = sources(6, 3, 9)
    results = generate(model, src, src_mask, config)
    flat = [(i, h) for i, hyps in enumerate(results) for h in hyps]
    assert all(len(hyps) == config.nbest for hyps in results)
    for _, h in flat:
        assert BOS_ID not in h.tokens and EOS_ID not in h.tokens
        assert len(h.token_log_probs) == len(h.tokens) + 1
        assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-4)
        penalty = length_penalty(len(h.tokens) + 1, config.alpha, config.length_penalty)
        assert h.score == pytest.approx(h.log_prob / penalty, rel=1e-5)
    rows = [i for i, _ in flat]
    forced = force_decode(model, src[rows], src_mask[rows], [h.tokens for _, h in flat], config)
    for (_, searched), scored in zip(flat, forced, strict=True):
        assert scored.tokens == searched.tokens
        assert scored.log_prob == pytest.approx(searched.log_prob, abs=1e-4)
        assert scored.score == pytest.approx(searched.score, abs=1e-4)
