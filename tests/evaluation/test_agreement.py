"""How far a reduced precision's translations stray from fp32's."""

from __future__ import annotations

import pytest

from attnx.errors import ConfigError
from attnx.evaluation.agreement import MAX_SCORE_DROP, agreement

REFERENCES = ["ein Hund läuft im Park .", "zwei Kinder spielen am Strand .", "eine Frau liest ein Buch ."]


def test_identical_translations_agree_fully() -> None:
    result = agreement("bf16-mixed", REFERENCES, REFERENCES, REFERENCES)
    assert result.identical == 1.0 and result.bleu == result.fp32_bleu and result.holds
    assert "100.0% of lines identical; within bounds" in result.line()


def test_a_precision_that_loses_more_than_the_bound_is_flagged() -> None:
    worse = ["ein Hund .", "Kinder .", "eine Frau liest ein Buch ."]
    result = agreement("bf16-mixed", worse, REFERENCES, REFERENCES)
    assert result.identical == pytest.approx(1 / 3) and result.bleu < result.fp32_bleu - MAX_SCORE_DROP
    assert not result.holds and result.line().endswith("decode this model with --precision 32-true")


def test_lines_must_pair_up() -> None:
    with pytest.raises(ConfigError, match="must pair up line by line"):
        agreement("bf16-mixed", REFERENCES[:2], REFERENCES, REFERENCES)
