"""Step 3b, alignments: an aligner's word links (Pharaoh format) turned into links between the pairs' pieces.

An alignment file has one line per line of its corpus, `i-j` pairs separated by spaces (`0-0 1-2 2-1`): source
word `i` is linked to target word `j`, 0-based, where the words of a line are its whitespace-separated tokens —
what eflomal and fast_align align. Each line is checked against its pair (every index below the pair's word
counts), and each link becomes links between every piece of the source word and every piece of the target word
(the pieces of a word: the SentencePiece pieces from the one that starts it, marked `▁`, up to the next start).
Words, not pieces, are aligned so that the files are made once from the raw text, whatever the vocabulary, and
follow the corpus's lines: the pairs cleaning drops take their alignment line with them. A training corpus with
a `--train_tag` has the tag as its first source word; the aligner's source indices are shifted past it.

Written beside the pieces ([`ALIGNMENT`][attnx.data.corpus.ALIGNMENT]): uint16 (source piece, target piece)
links and an int64 index of each pair's first link.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attnx.data.corpus import ALIGNMENT
from attnx.data.errors import DataError
from attnx.data.prepare.encode import _write_index
from attnx.data.text import count_lines, read_chunks
from attnx.data.tokenizer import Tokenizer
from attnx.files import open_for_writing

WORD_START = "▁"
MAX_PIECES = 2**16 - 1
"""Pieces per sentence the uint16 links can index (`--max_sentence_tokens` must not exceed it)."""


def parse_links(line: str, path: Path, number: int) -> list[tuple[int, int]]:
    """The `(source word, target word)` links of one Pharaoh line (`number`: 1-based, for the message)."""
    links = []
    for field in line.split():
        i, sep, j = field.partition("-")
        if not (sep and i.isdigit() and j.isdigit()):
            raise DataError(
                f"{path}:{number}: {field!r} is not a link: write Pharaoh format, 0-based `source-target` word "
                "pairs separated by spaces (e.g. 0-0 1-2)"
            )
        links.append((int(i), int(j)))
    return links


def check_line_count(path: Path, expected: int, corpus: Path) -> None:
    """One line per line of the corpus (whose source side is `corpus`), or a line naming both counts."""
    lines = count_lines(path)
    if lines != expected:
        raise DataError(
            f"{path} has {lines:,} lines and the corpus it aligns ({corpus}) has {expected:,}: give the alignments "
            "of that very corpus, one line per pair (a blank line for a pair without links)"
        )


class PieceMap:
    """Which word of its line each piece belongs to."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        sp = tokenizer.sp
        self.tokenizer = tokenizer
        self.starts = np.array([sp.id_to_piece(i).startswith(WORD_START) for i in range(sp.get_piece_size())])

    def words(self, text: str, ids: list[int]) -> np.ndarray:
        """`(pieces,)` the 0-based word of each piece of `text` (encoded as `ids`)."""
        index = np.cumsum(self.starts[np.asarray(ids, dtype=np.int64)]) - 1
        if len(ids) and index[0] == 0 and index[-1] == len(text.split()) - 1:
            return index
        # a word without a marked piece (one the normalization removes, a user-defined symbol first)
        return self.by_offsets(text)

    def by_offsets(self, text: str) -> np.ndarray:
        """[`words`][attnx.data.prepare.alignments.PieceMap.words] from where each piece begins in `text`'s bytes
        (the slower way, for the lines whose marks do not count their words)."""
        pieces = self.tokenizer.sp.encode(text, return_type="proto").pieces
        spaces = np.cumsum(np.frombuffer(text.encode(), np.uint8) == ord(" "))  # spaces up to each byte
        return np.array([spaces[min(p.begin, len(spaces) - 1)] for p in pieces], dtype=np.int64)


def piece_links(
    links: list[tuple[int, int]], src_words: np.ndarray, tgt_words: np.ndarray, shift: int
) -> np.ndarray:
    """`(M, 2)` (source piece, target piece) links of word `links` (source indices shifted by `shift`)."""
    out = [
        np.stack(np.meshgrid(np.flatnonzero(src_words == i + shift), np.flatnonzero(tgt_words == j)), -1)
        for i, j in links
    ]
    if not out:
        return np.zeros((0, 2), np.uint16)
    return np.unique(np.concatenate([o.reshape(-1, 2) for o in out]), axis=0).astype(np.uint16)


def write_alignments(
    name: str,
    files: list[Path],
    texts: tuple[Path, Path],
    out: Path,
    tokenizer: Tokenizer,
    shifts: list[int],
    codes: np.ndarray | None = None,
    kept: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write `{name}.align.bin` and `{name}.align.idx.npy` in `out` from the word alignments `files` (one per
    corpus of the split); return what `meta.json` records of them.

    `texts`: the split's normalized (source, target) text, one pair a line. For training, `codes` are the
    `corpus << 32 | line` of each line of `texts` and `kept` those of the pairs written, in order (a repeated
    pair once per copy); elsewhere each line of `texts` is the line of the same number of the one file.
    """
    pieces = PieceMap(tokenizer)
    readers = [_numbered(path) for path in files]
    read_at = [0] * len(files)
    links_file = open_for_writing(out / f"{name}{ALIGNMENT[0]}")
    counts_file = open_for_writing(out / f"{name}.align.len.raw")
    total = aligned = position = 0
    try:
        for src, tgt in zip(read_chunks(texts[0]), read_chunks(texts[1]), strict=True):
            chunk = np.arange(position + 1, position + 1 + len(src), dtype=np.int64)
            chunk = chunk if codes is None else np.asarray(codes[position : position + len(src)])
            position += len(src)
            times = np.ones(len(src), np.int64)
            if kept is not None:
                times = np.searchsorted(kept, chunk, "right") - np.searchsorted(kept, chunk, "left")
            src_ids, tgt_ids = tokenizer.encode_batch(src), tokenizer.encode_batch(tgt)
            for k in np.flatnonzero(times):
                corpus, line = (0, int(chunk[k])) if codes is None else divmod(int(chunk[k]), 1 << 32)
                text, read_at[corpus] = _advance(readers[corpus], read_at[corpus], line)
                links = parse_links(text, files[corpus], line)
                words = (len(src[k].split()) - shifts[corpus], len(tgt[k].split()))
                _check_links(links, words, files[corpus], line)
                found = piece_links(
                    links, pieces.words(src[k], src_ids[k]), pieces.words(tgt[k], tgt_ids[k]), shifts[corpus]
                )
                for _ in range(int(times[k])):
                    links_file.write(found.tobytes())
                    counts_file.write(np.int32(len(found)).tobytes())
                total += len(found) * int(times[k])
                aligned += int(times[k]) * bool(len(found))
    finally:
        links_file.close()
        counts_file.close()
    raw = out / f"{name}.align.len.raw"
    _write_index(raw, out / f"{name}.align.len.npy", out / f"{name}{ALIGNMENT[1]}")
    raw.unlink()
    (out / f"{name}.align.len.npy").unlink()
    return {"files": [str(p.resolve()) for p in files], "links": total, "pairs_with_links": aligned}


def _numbered(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                yield raw.decode("ascii")
            except UnicodeDecodeError:
                raise DataError(
                    f"{path}:{number}: not a Pharaoh line (bytes other than digits, '-' and spaces)"
                ) from None


def _advance(reader: Iterator[str], at: int, line: int) -> tuple[str, int]:
    """Line `line` (1-based) of `reader`, which has given `at` lines so far."""
    text = ""
    for _ in range(line - at):
        text = next(reader)
    return text, line


def _check_links(links: list[tuple[int, int]], words: tuple[int, int], path: Path, line: int) -> None:
    bad = next(((i, j) for i, j in links if i >= words[0] or j >= words[1]), None)
    if bad is not None:
        raise DataError(
            f"{path}:{line}: link {bad[0]}-{bad[1]} is outside the pair, which has {words[0]} source and "
            f"{words[1]} target words (0-based): align the very text files given to prepare, split at whitespace"
        )
