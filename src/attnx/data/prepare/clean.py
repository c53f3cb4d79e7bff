"""Step 1, cleaning the training split: the reading filters, then language identification on worker processes;
what is left is written for the next steps.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attnx.data.cleaning import identifier, languages_of, start_worker, wrong_language
from attnx.data.errors import DataError
from attnx.data.prepare.read import Chunk, CorpusStats, read_and_filter, select
from attnx.data.prepare.settings import Settings
from attnx.files import open_for_writing

LINES = "train.lines"
"""Scratch file: corpus and line number of every training pair that survives cleaning (int64 each)."""


def language_id_note(settings: Settings) -> str | None:
    """Why language identification does not run for these settings, or None when it does."""
    if not settings.drop_wrong_language:
        return "off (--drop_wrong_language false)"
    known = identifier().known
    unknown = [lang for lang in (settings.src_lang, settings.tgt_lang) if lang not in known]
    if unknown:
        return f"off: the language identifier does not know {', '.join(map(repr, unknown))}"
    return None


def clean_training_split(
    srcs: list[Path], tgts: list[Path], src_out: Path, tgt_out: Path, lines_out: Path, settings: Settings,
    workers: int,
) -> tuple[list[CorpusStats], str | None]:  # fmt: skip
    """Read every training corpus, drop blank, copied, duplicate and wrong-language pairs, write what is left.

    `lines_out` receives, for each pair written, `corpus << 32 | line number`: what lets the length filters
    of the encoding step count per corpus and quote the line of an example. Returns the stats of each corpus and
    why language identification did not run (None when it did).
    """
    corpora = [CorpusStats() for _ in srcs]
    note = language_id_note(settings)
    chunks: Iterator[Chunk] = read_and_filter(srcs, tgts, settings, corpora)
    pool = None
    with (
        open_for_writing(src_out, text=True) as fs,
        open_for_writing(tgt_out, text=True) as ft,
        open_for_writing(lines_out) as fl,
        tqdm(desc="read and clean train", unit=" pairs", disable=None, leave=False) as bar,
    ):
        try:
            if note is None:
                chunks, pool = _identify_languages(chunks, settings, corpora, workers)
            for corpus, lines, s, t in chunks:
                bar.update(len(s))
                if not s:
                    continue
                fs.write("\n".join(s) + "\n")
                ft.write("\n".join(t) + "\n")
                fl.write(((corpus << 32) | lines).astype(np.int64).tobytes())
        finally:
            if pool is not None:
                pool.terminate()
    if not sum(c.read - sum(c.dropped.values()) for c in corpora):
        reasons = Counter(sum((c.dropped for c in corpora), Counter()))
        if set(reasons) == {"blank"}:
            raise DataError(f"every training pair has a blank side ({', '.join(map(str, srcs + tgts))})")
        raise DataError(f"no training pair is left after cleaning (dropped: {dict(reasons)})")
    return corpora, note


def _identify_languages(
    chunks: Iterator[Chunk], settings: Settings, corpora: list[CorpusStats], workers: int
) -> tuple[Iterator[Chunk], Any]:
    """Drop pairs whose either side is identified as another language, in `workers` processes."""
    pending: deque[Chunk] = deque()

    def texts() -> Iterator[tuple[list[str], list[str]]]:
        for chunk in chunks:
            pending.append(chunk)
            yield chunk[2], chunk[3]

    identifier()  # loaded once here, inherited by the worker processes
    pool = None
    if workers > 1:
        # forked with the stop signals blocked: each worker unblocks them once its handlers are the defaults
        # (start_worker), so a terminate() that comes sooner still ends it
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=start_worker)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        found: Iterator[tuple[list[str], list[str]]] = pool.imap(languages_of, texts())
    else:
        found = map(languages_of, texts())

    def filtered() -> Iterator[Chunk]:
        for src_found, tgt_found in found:
            corpus, lines, s, t = pending.popleft()
            wrong = wrong_language(src_found, tgt_found, settings.src_lang, settings.tgt_lang)
            notes = [f"{a}-{b}" for a, b in zip(src_found, tgt_found, strict=True)]
            corpora[corpus].drop("language", wrong, s, t, lines, notes)
            yield corpus, *select(~wrong, lines, s, t)  # type: ignore[misc]

    return filtered(), pool
