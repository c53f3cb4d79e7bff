"""A prepared corpus on disk and its memory-mapped reader.

`attnx prepare` writes one directory:

    meta.json                  languages, vocabulary, splits with their counts, what was dropped and why,
                               the largest id of each .bin, the settings, the fingerprint of the inputs, the
                               list of files prepare wrote (the only ones it ever deletes), each file's size and
                               SHA-256 (`checksums`) and the SentencePiece model's SHA-256 (`spm_sha256`)
    spm.model, spm.vocab       the joint SentencePiece BPE model (§5.1: shared source-target vocabulary)
    {split}.{lang}.bin         every token id of the split, one flat array (uint16, or int32 for ≥ 65,536 pieces)
    {split}.{lang}.idx.npy     int64 offsets: sentence i is ids[idx[i]:idx[i + 1]]   (n + 1 entries)
    {split}.{lang}.len.npy     int32 sentence lengths in tokens, without BOS/EOS     (n entries)
    {split}.{lang}             normalized text, one segment a line (every split but train): what is scored
    {split}.align.bin, .align.idx.npy   with `--train_align`/`--valid_align`: each pair's (source piece, target
                               piece) links, uint16, and the int64 index of each pair's first link

Everything numeric is opened with `np.memmap`: loading a 4.5M-pair corpus reads a few kilobytes, creates
no Python object per sentence, and DDP ranks share the page cache instead of each holding a copy.

A corpus is checked when it is opened: every file's size at once, and each file's SHA-256 the first time it is
used (a split's ids, offsets and lengths when the split is opened, its text when it is scored, the SentencePiece
model when it is loaded). A file changed in place — ids overwritten, an index reordered, a reference line
deleted — is one error naming it, before training starts. docs/benchmarks.md has the cost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnx.data.errors import DataError
from attnx.data.tokenizer import Tokenizer

FORMAT_VERSION = 1
META = "meta.json"
SPM_MODEL = "spm.model"
BINARY = (".bin", ".idx.npy", ".len.npy")
"""What each language of a split is stored in: `{split}.{lang}` + each of these."""
ALIGNMENT = (".align.bin", ".align.idx.npy")
"""What a split's alignments are stored in (`attnx prepare --train_align`): `{split}` + each of these. The
`.bin` holds uint16 (source piece, target piece) links, 0-based over the pair's pieces without `</s>`; pair `i`'s
links are rows `idx[i]:idx[i + 1]` (int64, n + 1 entries)."""


log = logging.getLogger(__name__)
_UNVERIFIABLE: set[Path] = set()  # corpora already said to have no checksums, once each per process


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (hashlib releases the GIL: files hash in parallel in threads)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def checksums(data_dir: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """`{name: {"bytes": size, "sha256": digest}}` of files in `data_dir`, what `meta.json` records."""
    paths = [data_dir / name for name in names]
    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(file_sha256, paths))
    return {
        name: {"bytes": path.stat().st_size, "sha256": digest}
        for name, path, digest in zip(names, paths, digests, strict=True)
    }


def ids_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.int32)


def _open(path: Path, dtype: np.dtype | str) -> np.ndarray:
    """Read-only memory map of a raw array (`np.memmap` refuses empty files; those become empty arrays)."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class ParallelDataset:
    """One binarized split: `dataset[i]` is `(src_ids, tgt_ids)`, two small numpy arrays without BOS/EOS.

    `src_lengths`/`tgt_lengths` are memory-mapped int32 arrays, what token-budget batching sorts on.
    Pickling (to DataLoader workers) carries paths, not data; each process maps the files itself.
    """

    def __init__(
        self,
        data_dir: str | Path,
        split: str,
        src_lang: str,
        tgt_lang: str,
        dtype: str,
        aligned: bool = False,
    ) -> None:
        self.data_dir, self.split = Path(data_dir), split
        self.src_lang, self.tgt_lang, self.dtype = src_lang, tgt_lang, dtype
        self.aligned = aligned
        """Whether the split has alignments: `links` `(M, 2)` and `link_offsets` `(n + 1,)` ([`ALIGNMENT`][attnx.data.corpus.ALIGNMENT])."""
        self._map()

    def _map(self) -> None:
        def side(lang: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            stem = self.data_dir / f"{self.split}.{lang}"
            ids = _open(stem.with_name(stem.name + ".bin"), self.dtype)
            offsets = np.load(stem.with_name(stem.name + ".idx.npy"), mmap_mode="r")
            lengths = np.load(stem.with_name(stem.name + ".len.npy"), mmap_mode="r")
            return ids, offsets, lengths

        self.src_ids, self.src_offsets, self.src_lengths = side(self.src_lang)
        self.tgt_ids, self.tgt_offsets, self.tgt_lengths = side(self.tgt_lang)
        self.links: np.ndarray | None = None
        self.link_offsets: np.ndarray | None = None
        if self.aligned:
            self.links = _open(self.data_dir / f"{self.split}{ALIGNMENT[0]}", np.uint16).reshape(-1, 2)
            self.link_offsets = np.load(self.data_dir / f"{self.split}{ALIGNMENT[1]}", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        so, to = self.src_offsets, self.tgt_offsets
        return np.array(self.src_ids[so[i] : so[i + 1]]), np.array(self.tgt_ids[to[i] : to[i + 1]])

    def __getstate__(self) -> dict[str, Any]:
        keep = ("data_dir", "split", "src_lang", "tgt_lang", "dtype", "aligned")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._map()


class PreparedCorpus:
    """Reader of a directory written by `attnx prepare`.

    Args:
        data_dir: the `--output` directory of `attnx prepare`.
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        meta_path = self.data_dir / META
        if not meta_path.is_file():
            raise DataError(
                f"{self.data_dir} is not a prepared corpus (no {META}); create it with `attnx prepare --output {self.data_dir} ...` (see `attnx prepare --help`)"
            )
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        except ValueError as e:
            raise DataError(f"{meta_path} is not valid JSON ({e}): run `attnx prepare` again") from None
        if not isinstance(self.meta, dict):
            raise DataError(f"{meta_path} is not a prepared corpus's meta: run `attnx prepare` again")
        self._checked: set[str] = set()
        if self.meta.get("incomplete"):
            raise DataError(
                f"{self.data_dir} is incomplete: an `attnx prepare` into it was interrupted; run it again"
            )
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise DataError(
                f"{self.data_dir} was prepared in format {self.meta.get('format_version')}, this attnx reads "
                f"format {FORMAT_VERSION}: run `attnx prepare` again"
            )
        self._verified: set[str] = set()
        self._check_sizes()

    @property
    def checksums(self) -> dict[str, dict[str, Any]] | None:
        """Size and SHA-256 of each file prepare wrote, or None for a corpus prepared before they were kept."""
        recorded = self.meta.get("checksums")
        if recorded is None:
            return None
        if not isinstance(recorded, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
            for e in recorded.values()
        ):
            raise DataError(
                f"{self.data_dir / META} has a damaged 'checksums' entry: run `attnx prepare` again into "
                f"{self.data_dir}"
            )
        return recorded

    def _damaged(self, name: str, what: str) -> DataError:
        return DataError(
            f"{self.data_dir / name} {what}: the corpus changed after it was prepared; run `attnx prepare` again "
            f"into {self.data_dir} (the same command rebuilds it)"
        )

    def _check_sizes(self) -> None:
        """Every recorded file is there with its size (a stat each); without checksums, say once that the
        corpus cannot be verified."""
        if self.checksums is None:
            if self.data_dir.resolve() not in _UNVERIFIABLE:
                _UNVERIFIABLE.add(self.data_dir.resolve())
                log.warning(
                    f"attnx: {self.data_dir} was prepared before attnx recorded checksums, so damage to its files "
                    "cannot be detected; run `attnx prepare` again to record them"
                )
            return
        for name, entry in self.checksums.items():
            path = self.data_dir / name
            if not path.is_file():
                raise self._damaged(name, "is missing")
            size = path.stat().st_size
            if size != entry["bytes"]:
                raise self._damaged(name, f"has {size:,} bytes, {META} records {entry['bytes']:,}")

    def verify_split(self, split: str) -> None:
        """Check every file of `split` (ids, offsets, lengths and text) against its recorded SHA-256 now."""
        if split in self.meta["splits"]:
            langs = (self.src_lang, self.tgt_lang)
            self.verify([f"{split}.{lang}{end}" for lang in langs for end in (*BINARY, "")])

    def verify(self, names: list[str]) -> None:
        """Check files against the SHA-256 that `meta.json` records, each once (in parallel threads)."""
        recorded = self.checksums
        todo = [n for n in names if recorded is not None and n in recorded and n not in self._verified]
        if not todo:
            return
        for name, entry in checksums(self.data_dir, todo).items():
            if entry != recorded[name]:
                raise self._damaged(
                    name, f"is not the file prepare wrote (its SHA-256 is not the one {META} records)"
                )
            self._verified.add(name)

    @property
    def src_lang(self) -> str:
        return self.meta["src_lang"]

    @property
    def tgt_lang(self) -> str:
        return self.meta["tgt_lang"]

    @property
    def vocab_size(self) -> int:
        """The vocabulary size `meta.json` records ([`tokenizer`][attnx.data.corpus.PreparedCorpus.tokenizer]
        checks it against `spm.model`)."""
        return self.meta["vocab_size"]

    @property
    def splits(self) -> list[str]:
        """Split names, train first, in the order they were prepared."""
        return list(self.meta["splits"])

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """`spm.model`, once its SHA-256 and its number of pieces are those `meta.json` records (the
        datamodule's `vocab_size`, which sizes the model of every training and decoding command, is read here)."""
        self.verify([SPM_MODEL])
        tokenizer = Tokenizer.load(self.data_dir / SPM_MODEL)
        recorded = self.meta.get("vocab_size")
        if recorded != tokenizer.vocab_size:
            raise self._damaged(
                META, f"records a vocabulary of {recorded!r} pieces, {SPM_MODEL} has {tokenizer.vocab_size}"
            )
        return tokenizer

    def _check(self, split: str) -> None:
        if split not in self.meta["splits"]:
            raise DataError(f"{self.data_dir} has no split {split!r}; it has {', '.join(self.splits)}")

    def dataset(self, split: str) -> ParallelDataset:
        """The memory-mapped `(src_ids, tgt_ids)` pairs of `split`.

        The first time a split is opened its files are checked against `meta.json`: their SHA-256 (for a corpus
        prepared before checksums were kept, only what follows), then the index must cover the `.bin` exactly
        and every id must be below the vocabulary size (and equal, at most, the largest id prepare recorded),
        so a corrupt file is one error naming it rather than an index error mid-training.
        """
        self._check(split)
        self.verify([f"{split}.{lang}{end}" for lang in (self.src_lang, self.tgt_lang) for end in BINARY])
        aligned = bool(self.meta["splits"][split].get("alignments"))
        if aligned:
            self.verify([f"{split}{end}" for end in ALIGNMENT])
        dataset = ParallelDataset(
            self.data_dir, split, self.src_lang, self.tgt_lang, self.meta["dtype"], aligned
        )
        if split not in self._checked:
            self._check_ids(split, dataset)
            self._check_links(split, dataset)
            self._checked.add(split)
        return dataset

    def _check_links(self, split: str, dataset: ParallelDataset) -> None:
        """A split's alignments cover its pairs and point inside them (source and target pieces)."""
        if dataset.links is None or dataset.link_offsets is None:
            return
        offsets, links = dataset.link_offsets, dataset.links
        path = self.data_dir / f"{split}{ALIGNMENT[0]}"
        if len(offsets) != len(dataset) + 1 or int(offsets[-1]) != len(links):
            raise self._damaged(path.name, f"holds {len(links):,} links for an index of {int(offsets[-1]):,}")
        rows = np.repeat(np.arange(len(dataset)), np.diff(offsets))
        if len(rows) and (
            (links[:, 0] >= dataset.src_lengths[rows]).any()
            or (links[:, 1] >= dataset.tgt_lengths[rows]).any()
        ):
            raise self._damaged(path.name, "links a piece beyond its pair's length")

    def _check_ids(self, split: str, dataset: ParallelDataset) -> None:
        recorded = self.meta["splits"][split].get("max_id") or {}
        sides = [
            (self.src_lang, dataset.src_ids, dataset.src_offsets, dataset.src_lengths),
            (self.tgt_lang, dataset.tgt_ids, dataset.tgt_offsets, dataset.tgt_lengths),
        ]
        again = f"run `attnx prepare` again into {self.data_dir}"
        for lang, ids, offsets, lengths in sides:
            path = self.data_dir / f"{split}.{lang}.bin"
            if len(offsets) != len(lengths) + 1 or int(offsets[-1]) != len(ids):
                raise DataError(
                    f"{path} holds {len(ids):,} ids but its index {path.with_suffix('.idx.npy').name} covers "
                    f"{int(offsets[-1]):,}: the corpus is damaged; {again}"
                )
            if not len(ids):
                continue
            top, bottom = int(ids.max()), int(ids.min())
            if top >= self.vocab_size or bottom < 0:
                bad = top if top >= self.vocab_size else bottom
                raise DataError(
                    f"{path} holds token id {bad}, outside the vocabulary of {self.vocab_size} pieces: the file "
                    f"is corrupt or from another corpus; {again}"
                )
            if lang in recorded and top != recorded[lang]:
                raise DataError(
                    f"{path} changed after it was prepared (largest id {top}, {META} records {recorded[lang]}); "
                    f"{again}"
                )

    def _text(self, split: str, lang: str) -> list[str]:
        self._check(split)
        path = self.data_dir / f"{split}.{lang}"
        if not path.is_file():
            raise DataError(
                f"{self.data_dir} keeps no text of split {split!r} (the training text is not kept; "
                "only validation and test text is, to score against)"
            )
        self.verify([path.name])
        lines = path.read_text(encoding="utf-8").split("\n")
        return lines[:-1] if lines[-1] == "" else lines

    def sources(self, split: str) -> list[str]:
        """The normalized source text of `split`, one segment per pair, in corpus order."""
        return self._text(split, self.src_lang)

    def references(self, split: str) -> list[str]:
        """The normalized target text of `split` (the references sacreBLEU scores against)."""
        return self._text(split, self.tgt_lang)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={info['pairs']}" for name, info in self.meta["splits"].items())
        return f"PreparedCorpus({str(self.data_dir)!r}, {self.src_lang}-{self.tgt_lang}, vocab {self.vocab_size}, {sizes})"
