"""The whole pipeline on a real corpus: Multi30k prepared once, read back split by split."""

from __future__ import annotations

import errno
import gzip
import os
from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from attnx.data.errors import DataError
from attnx.data.text import normalize

from .conftest import attnx, base, error_of


def test_multi30k(multi30k: Path, shared_data: Path) -> None:
    corpus = PreparedCorpus(multi30k)
    assert (corpus.src_lang, corpus.tgt_lang, corpus.vocab_size) == ("en", "de", 8000)
    assert corpus.splits == ["train", "valid", "test"]
    meta = corpus.meta["splits"]
    assert (
        meta["train"]["read"] == 29_000 and meta["valid"]["pairs"] == 1_014 and meta["test"]["pairs"] == 1_000
    )
    assert meta["train"]["pairs"] + sum(meta["train"]["dropped"].values()) == 29_000
    assert corpus.tokenizer.vocab_size == 8000 and corpus.meta["dtype"] == "uint16"

    with gzip.open(shared_data / "multi30k" / "val.de.gz", "rt", encoding="utf-8") as f:
        raw = f.read().splitlines()
    refs = corpus.references("valid")
    assert refs == [normalize(line) for line in raw]
    valid = corpus.dataset("valid")
    assert len(valid) == len(refs) == len(corpus.sources("valid"))
    src, tgt = valid[7]
    assert corpus.tokenizer.decode(tgt.tolist()) == refs[7]
    assert corpus.tokenizer.decode(src.tolist()) == corpus.sources("valid")[7]
    assert int(valid.tgt_lengths[7]) == len(tgt)
    with pytest.raises(DataError, match="training text is not kept"):
        corpus.references("train")
    with pytest.raises(DataError, match="no split 'newstest'"):
        corpus.dataset("newstest")


def test_a_full_disk_is_one_line_naming_the_file_and_the_space(
    toy: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The disk fills as the index files are allocated (what a memory map would have met as a SIGBUS): one
    line naming the file as it lands in the output and the free space. An output made for the run is removed
    again, parents made for it too; an output that held a corpus keeps it, byte for byte."""

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "new" / "corpus"
    argv = [*base(toy, out), "--vocab_size", "60", "--drop_wrong_language", "false"]
    monkeypatch.setattr(os, "posix_fallocate", no_room, raising=False)
    err = error_of(capsys, argv)
    assert err.startswith(f"attnx prepare: error: cannot write {out}/train.en.len.npy: the disk is full (")
    assert f"MiB free in {out}); {out}, made for it, is removed again. Free disk space" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    monkeypatch.undo()
    assert attnx(["prepare", *argv]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(os, "posix_fallocate", no_room, raising=False)
    err = error_of(capsys, [*argv[:-3], "61", *argv[-2:]])
    assert f"{out} keeps what it held before" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
