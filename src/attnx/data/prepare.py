"""``attnx prepare``: raw parallel text → joint SentencePiece BPE model → memory-mapped binarized corpus.

Pipeline, one pass per step over each split:

1. read every split (plain or gzip, strict UTF-8), normalize whitespace, check that the two sides align;
   training pairs with a blank side are dropped and counted, any other split must be complete;
2. train one SentencePiece BPE model on the source and target training text together (§5.1, shared vocabulary),
   with attnx's fixed special ids (pad 0, unk 1, bos 2, eos 3);
3. encode every split on all cores, drop training pairs over ``--max_sentence_tokens`` tokens or the ``--max_ratio`` length
   ratio (counted, never validation or test pairs), and write the flat id arrays, offsets and lengths;
4. write ``meta.json`` last: a directory without it is incomplete, whatever else is there.

A re-run with the same input files (path and SHA-256 of their bytes) and settings reuses the directory; a changed
input or setting rebuilds it (and retrains SentencePiece only if its own inputs or settings changed).

Whose files are whose: prepare writes every new file into a hidden scratch directory it creates inside the output
(``.attnx-prepare-XXXXXXXX``, marked as its own), moves them into place only when all are written, and lists them in
``meta.json`` (``files``). It deletes only files listed there by an earlier run and its own scratch directories. It
refuses an output directory that holds anything else, or that holds one of the inputs, so it never deletes,
truncates or overwrites a file it did not write; an interrupted run leaves the previous corpus as it was.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from attnx.data.corpus import FORMAT_VERSION, META, SPM_MODEL, ids_dtype
from attnx.data.errors import DataError
from attnx.data.text import read_chunks, read_pairs, resolve
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

    def spm_part(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("vocab_size", "sample_size", "character_coverage", "seed")}


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
    """``out/meta.json`` when it is one attnx wrote (a JSON object with a format version), else None."""
    try:
        meta = json.loads((out / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "format_version" in meta else None


# --- step 1: read, check, normalize ---------------------------------------------------------------------


def normalize_split(
    name: str, srcs: list[Path], tgts: list[Path], src_out: Path, tgt_out: Path
) -> tuple[int, Counter[str]]:
    """Write the normalized, aligned text of one split; return (pairs read, dropped by reason)."""
    dropped: Counter[str] = Counter()
    n_read = 0
    with (
        open(src_out, "w", encoding="utf-8") as fs,
        open(tgt_out, "w", encoding="utf-8") as ft,
        tqdm(desc=f"read {name}", unit=" pairs", disable=None, leave=False) as bar,
    ):
        for src, tgt in zip(srcs, tgts, strict=True):
            for s, t in read_pairs(src, tgt, dropped if name == TRAIN else None):
                if s:
                    fs.write("\n".join(s) + "\n")
                    ft.write("\n".join(t) + "\n")
                n_read += len(s)
                bar.update(len(s))
    n_read += dropped["blank"]
    if name == TRAIN and n_read == dropped["blank"]:
        raise DataError(f"every training pair has a blank side ({', '.join(map(str, srcs + tgts))})")
    return n_read, dropped


# --- step 2: the joint SentencePiece model ----------------------------------------------------------------


def train_sentencepiece(texts: list[Path], out: Path, settings: Settings, workers: int) -> None:
    """Train the joint BPE model on ``texts`` (both languages) into ``out/spm.model``."""
    spm.set_random_generator_seed(settings.seed)
    print(f"training SentencePiece BPE, {settings.vocab_size} pieces, on {' + '.join(map(str, texts))}")
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
    """Largest token id in each language's ``.bin``: what opening the corpus checks the file against."""


def encode_split(
    name: str,
    src_text: Path,
    tgt_text: Path,
    out: Path,
    tokenizer: Tokenizer,
    settings: Settings,
    workers: int,
    dropped: Counter[str],
) -> tuple[int, int, int, dict[str, int]]:
    """Encode one normalized split into ``{name}.{lang}.bin/.idx.npy/.len.npy``.

    Returns (pairs, source tokens, target tokens, largest id per language).

    Training pairs over ``max_sentence_tokens`` tokens or the ``max_ratio`` length ratio are dropped and counted.
    """
    dtype = ids_dtype(tokenizer.vocab_size)
    lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    langs = {"src": settings.src_lang, "tgt": settings.tgt_lang}
    max_id = {side: -1 for side in langs}
    files = {side: open(out / f"{name}.{lang}.bin", "wb") for side, lang in langs.items()}  # noqa: SIM115
    try:
        with tqdm(desc=f"encode {name}", unit=" pairs", disable=None, leave=False) as bar:
            chunks = zip(
                read_chunks(src_text, ENCODE_LINES), read_chunks(tgt_text, ENCODE_LINES), strict=True
            )
            for s, t in chunks:
                ids = {"src": tokenizer.encode_batch(s, workers), "tgt": tokenizer.encode_batch(t, workers)}
                lens = {side: np.fromiter(map(len, x), np.int32, len(x)) for side, x in ids.items()}
                if name == TRAIN:
                    keep = _keep(lens["src"], lens["tgt"], settings, dropped)
                    if not keep.all():
                        ids = {side: [x[i] for i in np.flatnonzero(keep)] for side, x in ids.items()}
                        lens = {side: x[keep] for side, x in lens.items()}
                for side, x in ids.items():
                    flat = np.fromiter(itertools.chain.from_iterable(x), dtype, int(lens[side].sum()))
                    files[side].write(flat.tobytes())
                    if len(flat):
                        max_id[side] = max(max_id[side], int(flat.max()))
                    lengths[side].append(lens[side])
                bar.update(len(s))
    finally:
        for f in files.values():
            f.close()
    totals = []
    for side, lang in langs.items():
        lens = np.concatenate(lengths[side]) if lengths[side] else np.zeros(0, np.int32)
        offsets = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        np.save(out / f"{name}.{lang}.len.npy", lens)
        np.save(out / f"{name}.{lang}.idx.npy", offsets)
        totals.append(int(offsets[-1]))
    n = len(lengths["src"]) and sum(map(len, lengths["src"]))
    if n == 0:
        raise DataError(
            f"no training pair is left after dropping pairs over --max_sentence_tokens {settings.max_sentence_tokens} tokens or "
            f"--max_ratio {settings.max_ratio} ({dict(dropped)})"
        )
    return n, totals[0], totals[1], {langs[side]: m for side, m in max_id.items()}


def _keep(src: np.ndarray, tgt: np.ndarray, settings: Settings, dropped: Counter[str]) -> np.ndarray:
    """fairseq/Moses-style cleaning: tokens in [1, max_len] on both sides and a bounded length ratio."""
    too_long = (src > settings.max_sentence_tokens) | (tgt > settings.max_sentence_tokens)
    empty = ~too_long & ((src == 0) | (tgt == 0))  # text that encodes to nothing
    ratio = np.maximum(src, tgt) / np.maximum(np.minimum(src, tgt), 1)
    bad_ratio = ~too_long & ~empty & (ratio > settings.max_ratio)
    dropped["too_long"] += int(too_long.sum())
    dropped["empty"] += int(empty.sum())
    dropped["ratio"] += int(bad_ratio.sum())
    return ~(too_long | empty | bad_ratio)


# --- the whole pipeline ---------------------------------------------------------------------------------


def prepare(
    inputs: Inputs, out: str | Path, settings: Settings, workers: int | None = None
) -> dict[str, Any]:
    """Build (or reuse) the prepared corpus in ``out``; return its ``meta.json`` content.

    Raises:
        DataError: ``out`` holds a file prepare did not write, or one of the inputs (nothing is touched then).
    """
    if TRAIN not in inputs.splits:
        raise DataError("a training split is required (--train)")
    out, workers = Path(out), workers or os.cpu_count() or 1
    old = _read_meta(out)
    owned = check_output(out, inputs, old)
    corpus_fp, spm_fp = fingerprints(inputs, settings)
    if old and old.get("fingerprint") == corpus_fp and not old.get("incomplete") and _complete(out, old):
        old["reused"] = True
        return old
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create --output {out}: {e.strerror or e}") from e
    for name in owned:  # scratch directories of a run that was killed before it could remove them
        if name.startswith(SCRATCH_PREFIX):
            shutil.rmtree(out / name, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out))
    (work / SCRATCH_MARK).write_text("attnx prepare writes here and moves its files into place when done\n")
    start = time.perf_counter()
    try:
        stats: dict[str, SplitStats] = {}
        texts: dict[str, tuple[Path, Path]] = {}
        for name, (srcs, tgts) in inputs.splits.items():
            texts[name] = (work / f"{name}.{settings.src_lang}", work / f"{name}.{settings.tgt_lang}")
            read, dropped = normalize_split(name, srcs, tgts, *texts[name])
            stats[name] = SplitStats(
                0, 0, 0, read, dict(dropped), {"src": list(map(str, srcs)), "tgt": list(map(str, tgts))}
            )

        seconds = {"read": time.perf_counter() - start}
        reuse_spm = (
            old is not None
            and old.get("spm_fingerprint") == spm_fp
            and not old.get("incomplete")
            and (out / SPM_MODEL).is_file()
        )
        if not reuse_spm:
            train_sentencepiece(list(texts[TRAIN]), work, settings, workers)
        tokenizer = Tokenizer.load((out if reuse_spm else work) / SPM_MODEL)
        seconds["sentencepiece"] = time.perf_counter() - start - sum(seconds.values())

        for name, (src_text, tgt_text) in texts.items():
            dropped = Counter(stats[name].dropped)
            pairs, src_tokens, tgt_tokens, max_id = encode_split(
                name, src_text, tgt_text, work, tokenizer, settings, workers, dropped
            )
            stats[name].pairs, stats[name].src_tokens, stats[name].tgt_tokens = pairs, src_tokens, tgt_tokens
            stats[name].dropped = {k: v for k, v in dropped.items() if v}
            stats[name].max_id = max_id
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
        _publish(out, work, meta, owned, fresh=[f for f in meta["files"] if (work / f).is_file()])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["reused"] = False
    return meta


def _expected_files(meta: dict[str, Any]) -> list[str]:
    """The files of a complete corpus described by ``meta`` (without ``meta.json`` itself)."""
    files = [SPM_MODEL, Path(SPM_MODEL).with_suffix(".vocab").name]
    for name in meta["splits"]:
        for lang in (meta["src_lang"], meta["tgt_lang"]):
            files += [f"{name}.{lang}.bin", f"{name}.{lang}.idx.npy", f"{name}.{lang}.len.npy"]
            if name != TRAIN:
                files.append(f"{name}.{lang}")
    return files


def _complete(out: Path, meta: dict[str, Any]) -> bool:
    return all((out / f).is_file() for f in meta.get("files") or _expected_files(meta))


def owned_files(out: Path, meta: dict[str, Any] | None) -> set[str]:
    """Names in ``out`` that an earlier ``attnx prepare`` wrote: those ``meta.json`` lists (or, for a corpus of an
    attnx that did not list them, those its splits imply), ``meta.json`` itself and prepare's scratch directories."""
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
    unknown = sorted(p.name + "/" * p.is_dir() for p in out.iterdir() if p.name not in owned)
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise DataError(
            f"--output {out} holds files attnx prepare did not write ({shown}); it never deletes or overwrites "
            "them: pass a new or empty directory as --output"
        )
    return owned


def _write_meta(out: Path, work: Path, meta: dict[str, Any]) -> None:
    """Replace ``out/meta.json`` in one step (written in the scratch directory, then renamed)."""
    (work / META).write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(work / META, out / META)


def _publish(out: Path, work: Path, meta: dict[str, Any], owned: set[str], fresh: list[str]) -> None:
    """Move the new files into ``out``, delete the earlier run's files this one no longer has, write the meta.

    While files move, ``meta.json`` says the corpus is incomplete and lists every file of both runs, so a run
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


def report(meta: dict[str, Any]) -> str:
    lines = [
        f"{'reused' if meta.get('reused') else 'prepared'} {meta['src_lang']}-{meta['tgt_lang']} corpus, "
        f"vocabulary {meta['vocab_size']} ({meta['dtype']} ids)"
    ]
    for name, s in meta["splits"].items():
        line = f"  {name}: {s['pairs']:,} pairs, {s['src_tokens']:,} + {s['tgt_tokens']:,} tokens"
        if s["dropped"]:
            reasons = {
                "blank": "with a blank side",
                "too_long": f"over {meta['settings']['max_sentence_tokens']} tokens",
                "ratio": f"over length ratio {meta['settings']['max_ratio']}",
                "empty": "that encode to no token",
            }
            parts = [f"{n:,} {reasons.get(k, k)}" for k, n in s["dropped"].items()]
            line += f"; dropped {sum(s['dropped'].values()):,} of {s['read']:,}: " + ", ".join(parts)
        lines.append(line)
    return "\n".join(lines)


def _named(value: str, default: str) -> tuple[str, str]:
    name, sep, prefix = value.partition("=")
    if not sep:
        return default, value
    if not SPLIT_NAME.fullmatch(name) or name == TRAIN:
        raise DataError(
            f"bad split name {name!r} in {value!r}: use letters, digits, '_', '.', '-', not 'train'"
        )
    return name, prefix


class Interrupted(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``timeout``, ``kill``) during prepare: unwinds like Ctrl-C, so the scratch
    directory is removed and the previous corpus stays as it was."""


def _interruptible(run: Any, output: str | Path) -> Any:
    """Run ``run()`` with SIGTERM turned into an exception; exit 128 + 15 after saying what was kept."""

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave signals alone
        return run()
    try:
        return run()
    except Interrupted:
        print(
            f"attnx prepare: interrupted by SIGTERM; {output} keeps what it held before (run the same command "
            "again to finish)",
            file=sys.stderr,
        )
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def prepare_command(
    settings: Settings,
    train: Sequence[str],
    output: str | Path,
    valid: str | None = None,
    test: Sequence[str] = (),
    workers: int | None = None,
) -> int:
    """``attnx prepare`` (see ``attnx.commands.data.prepare`` for the options): check, build, report."""
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
    prefixes: dict[str, list[str]] = {TRAIN: list(train)}
    for value, default in [(valid, "valid")] * bool(valid) + [(t, "test") for t in test]:
        name, prefix = _named(value, default)
        if name in prefixes:
            raise DataError(f"split {name!r} is given twice; name extra test sets with --test NAME=PREFIX")
        prefixes[name] = [prefix]
    inputs = Inputs.from_prefixes(prefixes, settings.src_lang, settings.tgt_lang)
    meta = _interruptible(lambda: prepare(inputs, output, settings, workers), output)
    print(report(meta))
    print(f"corpus: {output}")
    return 0
