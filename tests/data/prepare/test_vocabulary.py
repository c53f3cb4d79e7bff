"""The joint SentencePiece model: a vocabulary size the text cannot support is one line saying what to use."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from attnx.cli import main as attnx
from tests.data.conftest import run

from .conftest import base, error_of


def test_vocab_too_large_says_what_to_use(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--vocab_size", "5000"])
    assert "--vocab_size 5000 is more than this training text supports; use --vocab_size" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--vocab_size", "10"])
    assert "less than the" in err


def test_a_brought_sentencepiece_model_is_copied_unchanged_and_recorded(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trained = tmp_path / "trained"
    assert run(toy, trained) == 0
    brought = tmp_path / "shared.model"
    brought.write_bytes((trained / "spm.model").read_bytes())
    out = tmp_path / "out"
    assert (
        attnx(["prepare", *base(toy, out), "--spm_model", str(brought), "--drop_wrong_language", "false"])
        == 0
    )
    assert "copied as it is (nothing trained)" in capsys.readouterr().out
    assert (out / "spm.model").read_bytes() == brought.read_bytes()
    assert (out / "spm.vocab").read_text(encoding="utf-8") == (trained / "spm.vocab").read_text(
        encoding="utf-8"
    )
    meta = json.loads((out / "meta.json").read_text())
    digest = hashlib.sha256(brought.read_bytes()).hexdigest()
    assert meta["vocab_size"] == 60 and meta["spm_sha256"] == digest  # the size read from the model
    assert meta["spm_model"] == {"path": str(brought.resolve()), "sha256": digest}
    assert (out / "train.de.bin").read_bytes() == (trained / "train.de.bin").read_bytes()  # the same pieces


def test_a_brought_model_that_cannot_serve_is_one_line_naming_it(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sentencepiece as spm

    out, text = tmp_path / "out", tmp_path / "spm.vocab"
    text.write_text("<unk>\t0\n", encoding="utf-8")
    err = error_of(capsys, [*base(toy, out), "--spm_model", str(text)])
    assert f"--spm_model {text} is not a SentencePiece model" in err
    other = tmp_path / "default_ids.model"
    writer = io.BytesIO()
    lines = (toy / "train.en").read_text(encoding="utf-8").splitlines()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=writer, vocab_size=40, minloglevel=2
    )
    other.write_bytes(writer.getvalue())
    err = error_of(capsys, [*base(toy, out), "--spm_model", str(other)])
    assert (
        f"--spm_model {other} has special ids pad/unk/bos/eos = (-1, 0, 1, 2); attnx needs (0, 1, 2, 3)"
        in err
    )
    trained = tmp_path / "trained"
    assert run(toy, trained) == 0
    capsys.readouterr()
    err = error_of(capsys, [*base(toy, out), "--spm_model", str(trained / "spm.model"), "--vocab_size", "80"])
    assert "--vocab_size 80 but --spm_model" in err and "has 60 pieces: leave out --vocab_size" in err
    err = error_of(capsys, [*base(toy, out), "--spm_model", str(trained / "spm.model"), "--sample_size", "9"])
    assert "--sample_size shapes the training of a SentencePiece model" in err
    assert not out.exists()  # refused before anything was written


def test_a_folder_for_spm_model_says_it_is_a_folder_and_names_its_spm_model(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "prepared"
    folder.mkdir()
    err = error_of(capsys, [*base(toy, tmp_path / "out"), "--spm_model", str(folder)])
    assert f"--spm_model {folder} is a folder: pass a SentencePiece model file (.model)" in err
    (folder / "spm.model").write_bytes(b"")
    err = error_of(capsys, [*base(toy, tmp_path / "out"), "--spm_model", str(folder)])
    assert f"(it holds spm.model: --spm_model {folder / 'spm.model'})" in err
