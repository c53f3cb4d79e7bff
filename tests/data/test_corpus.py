"""A prepared corpus checks its files when it is opened: sizes at once, each file's SHA-256 before it is used."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnx.cli import main as attnx
from attnx.data.corpus import PreparedCorpus, ids_dtype
from attnx.data.datamodule import TranslationDataModule
from attnx.data.errors import DataError
from tests.checkpoints import tiny_checkpoint
from tests.training.conftest import TINY

from .conftest import run


def overwrite_ids(path: Path) -> None:
    """Swap two different in-vocabulary ids: same size, same largest id, other tokens."""
    ids = np.fromfile(path, np.uint16)
    first, other = 0, int(np.flatnonzero(ids != ids[0])[0])
    ids[first], ids[other] = ids[other], ids[first]
    path.write_bytes(ids.tobytes())


def reorder_index(path: Path) -> None:
    offsets = np.load(path)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")  # the same offsets, other sentences
    np.save(path, np.concatenate([[0], np.cumsum(lengths[order])]).astype(offsets.dtype))


def alter_lengths(path: Path) -> None:
    lengths = np.load(path)
    lengths[[0, 1]] = lengths[[1, 0]] + np.array([1, -1], lengths.dtype) * (lengths[0] == lengths[1])
    np.save(path, lengths)


def delete_a_line(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:3] + lines[4:]), encoding="utf-8")


DAMAGE = {
    "train.de.bin": overwrite_ids,
    "valid.de.bin": overwrite_ids,
    "train.en.idx.npy": reorder_index,
    "train.de.len.npy": alter_lengths,
    "valid.de": delete_a_line,
}


@pytest.fixture
def prepared(toy: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    assert run(toy, out, "--valid", str(toy / "valid"), "--test", str(toy / "test")) == 0
    return out


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_file_damaged_in_place_is_named_when_the_corpus_is_opened(prepared: Path, name: str) -> None:
    """Each damage keeps the ids inside the vocabulary and the largest id as it was, which the structural checks
    missed: the SHA-256 `meta.json` records catches it, in one line naming the file and what to do."""
    before = (prepared / name).read_bytes()
    DAMAGE[name](prepared / name)
    assert (prepared / name).read_bytes() != before
    split = name.split(".")[0]
    message = (
        rf"{prepared / name} (is not the file prepare wrote|has [\d,]+ bytes).*run `attnx prepare` again into"
    )
    with pytest.raises(DataError, match=message):
        corpus = PreparedCorpus(prepared)  # a deleted line changes the size: named at once
        corpus.dataset(split) if not name.endswith(".de") else corpus.references(split)
    with pytest.raises(DataError, match=message):  # fit checks the training and validation files at its start
        TranslationDataModule(str(prepared)).setup("fit")
    if name != "valid.de":  # (a size that changed is named whatever is opened)
        TranslationDataModule(str(prepared)).setup("test")  # the test split is whole: its command runs


def test_prepare_again_rebuilds_a_damaged_corpus(toy: Path, prepared: Path) -> None:
    overwrite_ids(prepared / "valid.de.bin")
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de", "--train",
               str(toy / "train"), "--valid", str(toy / "valid"), "--test", str(toy / "test"), "--vocab_size",
               "60", "--drop_wrong_language", "false", "--output", str(prepared)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (
        f"{prepared / 'valid.de.bin'} changed after it was prepared: preparing the corpus again"
        in done.stdout
    )
    PreparedCorpus(prepared).verify_split("valid")
    assert "reused" in subprocess.run(command, capture_output=True, text=True).stdout


def test_fit_on_a_damaged_corpus_is_one_line_before_training(prepared: Path, tmp_path: Path) -> None:
    delete_a_line(prepared / "valid.de")
    command = [sys.executable, "-m", "attnx", "fit", "--config", str(TINY), "--data.data_dir", str(prepared)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (
        done.stderr.strip().splitlines()[-1].startswith(f"attnx fit: error: {prepared / 'valid.de'} has ")
    ), done.stderr
    assert not list(tmp_path.glob("runs/tiny/version_*/checkpoints/*.ckpt"))


def test_a_vocabulary_size_edited_in_meta_json_is_one_line_in_fit_as_in_test(
    prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """meta.json's vocab_size doubled: fit built a model of that many pieces over the smaller SentencePiece model
    and trained on (test, validate and resume refused it, as another model than the checkpoint's). Every command
    reads the vocabulary size through one check against spm.model, before any model is built."""
    meta = json.loads((prepared / "meta.json").read_text())
    pieces = meta["vocab_size"]
    meta["vocab_size"] = 2 * pieces
    (prepared / "meta.json").write_text(json.dumps(meta))
    expected = (
        f"{prepared / 'meta.json'} records a vocabulary of {2 * pieces} pieces, spm.model has {pieces}: the corpus "
        f"changed after it was prepared; run `attnx prepare` again into {prepared} (the same command rebuilds it)"
    )
    with pytest.raises(DataError) as caught:
        assert TranslationDataModule(str(prepared)).vocab_size  # what fit links to the model's size
    assert str(caught.value) == expected
    with pytest.raises(DataError, match="records a vocabulary of"):
        assert PreparedCorpus(prepared).tokenizer
    checkpoint = tiny_checkpoint(prepared, tmp_path / "tiny.ckpt")  # of spm.model's size
    for command in (["fit", "--trainer.max_steps", "1"], ["test", "--ckpt_path", str(checkpoint)]):
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp_path)
            rc = attnx([*command, "--config", str(TINY), "--data.data_dir", str(prepared)])
        said = capsys.readouterr()
        assert rc == 1 and said.err.splitlines()[-1] == f"attnx {command[0]}: error: {expected}", said.err
    assert not list(tmp_path.glob("runs/tiny/version_*/checkpoints/*.ckpt"))


def test_a_corpus_without_checksums_opens_with_one_line(
    prepared: Path, caplog: pytest.LogCaptureFixture
) -> None:
    meta = json.loads((prepared / "meta.json").read_text())
    del meta["checksums"]
    (prepared / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            corpus = PreparedCorpus(prepared)
            assert len(corpus.dataset("train")) == 300 and len(corpus.references("valid")) == 20
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"attnx: {prepared} was prepared before attnx recorded checksums, so damage to its files "
                    "cannot be detected; run `attnx prepare` again to record them"]  # fmt: skip


def test_a_damaged_checksums_entry_is_one_error(prepared: Path) -> None:
    meta = json.loads((prepared / "meta.json").read_text())
    meta["checksums"]["train.de.bin"] = "0123"
    (prepared / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        DataError, match=r"meta\.json has a damaged 'checksums' entry: run `attnx prepare` again"
    ):
        PreparedCorpus(prepared)


def test_corpus_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a prepared corpus"):
        PreparedCorpus(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 0}))
    with pytest.raises(DataError, match="run `attnx prepare` again"):
        PreparedCorpus(tmp_path)


def test_ids_dtype() -> None:
    assert ids_dtype(8000) == np.uint16 and ids_dtype(65_535) == np.uint16 and ids_dtype(65_536) == np.int32


@pytest.mark.parametrize("damage", ["out-of-vocabulary", "changed", "truncated"])
def test_damaged_bin_is_named_when_the_corpus_is_opened(toy: Path, tmp_path: Path, damage: str) -> None:
    from attnx.data.datamodule import TranslationDataModule

    out = tmp_path / "out"
    assert run(toy, out) == 0
    path = out / "train.de.bin"
    ids = np.fromfile(path, np.uint16)
    recorded = PreparedCorpus(out).meta["splits"]["train"]["max_id"]["de"]
    assert recorded == ids.max() < 60
    if damage == "out-of-vocabulary":
        ids[len(ids) // 2] = 60_000
        unchecked = r"train\.de\.bin holds token id 60000, outside the vocabulary of 60 pieces"
    elif damage == "changed":
        ids[ids == recorded] = 4  # still inside the vocabulary, but not what was written
        unchecked = r"train\.de\.bin changed after it was prepared \(largest id"
    else:
        ids = ids[:-5]
        unchecked = r"train\.de\.bin holds .* ids but its index train\.de\.idx\.npy covers"
    message = {  # the size, else the SHA-256 that meta.json records, names it first
        "truncated": r"train\.de\.bin has [\d,]+ bytes, meta\.json records [\d,]+"
    }.get(
        damage,
        r"train\.de\.bin is not the file prepare wrote \(its SHA-256 is not the one meta\.json records\)",
    )
    path.write_bytes(ids.tobytes())
    with pytest.raises(DataError, match=message):
        PreparedCorpus(out).dataset("train")
    with pytest.raises(DataError, match=rf"{message}.*run `attnx prepare` again into"):
        TranslationDataModule(str(out)).train_dataloader()
    # without the checksums (a corpus of an earlier attnx) the ids themselves are still checked
    meta = json.loads((out / "meta.json").read_text())
    del meta["checksums"]
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=unchecked):
        PreparedCorpus(out).dataset("train")
