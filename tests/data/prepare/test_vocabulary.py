"""The joint SentencePiece model: a vocabulary size the text cannot support is one line saying what to use."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import base, error_of


def test_vocab_too_large_says_what_to_use(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--vocab_size", "5000"])
    assert "--vocab_size 5000 is more than this training text supports; use --vocab_size" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--vocab_size", "10"])
    assert "less than the" in err
