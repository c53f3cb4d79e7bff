"""Encoding: training pairs too long or unbalanced dropped and counted, corpora repeated and tagged as asked."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from tests.data.conftest import run, sentences, translate, write_pair


def test_long_and_unbalanced_training_pairs_are_dropped_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = sentences(100, 1)
    tgt = translate(src)
    src[10] = " ".join(["dog"] * 50_000)  # one enormous line
    tgt[10] = " ".join(["cat"] * 50_000)
    src[20], tgt[20] = "the", "the man runs in the park with a big red ball under the house"
    src[30], tgt[30] = "", "blank source"
    write_pair(tmp_path / "raw" / "train", src, tgt)
    write_pair(tmp_path / "raw" / "valid", [src[10], "a dog"], [tgt[10], "a cat"])
    assert run(tmp_path / "raw", tmp_path / "out", "--valid", str(tmp_path / "raw" / "valid")) == 0
    printed = capsys.readouterr().out
    assert "dropped 3 of 100: 1 with a blank side, 1 over 250 tokens, 1 over length ratio 3.0" in printed
    corpus = PreparedCorpus(tmp_path / "out")
    assert len(corpus.dataset("train")) == 97
    kept = [i for i in range(100) if i not in (10, 20, 30)]  # the ids of every pair left are its own text's
    train = corpus.dataset("train")
    for j, i in enumerate(kept):
        assert [corpus.tokenizer.decode(x.tolist()) for x in train[j]] == [src[i], tgt[i]]
    valid = corpus.dataset("valid")  # never filtered
    assert len(valid) == 2 and int(valid.src_lengths[0]) > 250


def test_a_corpus_repeated_and_a_corpus_tagged_go_into_training_as_asked(toy: Path, tmp_path: Path) -> None:
    extra = sentences(50, 9)
    write_pair(tmp_path / "bt" / "train", extra, translate(extra))
    argv = ["--train", f"[{toy / 'train'}, {tmp_path / 'bt' / 'train'}]", "--train_repeat", "[3, 1]"]
    argv += ["--train_tag", '["", "<BT>"]', "--vocab_size", "70"]
    assert run(toy, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    train = corpus.dataset("train")
    assert len(train) == 3 * 300 + 50  # the real pairs three times, each copy a row of its own
    sp = corpus.tokenizer.sp
    tag = sp.piece_to_id("<BT>")
    assert tag > 3 and sp.id_to_piece(tag) == "<BT>"
    assert tag in sp.encode("<BT> a dog runs") and sp.encode("<BT>") == [sp.piece_to_id("▁"), tag]
    rows = [tuple(train[i][0].tolist()) for i in range(len(train))]
    assert sum(tag in row for row in rows) == 50  # every synthetic source, no real one
    real = Counter(row for row in rows if tag not in row)
    assert all(n % 3 == 0 for n in real.values()) and rows[0] == rows[1] == rows[2]
    meta = corpus.meta["splits"]["train"]["corpora"]
    assert [c.get("repeat") for c in meta.values()] == [3, 1] and [c.get("tag") for c in meta.values()] == [
        None,
        "<BT>",
    ]
