"""A re-run reuses the corpus when its inputs (by content) and settings are the same, and rebuilds what changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from tests.data.conftest import run, sentences, translate, write_pair

from .conftest import attnx_prepare


def test_cli_prepare_reports_and_reuses(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["--valid", str(toy / "valid"), "--test", f"[{toy / 'test'}, other={toy / 'valid'}]"]
    assert run(toy, out, *args) == 0
    printed = capsys.readouterr().out
    assert "prepared en-de corpus" in printed and "train: 300 pairs" in printed
    corpus = PreparedCorpus(out)
    assert corpus.splits == ["train", "valid", "test", "other"]
    assert corpus.references("other") == corpus.references("valid")
    assert not (out / "tmp").exists() and not (out / "train.en").exists()

    stamp = (out / "train.en.bin").stat().st_mtime_ns
    assert run(toy, out, *args) == 0
    assert "reused" in capsys.readouterr().out
    assert (out / "train.en.bin").stat().st_mtime_ns == stamp


def test_changed_input_or_setting_rebuilds(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run(toy, out) == 0
    spm_stamp = (out / "spm.model").stat().st_mtime_ns

    assert (
        run(toy, out, "--max_sentence_tokens", "8") == 0
    )  # encoding setting: rebuild, same SentencePiece model
    assert "prepared" in capsys.readouterr().out
    assert (out / "spm.model").stat().st_mtime_ns == spm_stamp
    assert PreparedCorpus(out).meta["splits"]["train"]["dropped"]["too_long"] > 0

    write_pair(toy / "train", sentences(200, 7), translate(sentences(200, 7)))  # new training text: retrain
    assert run(toy, out, "--max_sentence_tokens", "8") == 0
    assert (out / "spm.model").stat().st_mtime_ns != spm_stamp
    assert PreparedCorpus(out).meta["splits"]["train"]["read"] == 200

    assert run(toy, out, "--max_sentence_tokens", "8", "--test", str(toy / "test")) == 0
    assert "test" in PreparedCorpus(out).splits
    assert (
        run(toy, out, "--max_sentence_tokens", "8") == 0
    )  # the test set is gone again, and so are its files
    assert "test" not in PreparedCorpus(out).splits and not (out / "test.en.bin").exists()


def test_reuse_is_decided_on_content_not_size_and_time(toy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ("--train", toy / "train", "--vocab_size", 60, "--output", out)
    assert "prepared" in attnx_prepare(*argv).stdout
    assert "reused" in attnx_prepare(*argv).stdout
    first = PreparedCorpus(out).dataset("train")[0][0].tolist()

    path = toy / "train.en"
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[0] = ord("X") if data[0] != ord("X") else ord("Y")  # one byte, same size, same modification time
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns

    result = attnx_prepare(*argv)
    assert result.returncode == 0 and "prepared" in result.stdout and "reused" not in result.stdout
    assert PreparedCorpus(out).dataset("train")[0][0].tolist() != first
