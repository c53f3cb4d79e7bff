"""The joint SentencePiece model: a vocabulary size the text cannot support is one line saying what to use."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.data.prepare.vocabulary import sample_sentences
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


def multi30k_slice(shared_data: Path, raw: Path, pairs: int = 400) -> Path:
    """The first `pairs` training and 50 validation pairs of Multi30k en-de, as plain text under `raw`."""
    raw.mkdir(parents=True)
    for split, n in (("train", pairs), ("val", 50)):
        for lang in ("en", "de"):
            with gzip.open(shared_data / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (raw / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    return raw


@pytest.mark.parametrize("sample_size", [None, "500"])
def test_the_same_prepare_writes_the_same_bytes_wherever_it_runs(
    shared_data: Path, tmp_path: Path, sample_size: str | None
) -> None:
    """Two clones preparing the same corpus: other folders for the text, the output and the temporary files, and
    other thread counts. SentencePiece recorded its scratch folder's path (and the threads) in spm.model, so a
    checkpoint from one clone was refused against the other's data, and a text of more than --sample_size
    sentences (here 800 of 500) was sampled anew at every run; every file but meta.json (which records where the
    inputs were and how long each step took) is now the same, byte for byte."""
    outputs = []
    for clone, out, workers in (("one", "data/multi30k", "1"), ("two", "elsewhere/deeper/corpus", "2")):
        raw = multi30k_slice(shared_data, tmp_path / clone / "raw")
        (tmp_path / clone / "tmp").mkdir()
        argv = ["--vocab_size", "300", "--workers", workers, "--train", raw / "train", "--valid", raw / "val"]
        argv += ["--sample_size", sample_size] if sample_size else []
        result = subprocess.run(
            [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de", "--output",
             tmp_path / clone / out, *map(str, argv)],
            capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path / clone / "tmp")},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        outputs.append(tmp_path / clone / out)
    one, two = outputs
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in two.iterdir()) and "spm.model" in names
    for name in names:
        if name != "meta.json":
            assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert b".attnx-prepare-" not in (one / "spm.model").read_bytes()
    meta_one, meta_two = (json.loads((o / "meta.json").read_text()) for o in outputs)
    assert meta_one["spm_sha256"] == meta_two["spm_sha256"]
    assert meta_one["checksums"] == meta_two["checksums"]


def test_a_text_larger_than_the_sample_is_sampled_the_same_with_the_same_seed(tmp_path: Path) -> None:
    """SentencePiece's own sampling drew another sample at every run whatever its seed; attnx draws it: exactly
    --sample_size sentences of the text, in the text's order, the same for the same --seed."""
    en, de = tmp_path / "train.en", tmp_path / "train.de"
    en.write_text("".join(f"en {i}\n" for i in range(300)))
    de.write_text("".join(f"de {i}\n" for i in range(200)) + "de last")  # no newline at its end
    text = en.read_text().splitlines() + de.read_text().splitlines()
    assert sample_sentences([en, de], 501, 1, tmp_path / "all.txt") == ([en, de], 501)
    assert not (tmp_path / "all.txt").exists()
    drawn = []
    for seed, name in ((1, "a.txt"), (1, "b.txt"), (2, "c.txt")):
        files, total = sample_sentences([en, de], 120, seed, tmp_path / name)
        assert files == [tmp_path / name] and total == 501
        lines = (tmp_path / name).read_text().splitlines()
        positions = [text.index(line) for line in lines]
        assert len(lines) == 120 and positions == sorted(
            set(positions)
        )  # distinct lines of the text, in order
        drawn.append(lines)
    assert drawn[0] == drawn[1] != drawn[2]
    assert {line[:2] for line in drawn[0]} == {"en", "de"}


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
