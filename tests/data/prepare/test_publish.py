"""Prepare writes only its own files: an output holding anything else is refused and left alone, and what a
killed run left is cleaned up (the real command, in a subprocess where it matters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from attnx.data.errors import DataError
from tests.data.conftest import run

from .conftest import attnx_prepare, base, error_of, one_error_line


def test_unwritable_output_is_an_error_not_a_traceback(toy: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    err = error_of(capsys, base(toy, tmp_path / "file" / "out") + ["--vocab_size", "60"])
    assert "file" in err


def test_output_holding_the_users_files_is_refused_and_left_alone(toy: Path, tmp_path: Path) -> None:
    mydir = tmp_path / "mydir"
    (mydir / "tmp").mkdir(parents=True)
    (mydir / "tmp" / "notes.txt").write_text("my notes\n")
    (mydir / "firmware.bin").write_bytes(b"\x7fELF firmware")
    err = one_error_line(attnx_prepare("--train", toy / "train", "--vocab_size", 60, "--output", mydir))
    assert "did not write (firmware.bin, tmp/)" in err and "pass a new or empty directory" in err
    assert sorted(p.name for p in mydir.rglob("*")) == ["firmware.bin", "notes.txt", "tmp"]
    assert (mydir / "tmp" / "notes.txt").read_text() == "my notes\n"
    assert (mydir / "firmware.bin").read_bytes() == b"\x7fELF firmware"

    # a file the user adds to a prepared corpus later is just as safe: the rebuild is refused, the file kept
    out = tmp_path / "out"
    assert attnx_prepare("--train", toy / "train", "--vocab_size", 60, "--output", out).returncode == 0
    (out / "tmp").mkdir()
    (out / "tmp" / "notes.txt").write_text("mine")
    err = one_error_line(attnx_prepare("--train", toy / "train", "--vocab_size", 61, "--output", out))
    assert "tmp/" in err and (out / "tmp" / "notes.txt").read_text() == "mine"
    assert PreparedCorpus(out).vocab_size == 60


def test_output_holding_an_input_is_refused_and_the_input_untouched(toy: Path, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in toy.iterdir()}
    for output in (toy, toy.parent):  # the input directory itself, and one that contains it
        err = one_error_line(
            attnx_prepare(
                "--train", toy / "train", "--valid", toy / "valid", "--vocab_size", 60, "--output", output
            )
        )
        assert "holds the input" in err and "pass a directory apart from the raw text" in err
        assert {p.name: p.read_bytes() for p in toy.iterdir()} == before


def test_what_a_killed_run_left_is_cleaned_up_and_nothing_else(toy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(toy, out, "--test", str(toy / "test")) == 0
    files = json.loads((out / "meta.json").read_text())["files"]
    assert set(files) | {"meta.json"} == {p.name for p in out.iterdir()}
    # SIGKILL while moving files into place: a scratch directory and a meta.json that says "incomplete"
    scratch = out / ".attnx-prepare-killed"
    scratch.mkdir()
    (scratch / "SCRATCH-OF-ATTNX-PREPARE").write_text("")
    (scratch / "train.en.bin").write_bytes(b"partial")
    meta = {"format_version": 1, "incomplete": True, "files": files}
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="incomplete: an `attnx prepare` into it was interrupted"):
        PreparedCorpus(out)
    # a look-alike directory the user made is not prepare's: refused, kept
    (out / ".attnx-prepare-mine").mkdir()
    with pytest.raises(DataError, match=r"did not write \(\.attnx-prepare-mine/\)"):
        run_in_process(toy, out)
    (out / ".attnx-prepare-mine").rmdir()
    assert run(toy, out) == 0  # the test split is gone: its files go, the scratch directory too
    assert {p.name for p in out.iterdir()} == set(PreparedCorpus(out).meta["files"]) | {"meta.json"}
    assert not (out / "test.en.bin").exists() and len(PreparedCorpus(out).dataset("train")) == 300


def run_in_process(raw: Path, out: Path) -> None:
    from attnx.data.prepare import Inputs, Settings, prepare

    settings = Settings("en", "de", 60, drop_wrong_language=False)
    prepare(Inputs.from_prefixes({"train": [raw / "train"]}, "en", "de"), out, settings)
