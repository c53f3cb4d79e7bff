"""Step 1, reading: each split's text checked and normalized; training pairs through the blank, copy and
duplicate filters, counted per corpus.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attnx.data.cleaning import SeenPairs, copies, pair_keys
from attnx.data.prepare.settings import Settings
from attnx.data.text import read_aligned, read_pairs
from attnx.files import open_for_writing

EXAMPLES = 3
"""Dropped pairs kept as examples per corpus and reason (meta.json and --report)."""
EXAMPLE_CHARS = 200

Chunk = tuple[int, np.ndarray, list[str], list[str]]
"""(corpus, line numbers, source, target): a block of training pairs as the filters pass it on."""


def normalize_split(
    name: str, srcs: list[Path], tgts: list[Path], src_out: Path, tgt_out: Path
) -> tuple[int, Counter[str]]:
    """Write the normalized, aligned text of a validation or test split; return (pairs read, nothing dropped)."""
    n_read = 0
    with (
        open_for_writing(src_out, text=True) as fs,
        open_for_writing(tgt_out, text=True) as ft,
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
    written: int = 0
    """Rows written into the training split (kept pairs times `--train_repeat`), one run of rows after another's."""

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


def select(keep: np.ndarray, *columns: Any) -> list[Any]:
    """Each column (an array or a list) cut to the rows where `keep` is True."""
    if keep.all():
        return list(columns)
    at = np.flatnonzero(keep)
    return [column[at] if isinstance(column, np.ndarray) else [column[i] for i in at] for column in columns]


def read_and_filter(
    srcs: list[Path], tgts: list[Path], settings: Settings, corpora: list[CorpusStats]
) -> Iterator[Chunk]:
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
            s, t, lines = select(~blank, s, t, lines)
            if settings.drop_copies:
                copy = copies(s, t)
                stats.drop("copy", copy, s, t, lines)
                s, t, lines = select(~copy, s, t, lines)
            if settings.drop_duplicates and s:
                duplicate = ~seen.first_seen(pair_keys(s, t))
                stats.drop("duplicate", duplicate, s, t, lines)
                s, t, lines = select(~duplicate, s, t, lines)
            yield corpus, lines, s, t
