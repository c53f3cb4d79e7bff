"""Step 3, encode and binarize: each split's text into flat id arrays, offsets and lengths; training pairs
that are too long or too unbalanced dropped and counted.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attnx.data.corpus import ids_dtype
from attnx.data.errors import DataError
from attnx.data.prepare.read import CorpusStats
from attnx.data.prepare.settings import Settings
from attnx.data.text import read_chunks
from attnx.data.tokenizer import Tokenizer
from attnx.files import DISK_FULL, open_for_writing

KEPT = ".kept"
"""Scratch file beside the training lines file (`train.kept`): the corpus and line of each training pair written."""

ENCODE_LINES = 20_000
"""Lines encoded at once: SentencePiece returns Python lists of ints, about 36 bytes a token, so keep it modest."""


@dataclass
class SplitStats:
    """What `meta.json` records of one split: pairs and tokens written, pairs read and dropped, the inputs."""

    pairs: int
    src_tokens: int
    tgt_tokens: int
    read: int
    dropped: dict[str, int]
    inputs: dict[str, list[str]]
    max_id: dict[str, int] = field(default_factory=dict)
    """Largest token id in each language's `.bin`: what opening the corpus checks the file against."""
    corpora: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Training only: each corpus's pairs read and kept, dropped per reason, examples of dropped pairs, and
    `rows`: [first, end) of its pairs in the training split (each corpus's pairs follow the previous one's)."""
    language_id: str = ""
    """Training only: "on", or why language identification did not run."""
    alignments: dict[str, Any] = field(default_factory=dict)
    """With alignments: their files, the piece links written and the pairs that have any."""


def encode_chunk(
    pairs: tuple[list[str], list[str]], tokenizer: Tokenizer, threads: int
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((source ids, lengths), (target ids, lengths)) of a chunk: flat id arrays, one length per line."""
    dtype = ids_dtype(tokenizer.vocab_size)
    sides = []
    for lines in pairs:
        ids = tokenizer.encode_batch(lines, threads)
        lengths = np.fromiter(map(len, ids), np.int32, len(ids))
        sides.append((np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lengths.sum())), lengths))
    return sides[0], sides[1]


def _write_index(lengths_raw: Path, lengths_npy: Path, offsets_npy: Path) -> int:
    """`.len.npy` and `.idx.npy` from the raw int32 lengths, a block at a time; return the token count."""
    n = lengths_raw.stat().st_size // 4
    raw = np.memmap(lengths_raw, np.int32, mode="r") if n else np.zeros(0, np.int32)
    lengths = np.lib.format.open_memmap(lengths_npy, mode="w+", dtype=np.int32, shape=(n,))
    offsets = np.lib.format.open_memmap(offsets_npy, mode="w+", dtype=np.int64, shape=(n + 1,))
    for path in (lengths_npy, offsets_npy):
        _allocate(path)
    offsets[0] = total = 0
    for start in range(0, n, 1 << 22):
        block = np.asarray(raw[start : start + (1 << 22)])
        lengths[start : start + len(block)] = block
        offsets[start + 1 : start + 1 + len(block)] = total + np.cumsum(block, dtype=np.int64)
        total = int(offsets[start + len(block)])
    lengths.flush()
    offsets.flush()
    del lengths, offsets, raw
    return total


def _allocate(path: Path) -> None:
    """Give the (sparse) file behind a memory map its blocks now: on a full disk, an `OSError` naming it
    here rather than a SIGBUS when a page of the map is first written."""
    if not hasattr(os, "posix_fallocate"):  # macOS: a full disk stays the map's problem
        return
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as err:
            if err.errno in DISK_FULL:
                raise OSError(err.errno, err.strerror, str(path)) from None
            # a file system that cannot allocate ahead: written as it is mapped


def encode_split(
    name: str,
    src_text: Path,
    tgt_text: Path,
    out: Path,
    tokenizer: Tokenizer,
    settings: Settings,
    workers: int,
    corpora: list[CorpusStats] | None = None,
    lines: Path | None = None,
) -> tuple[int, int, int, dict[str, int]]:
    """Encode one normalized split into `{name}.{lang}.bin/.idx.npy/.len.npy`.

    Returns (pairs, source tokens, target tokens, largest id per language).

    Chunks are encoded on `workers` threads (SentencePiece's own; worker processes measured slower) and
    written as they come, so memory does not grow with the corpus. Training pairs over `max_sentence_tokens` tokens or the
    `max_ratio` length ratio are dropped and counted in `corpora`, the corpus and line of each pair read
    from `lines` (see [`clean_training_split`][attnx.data.prepare.clean.clean_training_split]).
    """
    codes = np.zeros(0, np.int64)
    if lines is not None and lines.stat().st_size:
        codes = np.memmap(lines, np.int64, mode="r")
    position = n = 0
    langs = {"src": settings.src_lang, "tgt": settings.tgt_lang}
    max_id = {side: -1 for side in langs}
    stems = {side: out / f"{name}.{lang}" for side, lang in langs.items()}
    files = {side: open_for_writing(f"{stem}.bin") for side, stem in stems.items()}
    files |= {f"{side}.len": open_for_writing(f"{stem}.len.raw") for side, stem in stems.items()}
    if lines is not None:  # the corpus and line of every pair written, for its alignment
        files["kept"] = open_for_writing(lines.with_suffix(KEPT))
    try:
        with tqdm(desc=f"encode {name}", unit=" pairs", disable=None, leave=False) as bar:
            chunks = zip(
                read_chunks(src_text, ENCODE_LINES), read_chunks(tgt_text, ENCODE_LINES), strict=True
            )
            for s, t in chunks:
                (src_ids, src_lens), (tgt_ids, tgt_lens) = encode_chunk((s, t), tokenizer, workers)
                ids = {"src": (src_ids, src_lens), "tgt": (tgt_ids, tgt_lens)}
                if corpora is not None:
                    code = np.asarray(codes[position : position + len(s)])
                    position += len(s)
                    keep = _keep(src_lens, tgt_lens, settings, corpora, code, s, t)
                    times = keep.astype(np.int64)
                    if settings.train_repeat:
                        times = times * np.asarray(settings.train_repeat)[code >> 32]
                        ids = {side: _repeat_rows(x, lens, times) for side, (x, lens) in ids.items()}
                    for corpus, rows in enumerate(np.bincount(code >> 32, times, len(corpora))):
                        corpora[corpus].written += int(rows)
                    if "kept" in files:  # the corpus and line of every pair written, for its alignment
                        files["kept"].write(np.repeat(code, times).astype(np.int64).tobytes())
                    if not settings.train_repeat and not keep.all():
                        ids = {
                            side: (x[np.repeat(keep, lens)], lens[keep]) for side, (x, lens) in ids.items()
                        }
                for side, (flat, lens) in ids.items():
                    files[side].write(flat.tobytes())
                    files[f"{side}.len"].write(lens.tobytes())
                    if len(flat):
                        max_id[side] = max(max_id[side], int(flat.max()))
                n += len(ids["src"][1])
                bar.update(len(s))
    finally:
        for f in files.values():
            f.close()
    totals = []
    for stem in stems.values():
        raw = Path(f"{stem}.len.raw")
        totals.append(_write_index(raw, Path(f"{stem}.len.npy"), Path(f"{stem}.idx.npy")))
        raw.unlink()
    if n == 0:
        dropped = sum((c.dropped for c in corpora or []), Counter())
        raise DataError(
            f"no training pair is left after dropping pairs over --max_sentence_tokens {settings.max_sentence_tokens} tokens or "
            f"--max_ratio {settings.max_ratio} ({dict(dropped)})"
        )
    return n, totals[0], totals[1], {langs[side]: m for side, m in max_id.items()}


def _repeat_rows(flat: np.ndarray, lens: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a flat id array (row `i`: `lens[i]` ids) each written `times[i]` times in a row (0: dropped)."""
    rows = np.repeat(np.arange(len(lens)), times)
    starts = (np.cumsum(lens) - lens)[rows]
    new_lens = lens[rows]
    first = np.cumsum(new_lens) - new_lens  # where each written row starts in the output
    index = np.repeat(starts - first, new_lens) + np.arange(int(new_lens.sum()))
    return flat[index], new_lens


def _keep(
    src: np.ndarray, tgt: np.ndarray, settings: Settings, corpora: list[CorpusStats], code: np.ndarray,
    src_text: list[str], tgt_text: list[str],
) -> np.ndarray:  # fmt: skip
    """fairseq/Moses-style cleaning: tokens in [1, max_len] on both sides and a bounded length ratio."""
    too_long = (src > settings.max_sentence_tokens) | (tgt > settings.max_sentence_tokens)
    empty = ~too_long & ((src == 0) | (tgt == 0))  # text that encodes to nothing
    ratio = np.maximum(src, tgt) / np.maximum(np.minimum(src, tgt), 1)
    bad_ratio = ~too_long & ~empty & (ratio > settings.max_ratio)
    keep = ~(too_long | empty | bad_ratio)
    corpus_of, line_of = code >> 32, code & 0xFFFFFFFF
    for corpus in np.unique(corpus_of):
        mine = corpus_of == corpus
        stats = corpora[int(corpus)]
        for reason, where in (("too_long", too_long), ("empty", empty), ("ratio", bad_ratio)):
            stats.drop(reason, where & mine, src_text, tgt_text, line_of)
        stats.pairs += int((keep & mine).sum())
    return keep
