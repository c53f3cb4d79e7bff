"""Reading the splits: plain or gzip, strict UTF-8, aligned sides, several training corpora one after the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from tests.data.conftest import run, sentences, translate, write_pair

from .conftest import base, error_of


@pytest.mark.parametrize(
    ("src", "tgt", "message"),
    [
        (["a b"] * 5, ["c d"] * 4, r"train\.en has 5 lines but .*train\.de has 4"),
        (b"", b"", "are empty"),
        (b"caf\xe9 au lait\n" * 3, b"x\n" * 3, r"train\.en:1: invalid UTF-8"),
        (["", " "], ["a", "b"], "every training pair has a blank side"),
    ],
    ids=["line-counts", "empty", "utf8", "all-blank"],
)
def test_bad_training_files_exit_1_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], src, tgt, message: str
) -> None:
    write_pair(tmp_path / "train", src, tgt)
    err = error_of(capsys, base(tmp_path, tmp_path / "out") + ["--vocab_size", "20"])
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out" / "meta.json").exists()


def test_blank_validation_line_is_an_error(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pair(toy / "valid", ["a", "b", "c"], ["A", "", "C"])
    err = error_of(
        capsys, base(toy, tmp_path / "out") + ["--valid", str(toy / "valid"), "--vocab_size", "60"]
    )
    assert "valid.de:2: blank line" in err


def test_gzip_and_plain_inputs_agree(tmp_path: Path) -> None:
    src = sentences(200, 1)
    tgt = translate(src)
    write_pair(tmp_path / "a" / "train", src, tgt)
    write_pair(tmp_path / "b" / "train", src, [line.replace(" ", "  ") + "\r" for line in tgt], gz=True)
    assert run(tmp_path / "a", tmp_path / "out_a") == 0
    assert run(tmp_path / "b", tmp_path / "out_b") == 0
    for name in ("train.en.bin", "train.de.bin", "train.de.len.npy", "spm.vocab"):
        assert (tmp_path / "out_a" / name).read_bytes() == (tmp_path / "out_b" / name).read_bytes(), name


def test_several_training_corpora_are_concatenated(toy: Path, tmp_path: Path) -> None:
    extra = sentences(50, 9)
    write_pair(tmp_path / "more" / "train", extra, translate(extra), gz=True)
    argv = ["--train", f"[{toy / 'train'}, {tmp_path / 'more' / 'train'}]", "--valid", f"dev={toy / 'valid'}"]
    assert run(toy, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    assert corpus.splits == ["train", "dev"] and len(corpus.dataset("train")) == 350
    assert corpus.meta["splits"]["train"]["inputs"]["src"][1].endswith("more/train.en.gz")
