"""How to decode, as plain settings (no torch): the schema of `search` in commands and configs.

Every setting is checked here, once, when a [`SearchConfig`][attnx.inference.config.SearchConfig] is made
(also by `dataclasses.replace`): a bad value is a `ValueError` of one line naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LengthPenalty = Literal["gnmt", "fairseq"]

DEFAULT_MAX_TOKENS = 4096
"""Source tokens per decoding batch, padding included: every engine's, `attnx translate`'s and `attnx serve`'s default."""


@dataclass
class SearchConfig:
    """How to decode (§6.1 defaults: beam 4, α = 0.6, maximum length input + 50).

    Beam search by default; `sampling=True` draws `nbest` samples per input instead (the `beam` is then
    not used). Both report, per hypothesis, `score` (what the search ranks by: `log_prob / lp(|Y|)`) and
    `log_prob` (the total log-probability in nats, `</s>` included); docs/decoding.md.
    """

    beam: int = 4
    """Beam size; 1 = greedy search. Not used with sampling."""
    alpha: float = 0.6
    """Length penalty exponent α."""
    length_penalty: LengthPenalty = "gnmt"
    """`gnmt`: `((5 + |Y|) / 6) ** α` (the paper's, §6.1); `fairseq`: `|Y| ** α`."""
    max_len_a: float = 1.0
    """Maximum output length = `max_len_a * input length + max_len_b` (paper: input length + 50)."""
    max_len_b: int = 50
    """See `max_len_a`."""
    max_positions: int | None = None
    """Target positions the model accepts (its `max_len`); caps the maximum output length. None: no cap."""
    nbest: int = 1
    """Hypotheses returned per input, best first: at most `beam` with beam search; with sampling, the
    number of samples drawn per input."""
    sampling: bool = False
    """Sample each next token from the model's distribution (ancestral sampling, shaped by `temperature`,
    `top_k` and `top_p`) instead of searching a beam."""
    top_k: int = 0
    """Sampling only: draw from the `top_k` most probable tokens (0: all; 1: greedy)."""
    top_p: float = 1.0
    """Sampling only: draw from the smallest set of most probable tokens whose probability reaches `top_p`
    (nucleus sampling), in (0, 1]; 1: all."""
    temperature: float = 1.0
    """Sampling only: divide the log-probabilities by this (> 0) before drawing; below 1 sharpens, above 1
    flattens. Reported scores stay the model's own."""
    seed: int | None = None
    """Sampling only: seed of the random draws; the same seed gives the same samples on CPU. None: a fresh
    draw each run."""
    no_repeat_ngram: int = 0
    """Never produce an n-gram of this many target pieces twice in one hypothesis (0: off)."""
    min_length: int = 0
    """`</s>` is not allowed before this many target pieces (a forced prefix counts; the maximum length
    still wins)."""
    alignment: bool = False
    """Also return hard alignments (source piece, target piece) from the encoder-decoder attention."""

    def __post_init__(self) -> None:
        checks = [
            (self.beam >= 1, f"search.beam must be at least 1, got {self.beam}"),
            (self.nbest >= 1, f"search.nbest must be at least 1, got {self.nbest}"),
            (
                self.sampling or self.nbest <= self.beam,
                f"search.nbest ({self.nbest}) cannot exceed search.beam ({self.beam}): a beam keeps only "
                f"beam hypotheses; raise --search.beam to at least {self.nbest}",
            ),
            (
                self.length_penalty in ("gnmt", "fairseq"),
                f"search.length_penalty must be 'gnmt' or 'fairseq', got {self.length_penalty!r}",
            ),
            (self.max_len_a >= 0, f"search.max_len_a must be >= 0, got {self.max_len_a}"),
            (self.top_k >= 0, f"search.top_k must be >= 0 (0: all tokens), got {self.top_k}"),
            (0 < self.top_p <= 1, f"search.top_p must be in (0, 1], got {self.top_p}"),
            (self.temperature > 0, f"search.temperature must be > 0, got {self.temperature}"),
            (self.no_repeat_ngram >= 0, f"search.no_repeat_ngram must be >= 0, got {self.no_repeat_ngram}"),
            (self.min_length >= 0, f"search.min_length must be >= 0, got {self.min_length}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if not self.sampling:
            changed = [
                f"{name}={value}"
                for name, value, default in [
                    ("top_k", self.top_k, 0),
                    ("top_p", self.top_p, 1.0),
                    ("temperature", self.temperature, 1.0),
                    ("seed", self.seed, None),
                ]
                if value != default
            ]
            if changed:
                raise ValueError(
                    f"search.{', search.'.join(changed)} only shape sampling: add --search.sampling true "
                    "(or leave them out for beam search)"
                )

    @property
    def width(self) -> int:
        """Decoder rows per input: the beam, or the number of samples."""
        return self.nbest if self.sampling else self.beam


PAPER_SEARCH = SearchConfig()
"""§6.1's search: beam 4, α 0.6 with the GNMT length penalty, maximum output length input + 50."""
