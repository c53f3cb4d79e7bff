"""[`Hypothesis`][attnx.inference.hypothesis.Hypothesis]: what every search, every engine and forced scoring
return for one output, and what every output format is written from."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Hypothesis"]


@dataclass
class Hypothesis:
    """One output `Y` for one input: its target pieces, how the search ranked it and its log-probability.

    `score` is what the search ranks by, `log_prob / lp(|Y|)` with the configured length penalty, where
    `|Y|` counts the closing `</s>` (`len(tokens) + 1`); `log_prob` is the total log-probability
    `log P(Y | X)` in nats, `</s>` included. Both are the model's own (temperature, top-k and top-p shape
    which samples are drawn, never the reported numbers), so forced scoring of `tokens` gives them back.
    """

    tokens: list[int]
    """Target SentencePiece ids, without `<s>` and `</s>`."""
    score: float
    """What the search ranked by: `log_prob / lp(len(tokens) + 1)`."""
    log_prob: float
    """Total log-probability of `tokens` and the closing `</s>`, in nats."""
    token_log_probs: list[float] | None = None
    """Log-probability of each token and then of `</s>` (`len(tokens) + 1` numbers, summing to `log_prob`)."""
    alignment: list[tuple[int, int]] | None = None
    """Hard alignment: `(i, j)` pairs, source piece `i` is the one target piece `j` attends to most
    (encoder-decoder attention, mean of the last layer's heads); 0-based SentencePiece piece indices, the
    `</s>` of either side left out."""
    text: str = ""
    """`tokens` detokenized, on one line."""
    expected_utility: float | None = None
    """MBR decoding only: the mean utility (chrF or sentence BLEU, 0-100) of `text` against the search's `N`
    candidates ([`attnx.inference.mbr`][attnx.inference.mbr])."""
    unmet: list[int] | None = None
    """Lexically constrained search only: the indices of the phrases this output was to contain and does not
    (the maximum length ended it first, or the input line was blank and nothing was searched); `[]`: all met."""
