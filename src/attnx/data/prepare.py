"""`attnx prepare`: raw parallel text → joint SentencePiece BPE model → memory-mapped binarized corpus.

Pipeline, one pass per step over each split:

1. read every split (plain or gzip, strict UTF-8), normalize whitespace, check that the two sides align;
   training pairs with a blank side are dropped and counted, any other split must be complete;
2. train one SentencePiece BPE model on the source and target training text together (§5.1, shared vocabulary),
   with attnx's fixed special ids (pad 0, unk 1, bos 2, eos 3);
3. encode every split on all cores, drop training pairs over `--max_sentence_tokens` tokens or the `--max_ratio` length
   ratio (counted, never validation or test pairs), and write the flat id arrays, offsets and lengths;
4. write `meta.json` last: a directory without it is incomplete, whatever else is there.

A re-run with the same input files (path and SHA-256 of their bytes) and settings reuses the directory; a changed
input or setting rebuilds it (and retrains SentencePiece only if its own inputs or settings changed).

Whose files are whose: prepare writes every new file into a hidden scratch directory it creates inside the output
(`.attnx-prepare-XXXXXXXX`, marked as its own), moves them into place only when all are written, and lists them in
`meta.json` (`files`). It deletes only files listed there by an earlier run and its own scratch directories. It
refuses an output directory that holds anything else, or that holds one of the inputs, so it never deletes,
truncates or overwrites a file it did not write; an interrupted run leaves the previous corpus as it was.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from attnx.data.cleaning import (
    SeenPairs,
    copies,
    identifier,
    languages_of,
    pair_keys,
    start_worker,
    wrong_language,
)
from attnx.data.corpus import FORMAT_VERSION, META, SPM_MODEL, checksums, ids_dtype
from attnx.data.errors import DataError
from attnx.data.text import read_aligned, read_chunks, read_pairs, resolve
from attnx.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

TRAIN = "train"
ENCODE_LINES = 20_000
"""Lines encoded at once: SentencePiece returns Python lists of ints, about 36 bytes a token, so keep it modest."""
SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SCRATCH_PREFIX = ".attnx-prepare-"
SCRATCH_MARK = "SCRATCH-OF-ATTNX-PREPARE"
"""The file that marks a scratch directory as prepare's own, so a run killed before removing it is cleaned up."""


@dataclass
class Settings:
    """Everything that determines the prepared corpus besides the input files."""

    src_lang: str
    tgt_lang: str
    vocab_size: int = 8000
    max_sentence_tokens: int = 250
    max_ratio: float = 3.0
    sample_size: int = 10_000_000
    character_coverage: float = 1.0
    seed: int = 1
    drop_duplicates: bool = True
    drop_copies: bool = True
    drop_wrong_language: bool = True
    user_defined_symbols: tuple[str, ...] = ()
    """Pieces SentencePiece keeps whole wherever they occur (besides every `train_tag`)."""
    train_repeat: tuple[int, ...] = ()
    """Per training corpus, how many times its kept pairs go into the training split (upsampling); () is once each."""
    train_tag: tuple[str, ...] = ()
    """Per training corpus, a token put before each source sentence ("" for none), kept whole; () is none."""

    def spm_part(self) -> dict[str, Any]:
        """The settings that shape SentencePiece's training text and model."""
        keys = (
            "vocab_size",
            "sample_size",
            "character_coverage",
            "seed",
            "user_defined_symbols",
            "train_tag",
        )
        return {k: getattr(self, k) for k in keys + CLEANING}

    def symbols(self) -> list[str]:
        """SentencePiece's `user_defined_symbols`: the given ones, then the tags."""
        return list(dict.fromkeys([*self.user_defined_symbols, *filter(None, self.train_tag)]))


CLEANING = ("drop_duplicates", "drop_copies", "drop_wrong_language")
EXAMPLES = 3
"""Dropped pairs kept as examples per corpus and reason (meta.json and --report)."""
EXAMPLE_CHARS = 200
LINES = "train.lines"
"""Scratch file: corpus and line number of every training pair that survives cleaning (int64 each)."""


@dataclass
class Inputs:
    """Split name → (source files, target files); train may concatenate several corpora."""

    splits: dict[str, tuple[list[Path], list[Path]]] = field(default_factory=dict)

    @classmethod
    def from_prefixes(cls, prefixes: dict[str, list[str]], src_lang: str, tgt_lang: str) -> Inputs:
        splits = {}
        for name, ps in prefixes.items():
            splits[name] = ([resolve(p, src_lang) for p in ps], [resolve(p, tgt_lang) for p in ps])
        return cls(splits)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes: reuse is decided on content, never on size and modification time."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from e


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def fingerprints(inputs: Inputs, settings: Settings) -> tuple[str, str]:
    """(whole corpus, SentencePiece model): digests of the input files' paths and contents and of the settings
    that shape each."""
    stats = {
        name: [[[str(p.resolve()), file_digest(p)] for p in side] for side in sides]
        for name, sides in inputs.splits.items()
    }
    spm_fp = _digest({"format": FORMAT_VERSION, "train": stats[TRAIN], **settings.spm_part()})
    corpus_fp = _digest({"format": FORMAT_VERSION, "inputs": stats, "settings": asdict(settings)})
    return corpus_fp, spm_fp


def _read_meta(out: Path) -> dict[str, Any] | None:
    """`out/meta.json` when it is one attnx wrote (a JSON object with a format version), else None."""
    try:
        meta = json.loads((out / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "format_version" in meta else None


# --- step 1: read, check, normalize ---------------------------------------------------------------------


def normalize_split(
    name: str, srcs: list[Path], tgts: list[Path], src_out: Path, tgt_out: Path
) -> tuple[int, Counter[str]]:
    """Write the normalized, aligned text of a validation or test split; return (pairs read, nothing dropped)."""
    n_read = 0
    with (
        open(src_out, "w", encoding="utf-8") as fs,
        open(tgt_out, "w", encoding="utf-8") as ft,
        tqdm(desc=f"read {name}", unit=" pairs", disable=None, leave=False) as bar,
    ):
        for src, tgt in zip(srcs, tgts, strict=True):
            for s, t in read_pairs(src, tgt):
                fs.write("\n".join(s) + "\n")
                ft.write("\n".join(t) + "\n")
                n_read += len(s)
                bar.update(len(s))
    return n_read, Counter()


@dataclass
class CorpusStats:
    """One training corpus: pairs read and kept, dropped per reason, a few dropped pairs per reason."""

    read: int = 0
    pairs: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def drop(self, reason: str, where: np.ndarray, src: list[str], tgt: list[str], lines: np.ndarray,
             notes: Sequence[str] | None = None) -> None:  # fmt: skip
        """Count the pairs where `where` is True under `reason`; keep the first few as examples."""
        hits = np.flatnonzero(where)
        if not len(hits):
            return
        self.dropped[reason] += len(hits)
        examples = self.examples.setdefault(reason, [])
        for i in hits[: EXAMPLES - len(examples)]:
            example = {"line": int(lines[i]), "src": src[i][:EXAMPLE_CHARS], "tgt": tgt[i][:EXAMPLE_CHARS]}
            if notes is not None:
                example["found"] = notes[i]
            examples.append(example)

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "pairs": self.pairs,
            "dropped": dict(self.dropped),
            "examples": self.examples,
        }


def corpus_name(path: Path, lang: str) -> str:
    """A training corpus by the prefix it was given as: `raw/wmt14_ende/commoncrawl`."""
    return str(path).removesuffix(".gz").removesuffix(f".{lang}")


def _select(keep: np.ndarray, *columns: Any) -> list[Any]:
    if keep.all():
        return list(columns)
    at = np.flatnonzero(keep)
    return [column[at] if isinstance(column, np.ndarray) else [column[i] for i in at] for column in columns]


def _read_and_filter(
    srcs: list[Path], tgts: list[Path], settings: Settings, corpora: list[CorpusStats]
) -> Iterator[tuple[int, np.ndarray, list[str], list[str]]]:
    """(corpus, line numbers, source, target) chunks left after the blank, copy and duplicate filters."""
    seen = SeenPairs()
    for corpus, (src, tgt) in enumerate(zip(srcs, tgts, strict=True)):
        stats, first = corpora[corpus], 1
        tag = settings.train_tag[corpus] if settings.train_tag else ""
        for s, t in read_aligned(src, tgt):
            if tag:  # e.g. back-translations marked as such (Caswell et al. 2019)
                s = [f"{tag} {x}" if x else x for x in s]
            lines = np.arange(first, first + len(s), dtype=np.int64)
            first += len(s)
            stats.read += len(s)
            blank = np.fromiter((not x or not y for x, y in zip(s, t, strict=True)), bool, len(s))
            stats.drop("blank", blank, s, t, lines)
            s, t, lines = _select(~blank, s, t, lines)
            if settings.drop_copies:
                copy = copies(s, t)
                stats.drop("copy", copy, s, t, lines)
                s, t, lines = _select(~copy, s, t, lines)
            if settings.drop_duplicates and s:
                duplicate = ~seen.first_seen(pair_keys(s, t))
                stats.drop("duplicate", duplicate, s, t, lines)
                s, t, lines = _select(~duplicate, s, t, lines)
            yield corpus, lines, s, t


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
    chunks: Iterator[tuple[int, np.ndarray, list[str], list[str]]] = _read_and_filter(
        srcs, tgts, settings, corpora
    )
    pool = None
    with (
        open(src_out, "w", encoding="utf-8") as fs,
        open(tgt_out, "w", encoding="utf-8") as ft,
        open(lines_out, "wb") as fl,
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
    chunks: Iterator[tuple[int, np.ndarray, list[str], list[str]]],
    settings: Settings,
    corpora: list[CorpusStats],
    workers: int,
) -> tuple[Iterator[tuple[int, np.ndarray, list[str], list[str]]], Any]:
    """Drop pairs whose either side is identified as another language, in `workers` processes."""
    pending: deque[tuple[int, np.ndarray, list[str], list[str]]] = deque()

    def texts() -> Iterator[tuple[list[str], list[str]]]:
        for chunk in chunks:
            pending.append(chunk)
            yield chunk[2], chunk[3]

    identifier()  # loaded once here, inherited by the worker processes
    pool = None
    if workers > 1:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=start_worker)
        found: Iterator[tuple[list[str], list[str]]] = pool.imap(languages_of, texts())
    else:
        found = map(languages_of, texts())

    def filtered() -> Iterator[tuple[int, np.ndarray, list[str], list[str]]]:
        for src_found, tgt_found in found:
            corpus, lines, s, t = pending.popleft()
            wrong = wrong_language(src_found, tgt_found, settings.src_lang, settings.tgt_lang)
            notes = [f"{a}-{b}" for a, b in zip(src_found, tgt_found, strict=True)]
            corpora[corpus].drop("language", wrong, s, t, lines, notes)
            yield corpus, *_select(~wrong, lines, s, t)  # type: ignore[misc]

    return filtered(), pool


# --- step 2: the joint SentencePiece model ----------------------------------------------------------------


def train_sentencepiece(texts: list[Path], out: Path, settings: Settings, workers: int) -> None:
    """Train the joint BPE model on `texts` (both languages) into `out/spm.model`."""
    spm.set_random_generator_seed(settings.seed)
    print(
        f"training SentencePiece BPE, {settings.vocab_size} pieces, on both sides of the cleaned training text"
    )
    try:
        spm.SentencePieceTrainer.train(
            input=[str(t) for t in texts],
            model_prefix=str(out / Path(SPM_MODEL).stem),
            model_type="bpe",
            vocab_size=settings.vocab_size,
            character_coverage=settings.character_coverage,
            input_sentence_size=settings.sample_size,
            shuffle_input_sentence=True,
            num_threads=workers,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            minloglevel=2,
            **({"user_defined_symbols": settings.symbols()} if settings.symbols() else {}),
        )
    except RuntimeError as e:
        message = str(e)
        if m := re.search(r"set it to a value <= (\d+)", message):
            raise DataError(
                f"--vocab_size {settings.vocab_size} is more than this training text supports; "
                f"use --vocab_size {m.group(1)} or less"
            ) from None
        if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message):
            raise DataError(
                f"--vocab_size {settings.vocab_size} is less than the {m.group(2)} pieces this text needs "
                f"(its characters plus 4 special ids); use a larger --vocab_size or a --character_coverage below "
                f"{settings.character_coverage}"
            ) from None
        raise DataError(f"SentencePiece training failed: {message}") from None


# --- step 3: encode and binarize --------------------------------------------------------------------------


@dataclass
class SplitStats:
    pairs: int
    src_tokens: int
    tgt_tokens: int
    read: int
    dropped: dict[str, int]
    inputs: dict[str, list[str]]
    max_id: dict[str, int] = field(default_factory=dict)
    """Largest token id in each language's `.bin`: what opening the corpus checks the file against."""
    corpora: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Training only: each corpus's pairs read and kept, dropped per reason, and examples of dropped pairs."""
    language_id: str = ""
    """Training only: "on", or why language identification did not run."""


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
    from `lines` (see `clean_training_split`).
    """
    codes = np.zeros(0, np.int64)
    if lines is not None and lines.stat().st_size:
        codes = np.memmap(lines, np.int64, mode="r")
    position = n = 0
    langs = {"src": settings.src_lang, "tgt": settings.tgt_lang}
    max_id = {side: -1 for side in langs}
    stems = {side: out / f"{name}.{lang}" for side, lang in langs.items()}
    files = {side: open(f"{stem}.bin", "wb") for side, stem in stems.items()}  # noqa: SIM115
    files |= {f"{side}.len": open(f"{stem}.len.raw", "wb") for side, stem in stems.items()}  # noqa: SIM115
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
                    if settings.train_repeat:
                        times = keep * np.asarray(settings.train_repeat)[code >> 32]
                        ids = {side: _repeat_rows(x, lens, times) for side, (x, lens) in ids.items()}
                    elif not keep.all():
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


# --- the whole pipeline ---------------------------------------------------------------------------------


def prepare(
    inputs: Inputs, out: str | Path, settings: Settings, workers: int | None = None
) -> dict[str, Any]:
    """Build (or reuse) the prepared corpus in `out`; return its `meta.json` content.

    Raises:
        DataError: `out` holds a file prepare did not write, or one of the inputs (nothing is touched then).
    """
    if TRAIN not in inputs.splits:
        raise DataError("a training split is required (--train)")
    out, workers = Path(out), workers or os.cpu_count() or 1
    old = _read_meta(out)
    owned = check_output(out, inputs, old)
    corpus_fp, spm_fp = fingerprints(inputs, settings)
    if old and old.get("fingerprint") == corpus_fp and not old.get("incomplete") and _complete(out, old):
        damage = _damage(out, old)
        if damage is None:
            old["reused"] = True
            return old
        print(f"{damage}: preparing the corpus again")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create --output {out}: {e.strerror or e}") from e
    # Ctrl-C and SIGTERM wait while a directory is half removed (its mark may go first, and the next run would
    # take it for the user's), between creating the scratch directory and marking it as prepare's, and while
    # the new corpus replaces the old one: each of those ends in a state the next run understands
    work: Path | None = None
    replaced = False
    try:
        try:
            with uninterrupted():
                for name in owned:  # scratch directories of a run that was killed before it could remove them
                    if name.startswith(SCRATCH_PREFIX):
                        shutil.rmtree(out / name, ignore_errors=True)
                work = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out))
                (work / SCRATCH_MARK).write_text(
                    "attnx prepare writes here and moves its files into place when done\n"
                )
            start = time.perf_counter()
            stats: dict[str, SplitStats] = {}
            texts: dict[str, tuple[Path, Path]] = {}
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

            seconds = {"read": time.perf_counter() - start}
            reuse_spm = (
                old is not None
                and old.get("spm_fingerprint") == spm_fp
                and not old.get("incomplete")
                and (out / SPM_MODEL).is_file()
                and _damage(out, old, [SPM_MODEL, Path(SPM_MODEL).with_suffix(".vocab").name]) is None
            )
            if not reuse_spm:
                train_sentencepiece(list(texts[TRAIN]), work, settings, workers)
            model_file = (out if reuse_spm else work) / SPM_MODEL
            tokenizer = Tokenizer.load(model_file)
            seconds["sentencepiece"] = time.perf_counter() - start - sum(seconds.values())

            for name, (src_text, tgt_text) in texts.items():
                train = name == TRAIN
                pairs, src_tokens, tgt_tokens, max_id = encode_split(
                    name, src_text, tgt_text, work, tokenizer, settings, workers,
                    corpora if train else None, work / LINES if train else None,
                )  # fmt: skip
                stats[name].pairs, stats[name].src_tokens, stats[name].tgt_tokens = (
                    pairs,
                    src_tokens,
                    tgt_tokens,
                )
                stats[name].max_id = max_id
                if train:
                    dropped = sum((c.dropped for c in corpora), Counter())
                    stats[name].dropped = {k: v for k, v in dropped.items() if v}
                    names = [corpus_name(p, settings.src_lang) for p in inputs.splits[TRAIN][0]]
                    stats[name].corpora = {n: c.as_dict() for n, c in zip(names, corpora, strict=True)}
                    for i, c in enumerate(stats[name].corpora.values()):
                        if settings.train_repeat:
                            c["repeat"] = settings.train_repeat[i]
                        if settings.train_tag and settings.train_tag[i]:
                            c["tag"] = settings.train_tag[i]
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
            meta["files"] = _expected_files(meta)
            meta["spm_sha256"] = tokenizer.sha256
            sums = checksums(work, [f for f in meta["files"] if (work / f).is_file()])
            meta["checksums"] = {f: sums[f] if f in sums else old["checksums"][f] for f in meta["files"]}  # type: ignore[index]
            with uninterrupted():
                _publish(out, work, meta, owned, fresh=[f for f in meta["files"] if (work / f).is_file()])
                replaced = True
        finally:
            if work is not None:
                with uninterrupted():
                    shutil.rmtree(work, ignore_errors=True)
    except Interrupted as stop:
        stop.corpus_replaced = replaced
        raise
    meta["reused"] = False
    return meta


def _expected_files(meta: dict[str, Any]) -> list[str]:
    """The files of a complete corpus described by `meta` (without `meta.json` itself)."""
    files = [SPM_MODEL, Path(SPM_MODEL).with_suffix(".vocab").name]
    for name in meta["splits"]:
        for lang in (meta["src_lang"], meta["tgt_lang"]):
            files += [f"{name}.{lang}.bin", f"{name}.{lang}.idx.npy", f"{name}.{lang}.len.npy"]
            if name != TRAIN:
                files.append(f"{name}.{lang}")
    return files


def _damage(out: Path, meta: dict[str, Any], names: list[str] | None = None) -> str | None:
    """Why the files `names` (default: all) of the corpus in `out` cannot be reused, or None when each has the
    size and SHA-256 `meta` records. A corpus prepared before checksums were kept cannot be checked, so it is
    not reused either: preparing it again records them."""
    recorded = meta.get("checksums")
    if not isinstance(recorded, dict):
        return f"{out} was prepared before attnx recorded checksums"
    for name in list(recorded) if names is None else names:
        path = out / name
        entry = recorded.get(name)
        if not isinstance(entry, dict) or not path.is_file() or path.stat().st_size != entry.get("bytes"):
            return f"{path} changed after it was prepared"
    sums = checksums(out, list(recorded) if names is None else names)
    changed = next((name for name, entry in sums.items() if entry != recorded[name]), None)
    return None if changed is None else f"{out / changed} changed after it was prepared"


def _complete(out: Path, meta: dict[str, Any]) -> bool:
    return all((out / f).is_file() for f in meta.get("files") or _expected_files(meta))


def owned_files(out: Path, meta: dict[str, Any] | None) -> set[str]:
    """Names in `out` that an earlier `attnx prepare` wrote: those `meta.json` lists (or, for a corpus of an
    attnx that did not list them, those its splits imply), `meta.json` itself and prepare's scratch directories."""
    names: set[str] = set()
    if meta is not None:
        names.add(META)
        if isinstance(meta.get("files"), list):
            names.update(f for f in meta["files"] if isinstance(f, str) and "/" not in f)
        elif isinstance(meta.get("splits"), dict) and {"src_lang", "tgt_lang"} <= meta.keys():
            names.update(_expected_files(meta))
    if out.is_dir():
        for path in out.iterdir():
            if path.name.startswith(SCRATCH_PREFIX) and (path / SCRATCH_MARK).is_file():
                names.add(path.name)
    return names


def check_output(out: Path, inputs: Inputs, meta: dict[str, Any] | None) -> set[str]:
    """Refuse an output directory holding an input or a file prepare did not write; return what it did write."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--output {out} is a file, not a directory: pass a new directory as --output")
    root = out.resolve()
    for srcs, tgts in inputs.splits.values():
        for path in srcs + tgts:
            if path.resolve().is_relative_to(root):
                raise DataError(
                    f"--output {out} holds the input {path}: prepare writes there, so pass a directory apart from "
                    f"the raw text as --output (e.g. --output {out.name}-prepared beside it)"
                )
    if not out.is_dir():
        return set()
    owned = owned_files(out, meta)
    # a report of an earlier run (`--report OUT/report.md`) is prepare's too, and stays
    unknown = sorted(
        p.name + "/" * p.is_dir() for p in out.iterdir() if p.name not in owned and not is_report(p)
    )
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise DataError(
            f"--output {out} holds files attnx prepare did not write ({shown}); it never deletes or overwrites "
            "them: pass a new or empty directory as --output"
        )
    return owned


def _write_meta(out: Path, work: Path, meta: dict[str, Any]) -> None:
    """Replace `out/meta.json` in one step (written in the scratch directory, then renamed)."""
    (work / META).write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(work / META, out / META)


def _publish(out: Path, work: Path, meta: dict[str, Any], owned: set[str], fresh: list[str]) -> None:
    """Move the new files into `out`, delete the earlier run's files this one no longer has, write the meta.

    While files move, `meta.json` says the corpus is incomplete and lists every file of both runs, so a run
    killed here is neither read as a corpus nor loses track of a file it wrote.
    """
    everything = sorted((owned - {META}) | set(meta["files"]))
    _write_meta(out, work, {"format_version": FORMAT_VERSION, "incomplete": True, "files": everything})
    for name in fresh:
        os.replace(work / name, out / name)
    for name in owned - set(meta["files"]) - {META}:
        path = out / name
        if path.is_file() and not path.is_symlink() and not name.startswith(SCRATCH_PREFIX):
            path.unlink()
    _write_meta(out, work, meta)


# --- command line -----------------------------------------------------------------------------------------


def _reasons(settings: dict[str, Any]) -> dict[str, str]:
    return {
        "blank": "with a blank side",
        "copy": "with the target a copy of the source",
        "duplicate": "duplicating an earlier pair",
        "language": "in another language",
        "too_long": f"over {settings['max_sentence_tokens']} tokens",
        "ratio": f"over length ratio {settings['max_ratio']}",
        "empty": "that encode to no token",
    }


def _dropped(dropped: dict[str, int], read: int, reasons: dict[str, str]) -> str:
    parts = [f"{n:,} {reasons.get(k, k)}" for k, n in dropped.items() if n]
    return f"dropped {sum(dropped.values()):,} of {read:,}: " + ", ".join(parts) if parts else "dropped none"


def report(meta: dict[str, Any]) -> str:
    """What `attnx prepare` prints: the corpus, each split, and for training what each corpus lost and why."""
    lines = [
        f"{'reused' if meta.get('reused') else 'prepared'} {meta['src_lang']}-{meta['tgt_lang']} corpus, "
        f"vocabulary {meta['vocab_size']} ({meta['dtype']} ids)"
    ]
    reasons = _reasons(meta["settings"])
    for name, s in meta["splits"].items():
        line = f"  {name}: {s['pairs']:,} pairs, {s['src_tokens']:,} + {s['tgt_tokens']:,} tokens"
        if s["dropped"]:
            line += "; " + _dropped(s["dropped"], s["read"], reasons)
        lines.append(line)
        corpora = s.get("corpora") or {}
        if len(corpora) > 1:
            for corpus, c in corpora.items():
                used = f" (used {c['repeat']} times)" if c.get("repeat", 1) != 1 else ""
                used += f", sources tagged {c['tag']}" if c.get("tag") else ""
                lines.append(
                    f"    {corpus}: {c['pairs']:,} pairs{used}; " + _dropped(c["dropped"], c["read"], reasons)
                )
        if s.get("language_id") not in (None, "", "on"):
            lines.append(f"    language identification {s['language_id']}")
    return "\n".join(lines)


REPORT_HEADER = "# attnx prepare: what cleaning dropped"


def report_markdown(meta: dict[str, Any], output: str | Path) -> str:
    """The `--report` file: per training corpus and reason, how many pairs were dropped, with examples."""
    reasons = _reasons(meta["settings"])
    train = meta["splits"][TRAIN]
    out = [REPORT_HEADER, "", f"Corpus `{output}`, {meta['src_lang']}-{meta['tgt_lang']}.", ""]
    out += [f"Language identification: {train.get('language_id', 'on')}.", ""]
    out += ["| corpus | read | kept | " + " | ".join(reasons) + " |"]
    out += ["|---|---:|---:|" + "---:|" * len(reasons)]
    for corpus, c in train.get("corpora", {}).items():
        counts = " | ".join(f"{c['dropped'].get(k, 0):,}" for k in reasons)
        out.append(f"| {corpus} | {c['read']:,} | {c['pairs']:,} | {counts} |")
    for corpus, c in train.get("corpora", {}).items():
        for reason, examples in c.get("examples", {}).items():
            out += ["", f"## {corpus}: {c['dropped'].get(reason, 0):,} {reasons.get(reason, reason)}", ""]
            for e in examples:
                found = f" (identified as {e['found']})" if "found" in e else ""
                out.append(f"- line {e['line']}{found}: `{e['src']}` → `{e['tgt']}`")
    return "\n".join(out) + "\n"


def is_report(path: Path) -> bool:
    """Whether `path` is a `--report` file attnx prepare wrote (a regular file that starts with its header)."""
    if not path.is_file() or path.is_symlink():
        return False
    try:
        with open(path, "rb") as f:
            return f.readline().rstrip(b"\n") == REPORT_HEADER.encode()
    except OSError:
        return False


def write_report(path: Path, meta: dict[str, Any], output: str | Path) -> None:
    """Write the `--report` file; a file of that name is replaced only if an earlier report wrote it."""
    if path.exists() and not is_report(path):
        raise DataError(
            f"--report {path} exists and is not a report attnx wrote; pass a new file name (the corpus in "
            f"{output} is ready)"
        )
    try:
        path.write_text(report_markdown(meta, output), encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot write --report {path}: {e.strerror or e}") from e


def _named(value: str, default: str) -> tuple[str, str]:
    name, sep, prefix = value.partition("=")
    if not sep:
        return default, value
    if not SPLIT_NAME.fullmatch(name) or name == TRAIN:
        raise DataError(
            f"bad split name {name!r} in {value!r}: use letters, digits, '_', '.', '-', not 'train'"
        )
    return name, prefix


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Interrupted(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, `kill`) or Ctrl-C during prepare: unwinds like Ctrl-C, so the scratch
    directory is removed. `corpus_replaced` says whether the new corpus was already in place."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.corpus_replaced = False


class _Deferred:
    """Signals that came during [uninterrupted][attnx.data.prepare.uninterrupted] blocks, raised after them."""

    depth = 0
    pending: int | None = None


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then raise
    [Interrupted][attnx.data.prepare.Interrupted].

    Both layers: the signals are blocked (so no handler runs), and prepare's own handler defers one whose
    handler was already on its way when the block began (Python runs a handler some bytecodes after the
    signal, so blocking alone can still see it raised inside the block).
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _Deferred.depth += 1
    try:
        yield
    finally:
        _Deferred.depth -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if _Deferred.depth == 0 and _Deferred.pending is not None:
            signum, _Deferred.pending = _Deferred.pending, None
            raise Interrupted(signum)


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """SIGTERM and Ctrl-C raise [Interrupted][attnx.data.prepare.Interrupted] while this is held (after the
    [uninterrupted][attnx.data.prepare.uninterrupted] block they come in, if any).

    A signal that comes after `attnx prepare` has said everything, while Python shuts down, is ignored: the
    command has finished, its last line says where the corpus is, and its status stays 0.
    """

    def stop(signum: int, frame: Any) -> None:
        if _Deferred.depth:
            _Deferred.pending = signum
        else:
            raise Interrupted(signum)

    try:
        previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        atexit.unregister(_ignore_stop_signals)  # once, however many times prepare runs in this process
        atexit.register(_ignore_stop_signals)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _stopped(stop: Interrupted, output: str | Path, replaced: bool, report_file: str | Path | None) -> int:
    """Say what an interrupted prepare left (one line on standard error); return the exit status."""
    for signum in STOP_SIGNALS:  # a second signal does not cut the line (`_stop_signals` restores them)
        signal.signal(signum, signal.SIG_IGN)
    how = "SIGTERM" if stop.signum == signal.SIGTERM else "Ctrl-C"
    if replaced:
        left = (
            f"{output} holds the complete corpus (run the same command again to print its report"
            f"{' and write --report ' + str(report_file) if report_file is not None else ''}; it reuses the "
            "corpus)"
        )
    else:
        left = f"{output} keeps what it held before (run the same command again to finish)"
    sys.stdout.flush()
    print(f"attnx prepare: interrupted by {how}; {left}", file=sys.stderr, flush=True)
    return 128 + stop.signum


def check_per_corpus(settings: Settings, corpora: int) -> None:
    """One `--train_repeat` count (>= 1) and one `--train_tag` (one piece, or "") per `--train` corpus."""
    for option, values in (("--train_repeat", settings.train_repeat), ("--train_tag", settings.train_tag)):
        if values and len(values) != corpora:
            raise DataError(
                f"{option} has {len(values)} values for {corpora} --train corpora: give one per corpus, in order"
            )
    if any(n < 1 for n in settings.train_repeat):
        raise DataError(f"--train_repeat counts must be at least 1, got {list(settings.train_repeat)}")
    for symbol in [*settings.train_tag, *settings.user_defined_symbols]:
        if symbol != symbol.strip() or len(symbol.split()) > 1 or symbol in ("<pad>", "<unk>", "<s>", "</s>"):
            raise DataError(
                f"{symbol!r} cannot be a tag or a user-defined symbol: use one word without spaces that is not "
                "<pad>, <unk>, <s> or </s> (e.g. <BT>)"
            )
    if "" in settings.user_defined_symbols:
        raise DataError("--user_defined_symbols has an empty symbol")


def prepare_command(
    settings: Settings,
    train: Sequence[str],
    output: str | Path,
    valid: str | None = None,
    test: Sequence[str] = (),
    workers: int | None = None,
    report_file: str | Path | None = None,
) -> int:
    """`attnx prepare` (see `attnx.commands.data.prepare` for the options): check, build, report."""
    if (
        settings.vocab_size < 8
        or settings.max_sentence_tokens < 1
        or settings.max_ratio < 1
        or settings.sample_size < 1
    ):
        raise DataError(
            "--vocab_size must be ≥ 8, --max_sentence_tokens ≥ 1, --max_ratio ≥ 1 and --sample_size ≥ 1"
        )
    if settings.src_lang == settings.tgt_lang:
        raise DataError(f"--src_lang and --tgt_lang are both {settings.src_lang!r}")
    if isinstance(train, str):
        train = [train]
    if isinstance(test, str):
        test = [test]
    if len(set(train)) != len(train):
        raise DataError("a training corpus is given twice in --train")
    check_per_corpus(settings, len(train))
    prefixes: dict[str, list[str]] = {TRAIN: list(train)}
    for value, default in [(valid, "valid")] * bool(valid) + [(t, "test") for t in test]:
        name, prefix = _named(value, default)
        if name in prefixes:
            raise DataError(f"split {name!r} is given twice; name extra test sets with --test NAME=PREFIX")
        prefixes[name] = [prefix]
    inputs = Inputs.from_prefixes(prefixes, settings.src_lang, settings.tgt_lang)
    replaced = False
    with _stop_signals():
        try:
            meta = prepare(inputs, output, settings, workers)
            replaced = True
            print(report(meta))
            if report_file is not None:
                write_report(Path(report_file), meta, output)
                print(f"report of what cleaning dropped: {report_file}")
            print(f"corpus: {output}", flush=True)
        except Interrupted as stop:
            raise SystemExit(_stopped(stop, output, replaced or stop.corpus_replaced, report_file)) from None
    return 0
