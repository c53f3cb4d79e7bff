"""Scoring translations: sacreBLEU BLEU and chrF with their signatures, plus the paper-style BLEU.

**sacreBLEU** (Post 2018) scores detokenized text with its own fixed tokenization; its signature says exactly
how, so the number can be compared across papers. This is the score to report.

**Paper-style BLEU** reproduces how the paper's numbers were computed (tensor2tensor's
`get_ende_bleu.sh`): Moses-tokenize hypotheses and references (`tokenizer.perl -l de`), split hyphenated
compounds (`rich-text` -> `rich ##AT##-##AT## text`, the GNMT/ConvS2S convention), then corpus BLEU over
those tokens as `multi-bleu.perl` computes it. It is usually higher than sacreBLEU and **not comparable
to sacreBLEU**; it exists only to set our numbers beside the paper's Table 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer

from attnx.errors import ConfigError

COMPOUND = re.compile(r"(\S)-(\S)")
"""tensor2tensor's `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`, with the same non-overlapping matches."""


def check_pairs(hypotheses: list[str], references: list[str], hyp_name: str = "", ref_name: str = "") -> None:
    """Refuse, in one line, hypotheses and references that do not pair up line by line, or that hold no segment
    at all (a corpus score of nothing is not a number). `hyp_name`, `ref_name`: where the lines came from (e.g.
    `--hypotheses test.hyp`), named in the message."""
    if len(hypotheses) != len(references):
        counts = (
            f"{hyp_name} has {len(hypotheses)} lines but {ref_name} has {len(references)}"
            if hyp_name and ref_name
            else f"{len(hypotheses)} hypotheses but {len(references)} references"
        )
        raise ConfigError(f"{counts}; they must pair up line by line")
    if not hypotheses:
        raise ConfigError(
            f"{hyp_name or 'the hypotheses'} and {ref_name or 'the references'} hold no lines: there is nothing "
            "to score (an empty translation is an empty line, one per reference)"
        )


@dataclass
class BleuReport:
    """Corpus scores of `n` segments, each with what is needed to reproduce it."""

    bleu: float
    """sacreBLEU BLEU (default 13a tokenization, exponential smoothing)."""
    chrf: float
    """sacreBLEU chrF2."""
    bleu_signature: str
    chrf_signature: str
    paper_bleu: float
    """Moses-tokenized, compound-split, multi-bleu-style BLEU (the paper's procedure); not sacreBLEU."""
    n: int

    def lines(self) -> list[str]:
        """Human-readable summary, one score per line, signatures included."""
        return [
            f"sacreBLEU BLEU = {self.bleu:.2f}  ({self.bleu_signature})",
            f"sacreBLEU chrF2 = {self.chrf:.2f}  ({self.chrf_signature})",
            f"paper-style tokenized BLEU = {self.paper_bleu:.2f}  (Moses tokenizer + ##AT## compound "
            "splitting + multi-bleu, as tensor2tensor's get_ende_bleu.sh; not comparable to sacreBLEU)",
            f"segments: {self.n}",
        ]


@lru_cache(maxsize=8)
def _moses(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)


def paper_tokenize(text: str, lang: str = "de") -> str:
    """Moses tokenization (no escaping) then compound splitting, as in tensor2tensor's get_ende_bleu.sh."""
    tokens = _moses(lang).tokenize(text, escape=False, return_str=True)
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokens)


def paper_bleu(hypotheses: list[str], references: list[str], lang: str = "de") -> float:
    """multi-bleu.perl over paper-tokenized text: sacreBLEU on those tokens without its own tokenization
    or smoothing (multi-bleu.perl smooths nothing: an n-gram order without matches gives 0)."""
    hyp = [paper_tokenize(h, lang) for h in hypotheses]
    ref = [paper_tokenize(r, lang) for r in references]
    return BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyp, [ref]).score


def score(hypotheses: list[str], references: list[str], lang: str = "de") -> BleuReport:
    """Score detokenized `hypotheses` against one reference each; `lang` is the target language (Moses)."""
    check_pairs(hypotheses, references)
    bleu, chrf = BLEU(), CHRF()
    return BleuReport(
        bleu=bleu.corpus_score(hypotheses, [references]).score,
        chrf=chrf.corpus_score(hypotheses, [references]).score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        paper_bleu=paper_bleu(hypotheses, references, lang),
        n=len(hypotheses),
    )


@dataclass
class SentenceScore:
    """The scores of one segment against its reference."""

    bleu: float
    """sacreBLEU sentence BLEU (`sacrebleu.sentence_bleu`: n-gram orders up to the segment's length, exponential
    smoothing)."""
    chrf: float
    """sacreBLEU sentence chrF2 (`sacrebleu.sentence_chrf`)."""


def sentence_scores(hypotheses: list[str], references: list[str]) -> list[SentenceScore]:
    """BLEU and chrF2 of each detokenized hypothesis against its one reference, as sacreBLEU's
    `sentence_bleu` and `sentence_chrf` compute them."""
    check_pairs(hypotheses, references)
    bleu, chrf = BLEU(effective_order=True), CHRF()
    return [
        SentenceScore(bleu.sentence_score(h, [r]).score, chrf.sentence_score(h, [r]).score)
        for h, r in zip(hypotheses, references, strict=True)
    ]


def read_lines(path: str | Path) -> list[str]:
    """Segments of a text file, one a line, trailing whitespace removed (as the `sacrebleu` command reads them)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def score_files(hyp_path: str | Path, ref_path: str | Path, lang: str = "de") -> BleuReport:
    """Score a hypothesis file against a reference file, line by line (`attnx score`)."""
    hypotheses, references = read_lines(hyp_path), read_lines(ref_path)
    check_pairs(hypotheses, references, str(hyp_path), str(ref_path))
    return score(hypotheses, references, lang)
