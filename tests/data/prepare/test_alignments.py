"""Word alignments in prepare: mapped onto the pieces, kept in step with the pairs cleaning keeps (and repeats),
and refused in one line naming the file and line (a link outside its pair, a line count that differs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnx.data.batching import collate_indices
from attnx.data.corpus import PreparedCorpus
from attnx.data.errors import DataError
from attnx.data.prepare.alignments import PieceMap, parse_links
from tests.data.conftest import run, sentences, translate, write, write_pair
from tests.data.prepare.conftest import base, error_of


def diagonal(src: list[str], tgt: list[str]) -> list[str]:
    return [
        " ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split()))))
        for s, t in zip(src, tgt, strict=True)
    ]


def test_a_bad_field_is_one_error_naming_the_file_and_line() -> None:
    assert parse_links("0-0 2-1  1-3\n", Path("a.align"), 4) == [(0, 0), (2, 1), (1, 3)]
    with pytest.raises(DataError, match=r"^a\.align:7: '0:1' is not a link"):
        parse_links("0-0 0:1", Path("a.align"), 7)


def test_each_word_link_links_every_piece_of_the_two_words(tmp_path: Path) -> None:
    src, tgt = ["xylophones are big", "one"], ["gross sind xylophone", "eins"]
    write_pair(tmp_path / "train", src * 40, tgt * 40)
    write(tmp_path / "train.align", ["0-2 2-0", ""] * 40)
    argv = [
        "--train_align",
        str(tmp_path / "train.align"),
        "--drop_duplicates",
        "false",
        "--vocab_size",
        "28",
    ]
    assert run(tmp_path, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    dataset, sp = corpus.dataset("train"), corpus.tokenizer.sp
    src_ids, tgt_ids = (list(map(int, ids)) for ids in dataset[0])
    assert len(src_ids) > 3 and len(tgt_ids) > 3  # a 60-piece vocabulary splits the words
    links = np.asarray(dataset.links[dataset.link_offsets[0] : dataset.link_offsets[1]], dtype=np.int64)

    def word_pieces(ids: list[int], text: str) -> list[int]:
        """The positions of the pieces of `text`, a word of the sentence `ids`."""
        words, at = [], -1
        for i in ids:
            at += sp.id_to_piece(i).startswith("▁")
            words.append(at)
        target = sp.decode(ids).split().index(text)
        return [k for k, w in enumerate(words) if w == target]

    expected = {
        (s, t)
        for a, b in [("xylophones", "xylophone"), ("big", "gross")]
        for s in word_pieces(src_ids, a)
        for t in word_pieces(tgt_ids, b)
    }
    assert {(int(s), int(t)) for s, t in links} == expected and len(links) == len(expected)
    assert sp.decode([src_ids[s] for s in sorted({s for s, _ in expected})]) == "xylophones big"
    assert np.diff(np.asarray(dataset.link_offsets))[1] == 0  # "one"/"eins" has no link
    batch = collate_indices(dataset, np.array([1, 0]))
    assert batch.alignment is not None and (batch.alignment[:, 0] == 1).all()  # only the row of pair 0
    assert {(int(t), int(s)) for _, t, s in batch.alignment} == {(t, s) for s, t in expected}


def test_pairs_that_cleaning_drops_or_repeats_take_their_alignment_line_along(tmp_path: Path) -> None:
    src = sentences(120, seed=5, lo=3, hi=8)
    src[10], src[20] = src[3], ""  # a duplicate and a blank pair: both dropped
    src[30] = " ".join([src[0].split()[0]] * 40)  # too long with --max_sentence_tokens 30
    tgt = translate(src)
    # a line of each even pair links its first words, an odd one's has no link: a shift shows at once
    lines = [("0-0" if k % 2 == 0 else "") for k in range(len(src))]
    write_pair(tmp_path / "train", src, tgt)
    write(tmp_path / "train.align", lines)
    argv = ["--train_align", str(tmp_path / "train.align"), "--max_sentence_tokens", "30"]
    assert run(tmp_path, tmp_path / "out", *argv, "--train_repeat", "[2]") == 0
    corpus = PreparedCorpus(tmp_path / "out")
    dataset = corpus.dataset("train")
    lines_of = [
        src.index(corpus.tokenizer.decode(list(map(int, dataset[i][0])))) for i in range(len(dataset))
    ]
    assert {10, 20, 30} & set(lines_of) == set() and lines_of[0] == lines_of[
        1
    ] == 0  # dropped; each pair twice
    counts = np.diff(np.asarray(dataset.link_offsets))
    expected = [k % 2 == 0 for k in lines_of]
    assert [bool(c) for c in counts] == expected
    assert corpus.meta["splits"]["train"]["alignments"]["pairs_with_links"] == sum(expected)


def small(toy: Path, out: Path) -> list[str]:
    return [*base(toy, out), "--vocab_size", "60", "--drop_wrong_language", "false"]


def test_a_link_outside_its_pair_is_one_line_naming_the_file_and_line(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = (toy / "train.en").read_text().splitlines()
    lines = diagonal(src, src)
    lines[6] = f"0-0 {len(src[6].split())}-0"
    write(tmp_path / "bad.align", lines)
    err = error_of(capsys, small(toy, tmp_path / "out") + ["--train_align", str(tmp_path / "bad.align")])
    assert f"{tmp_path / 'bad.align'}:7: link {len(src[6].split())}-0 is outside the pair" in err
    assert not (tmp_path / "out" / "meta.json").exists()


def test_an_alignment_file_of_another_length_is_refused_naming_both_counts(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = (toy / "train.en").read_text().splitlines()
    write(tmp_path / "short.align", diagonal(src, src)[:-2])
    err = error_of(capsys, small(toy, tmp_path / "out") + ["--train_align", str(tmp_path / "short.align")])
    assert (
        f"{tmp_path / 'short.align'} has 298 lines and the corpus it aligns ({toy / 'train.en'}) has 300"
        in err
    )
    err = error_of(capsys, small(toy, tmp_path / "out") + ["--train_align", "[a, b]"])
    assert "--train_align has 2 files for 1 --train corpora" in err
    err = error_of(capsys, small(toy, tmp_path / "out") + ["--valid_align", str(tmp_path / "short.align")])
    assert "--valid_align needs --valid" in err


def test_a_tagged_corpus_skips_its_tag_and_each_corpus_reads_its_own_file(tmp_path: Path) -> None:
    first, second = sentences(60, seed=7), sentences(60, seed=8)
    write_pair(tmp_path / "a", first, translate(first))
    write_pair(tmp_path / "b", second, translate(second))
    write(tmp_path / "a.align", ["0-0"] * 60)  # first words linked
    write(
        tmp_path / "b.align", ["1-0"] * 60
    )  # the second source word (after the tag) to the first target word
    argv = ["--train", f"[{tmp_path / 'a'}, {tmp_path / 'b'}]", "--train_tag", '["", "<BT>"]']
    argv += [
        "--train_align",
        f"[{tmp_path / 'a.align'}, {tmp_path / 'b.align'}]",
        "--drop_duplicates",
        "false",
    ]
    assert run(tmp_path, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    dataset, tokenizer = corpus.dataset("train"), corpus.tokenizer
    for i in (0, len(dataset) - 1):  # a pair of each corpus
        src_ids, tgt_ids = (list(map(int, ids)) for ids in dataset[i])
        links = np.asarray(
            dataset.links[dataset.link_offsets[i] : dataset.link_offsets[i + 1]], dtype=np.int64
        )
        text = tokenizer.decode(src_ids).split()
        source = tokenizer.decode([src_ids[s] for s in sorted(set(links[:, 0].tolist()))])
        target = tokenizer.decode([tgt_ids[t] for t in sorted(set(links[:, 1].tolist()))])
        assert source == (text[0] if i == 0 else text[2]), (i, text)  # past the tag: the aligner never saw it
        assert target == tokenizer.decode(tgt_ids).split()[0]


def test_the_word_of_each_piece_is_the_same_from_the_marks_and_from_the_offsets(corpus: Path) -> None:
    """The fast way (pieces that start a word carry `▁`) and the fallback (each piece's byte offset) agree."""
    tokenizer = PreparedCorpus(corpus).tokenizer
    pieces = PieceMap(tokenizer)
    lines = (corpus.parent / "train.de").read_text(encoding="utf-8").splitlines()[:200]
    for line in [" ".join(line.split()) for line in lines] + ["Zwei Männer öffnen ½ Tür"]:
        ids = tokenizer.encode(line)
        marked = pieces.words(line, ids)
        assert marked.tolist() == pieces.by_offsets(line).tolist(), line
        assert marked[-1] == len(line.split()) - 1
