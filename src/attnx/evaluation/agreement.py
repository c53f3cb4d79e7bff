"""How far a faster precision's translations stray from fp32's: BLEU and chrF of both against the references,
and the share of lines they translate identically.

`attnx test --evaluation.compare_fp32 true` reports it for the test split, and
`bench/bench_decode_precision.py` for every precision and compute type it runs; a reduced precision whose
BLEU or chrF falls more than [`MAX_SCORE_DROP`][attnx.evaluation.agreement.MAX_SCORE_DROP] points below
fp32's is flagged, with what to do (`attnx test` warns on standard error).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnx.errors import ConfigError
from attnx.evaluation.bleu import score

MAX_SCORE_DROP = 1.0
"""BLEU or chrF points a reduced precision may lose against fp32 on the same lines before it is flagged: bf16
decoding of a trained model usually moves corpus BLEU by a few tenths either way (bf16 keeps 8 bits of
mantissa; the search's scores stay float32), a model whose outputs bf16 changes for the worse by more is one
to decode in fp32."""


@dataclass(frozen=True)
class Agreement:
    """Scores of `precision`'s translations against fp32's on the same lines."""

    precision: str
    bleu: float
    fp32_bleu: float
    chrf: float
    fp32_chrf: float
    identical: float
    """Share of lines translated identically by both, 0 to 1."""
    n: int

    @property
    def holds(self) -> bool:
        """Whether neither BLEU nor chrF falls more than `MAX_SCORE_DROP` below fp32's."""
        return min(self.bleu - self.fp32_bleu, self.chrf - self.fp32_chrf) >= -MAX_SCORE_DROP

    def line(self) -> str:
        verdict = (
            "within bounds"
            if self.holds
            else f"more than {MAX_SCORE_DROP} points below fp32: decode this model with --precision 32-true"
        )
        return (
            f"{self.precision} against 32-true on {self.n} lines: BLEU {self.bleu:.2f} vs {self.fp32_bleu:.2f} "
            f"({self.bleu - self.fp32_bleu:+.2f}), chrF {self.chrf:.2f} vs {self.fp32_chrf:.2f} "
            f"({self.chrf - self.fp32_chrf:+.2f}), {self.identical:.1%} of lines identical; {verdict}"
        )


def agreement(
    precision: str, translations: list[str], fp32: list[str], references: list[str], lang: str = "de"
) -> Agreement:
    """Compare `translations` (decoded in `precision`) with `fp32`'s of the same lines, against `references`."""
    if not len(translations) == len(fp32) == len(references):
        raise ConfigError(
            f"{len(translations)} translations, {len(fp32)} fp32 translations and {len(references)} references: "
            "they must pair up line by line"
        )
    ours, theirs = score(translations, references, lang), score(fp32, references, lang)
    same = sum(a == b for a, b in zip(translations, fp32, strict=True))
    return Agreement(
        precision=precision,
        bleu=ours.bleu,
        fp32_bleu=theirs.bleu,
        chrf=ours.chrf,
        fp32_chrf=theirs.chrf,
        identical=same / max(1, len(fp32)),
        n=len(fp32),
    )
