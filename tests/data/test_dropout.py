"""attnx's BPE-dropout: with no dropout it is SentencePiece's own segmentation, with dropout more pieces of the
same text, and its draws depend on the seed alone (two processes draw the same)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from attnx.data.corpus import PreparedCorpus
from attnx.data.dropout import MergeTable, dropout_ids
from tests.conftest import REPO


def sentences(corpus: Path, n: int = 300) -> tuple[MergeTable, list[list[int]]]:
    prepared = PreparedCorpus(corpus)
    data = prepared.dataset("train")
    ids = [
        data.src_ids[data.src_offsets[i] : data.src_offsets[i] + data.src_lengths[i]].tolist()
        for i in range(n)
    ]
    return MergeTable(prepared.tokenizer.sp), ids


def test_without_dropout_it_is_sentencepiece_s_segmentation(corpus: Path) -> None:
    table, ids = sentences(corpus)
    texts = table.sp.decode(ids)
    assert dropout_ids(table, ids, 0.0, (1,)) == table.sp.encode(texts, out_type=int)


def test_dropout_writes_the_same_text_in_more_pieces(corpus: Path) -> None:
    table, ids = sentences(corpus)
    sampled = dropout_ids(table, ids, 0.3, (1,))
    assert table.sp.decode(sampled) == table.sp.decode(ids)
    assert sum(map(len, sampled)) > 1.2 * sum(map(len, ids))
    assert sampled != dropout_ids(table, ids, 0.3, (2,))
    assert sampled == dropout_ids(table, ids, 0.3, (1,))


def test_pieces_that_are_not_text_stay_as_they_are(corpus: Path) -> None:
    table, ids = sentences(corpus, 5)
    unk = table.sp.unk_id()
    marked = [[*x[:2], unk, *x[2:]] for x in ids]
    for got, want in zip(dropout_ids(table, marked, 0.5, (3,)), marked, strict=True):
        assert got.count(unk) == 1 and table.sp.decode(got) == table.sp.decode(want)


DRAW = """
import sys
from tests.data.test_dropout import sentences, dropout_ids
table, ids = sentences(sys.argv[1])
print(dropout_ids(table, ids, 0.2, (7, 1, 2)))
"""


def test_two_processes_draw_the_same_segmentations(corpus: Path) -> None:
    """SentencePiece's own BPE sampling differs from one process to the next; this must not."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", DRAW, str(corpus)], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) > 1000
    table, ids = sentences(corpus)
    assert runs[0].strip() == str(dropout_ids(table, ids, 0.2, (7, 1, 2)))
    assert np.mean([len(x) for x in eval(runs[0])]) > np.mean([len(x) for x in ids])  # noqa: S307
