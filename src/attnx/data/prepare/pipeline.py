"""The prepare pipeline: reuse or rebuild; read and clean, train SentencePiece, encode, publish, in that order."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from attnx.data.corpus import FORMAT_VERSION, META, SPM_MODEL, checksums, ids_dtype
from attnx.data.errors import DataError
from attnx.data.prepare.alignments import check_line_count, write_alignments
from attnx.data.prepare.clean import LINES, clean_training_split
from attnx.data.prepare.encode import KEPT, SplitStats, encode_split
from attnx.data.prepare.interrupt import Interrupted, uninterrupted
from attnx.data.prepare.publish import _publish, check_output, expected_files, scratch_directory
from attnx.data.prepare.read import CorpusStats, corpus_name, normalize_split
from attnx.data.prepare.reuse import corpus_reusable, fingerprints, model_reusable, read_meta
from attnx.data.prepare.settings import TRAIN, Inputs, Settings
from attnx.data.prepare.vocabulary import copy_sentencepiece, read_sentencepiece, train_sentencepiece
from attnx.data.tokenizer import Tokenizer
from attnx.files import WriteError, disk_full, write_failure

Texts = dict[str, tuple[Path, Path]]
"""Split name → (source, target) normalized text in the scratch directory."""


def prepare(
    inputs: Inputs,
    out: str | Path,
    settings: Settings,
    workers: int | None = None,
    spm_model: Path | None = None,
) -> dict[str, Any]:
    """Build (or reuse) the prepared corpus in `out`; return its `meta.json` content. `spm_model`: a
    SentencePiece model to use as it is (checked by
    [read_sentencepiece][attnx.data.prepare.vocabulary.read_sentencepiece]) instead of training one.

    Raises:
        DataError: `out` holds a file prepare did not write, or one of the inputs (nothing is touched then).
    """
    if TRAIN not in inputs.splits:
        raise DataError("a training split is required (--train)")
    out, workers = Path(out), workers or os.cpu_count() or 1
    old = read_meta(out)
    owned = check_output(out, inputs, old)
    corpus_fp, spm_fp = fingerprints(inputs, settings, spm_model)
    if old is not None and corpus_reusable(out, old, corpus_fp):
        old["reused"] = True
        return old
    replaced = False
    full_disk = FullDisk(out, existed=out.is_dir())
    try:
        with scratch_directory(out, owned) as work, full_disk:
            start = time.perf_counter()
            texts, stats, corpora = read_splits(inputs, work, settings, workers)
            seconds = {"read": time.perf_counter() - start}

            if spm_model is not None:
                tokenizer = copy_sentencepiece(spm_model, read_sentencepiece(spm_model, settings), work)
            elif model_reusable(out, old, spm_fp):
                tokenizer = Tokenizer.load(out / SPM_MODEL)
            else:
                tokenizer = train_sentencepiece(list(texts[TRAIN]), work, settings, workers)
            seconds["sentencepiece"] = time.perf_counter() - start - sum(seconds.values())

            encode_splits(inputs, texts, stats, corpora, work, tokenizer, settings, workers)
            seconds["encode"] = time.perf_counter() - start - sum(seconds.values())

            meta = {
                "format_version": FORMAT_VERSION,
                "src_lang": settings.src_lang,
                "tgt_lang": settings.tgt_lang,
                "vocab_size": tokenizer.vocab_size,
                "dtype": ids_dtype(tokenizer.vocab_size).name,
                "splits": {name: asdict(s) for name, s in stats.items()},
                "settings": asdict(settings),
                "fingerprint": corpus_fp,
                "spm_fingerprint": spm_fp,
                "seconds": {step: round(t, 2) for step, t in seconds.items()},
            }
            meta["files"] = expected_files(meta)
            meta["spm_sha256"] = tokenizer.sha256
            if spm_model is not None:  # where the vocabulary came from
                meta["spm_model"] = {"path": str(spm_model.resolve()), "sha256": tokenizer.sha256}
            sums = checksums(work, [f for f in meta["files"] if (work / f).is_file()])
            meta["checksums"] = {f: sums[f] if f in sums else old["checksums"][f] for f in meta["files"]}  # type: ignore[index]
            # Ctrl-C and SIGTERM wait while the new corpus replaces the old one, meta.json last
            with uninterrupted():
                full_disk.publishing = True
                _publish(out, work, meta, owned, fresh=[f for f in meta["files"] if (work / f).is_file()])
                replaced = True
    except Interrupted as stop:
        stop.corpus_replaced = replaced
        raise
    meta["reused"] = False
    return meta


class FullDisk:
    """Turns a full disk met while the corpus is built into one line, while the scratch directory still holds
    what filled it: the file prepare was writing (named as it would land in `out`), the free space, and what
    `out` holds once the scratch directory is gone."""

    def __init__(self, out: Path, existed: bool) -> None:
        self.out, self.existed = out, existed
        self.publishing = False
        """Set while the new files move into place: `meta.json` then marks the corpus incomplete."""

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: Any) -> None:
        full = disk_full(err) if isinstance(err, Exception) else None
        if full is None:
            return
        out = self.out
        path = out / Path(full.filename).name if full.filename else out
        if self.publishing:
            kept = f"{out}/{META} marks the corpus there incomplete, and the next run rebuilds it"
        elif self.existed:
            kept = f"{out} keeps what it held before"
        else:
            kept = f"{out}, made for it, is removed again"
        raise WriteError(
            write_failure(
                path,
                full,
                what="" if full.filename else "the corpus in",
                kept=kept,
                then="run the same command again",
                free_in=out,
            )
        ) from err


def read_splits(
    inputs: Inputs, work: Path, settings: Settings, workers: int
) -> tuple[Texts, dict[str, SplitStats], list[CorpusStats]]:
    """Step 1: every split's normalized text in `work`, the training split cleaned; (texts, split stats, stats of
    each training corpus)."""
    texts: Texts = {}
    stats: dict[str, SplitStats] = {}
    corpora: list[CorpusStats] = []
    for name, (srcs, tgts) in inputs.splits.items():
        texts[name] = (work / f"{name}.{settings.src_lang}", work / f"{name}.{settings.tgt_lang}")
        files = {"src": list(map(str, srcs)), "tgt": list(map(str, tgts))}
        if name == TRAIN:
            corpora, language_id = clean_training_split(
                srcs, tgts, *texts[name], work / LINES, settings, workers
            )
            stats[name] = SplitStats(0, 0, 0, sum(c.read for c in corpora), {}, files)
            stats[name].language_id = language_id or "on"
        else:
            read, _ = normalize_split(name, srcs, tgts, *texts[name])
            stats[name] = SplitStats(0, 0, 0, read, {}, files)
        if name in inputs.alignments:
            counts = [c.read for c in corpora] if name == TRAIN else [stats[name].read]
            for path, count, src in zip(inputs.alignments[name], counts, srcs, strict=True):
                check_line_count(path, count, src)
    return texts, stats, corpora


def encode_splits(
    inputs: Inputs, texts: Texts, stats: dict[str, SplitStats], corpora: list[CorpusStats], work: Path,
    tokenizer: Tokenizer, settings: Settings, workers: int,
) -> None:  # fmt: skip
    """Step 3: every split encoded into `work`; `stats` filled in with what was written and, for training, what
    each corpus lost."""
    for name, (src_text, tgt_text) in texts.items():
        train = name == TRAIN
        pairs, src_tokens, tgt_tokens, max_id = encode_split(
            name, src_text, tgt_text, work, tokenizer, settings, workers,
            corpora if train else None, work / LINES if train else None,
        )  # fmt: skip
        stats[name].pairs, stats[name].src_tokens, stats[name].tgt_tokens = pairs, src_tokens, tgt_tokens
        stats[name].max_id = max_id
        if name in inputs.alignments:
            codes = kept = None
            if train:
                codes = np.fromfile(work / LINES, np.int64)
                kept = np.fromfile((work / LINES).with_suffix(KEPT), np.int64)
            shifts = [int(bool(tag)) for tag in settings.train_tag] or [0] * len(inputs.alignments[name])
            stats[name].alignments = write_alignments(
                name, inputs.alignments[name], (src_text, tgt_text), work, tokenizer, shifts, codes, kept
            )
        if train:
            dropped = sum((c.dropped for c in corpora), Counter())
            stats[name].dropped = {k: v for k, v in dropped.items() if v}
            names = inputs.train_names or [corpus_name(p, settings.src_lang) for p in inputs.splits[TRAIN][0]]
            stats[name].corpora = {n: c.as_dict() for n, c in zip(names, corpora, strict=True)}
            ends = np.cumsum([c.written for c in corpora])
            for i, c in enumerate(stats[name].corpora.values()):
                c["rows"] = [int(ends[i] - corpora[i].written), int(ends[i])]
                if settings.train_repeat:
                    c["repeat"] = settings.train_repeat[i]
                if settings.train_tag and settings.train_tag[i]:
                    c["tag"] = settings.train_tag[i]
