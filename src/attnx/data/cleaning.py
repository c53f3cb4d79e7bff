"""Cleaning web-crawled training text: exact duplicate pairs, source = target copies, pairs in another language.

Every production recipe for WMT-style data filters these before training (Common Crawl in particular holds
duplicates, untranslated copies and lines in a third language). Each filter is a pure function of a chunk of
aligned, normalized lines and returns which pairs to keep, so `attnx prepare` can count every drop per corpus
and per reason. Validation and test sets are never cleaned.

Language identification is py3langid's naive Bayes model over byte n-grams (shipped inside the package: nothing
is downloaded). Its reference implementation walks the n-gram automaton one byte at a time in Python (about
70 µs a sentence here); [`LanguageIdentifier`][attnx.data.cleaning.LanguageIdentifier] walks it for a whole
chunk of sentences at once with numpy and sums the feature weights with one `embedding_bag`, giving the same
answers several times faster.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Sequence
from functools import cache

import numpy as np

UNDETERMINED = "und"
"""What a line without any known n-gram (digits, punctuation only) is classified as: never dropped for it."""


class LanguageIdentifier:
    """py3langid's model (all of its languages), classifying many lines in one call.

    `classify(lines)` equals `[py3langid.classify(line)[0] for line in lines]` except for lines without any
    feature of the model, which are `"und"` rather than the model's first language.
    """

    def __init__(self) -> None:
        import torch
        from py3langid.langid import MODEL_FILE
        from py3langid.langid import LanguageIdentifier as Reference

        model = Reference.from_model_file(MODEL_FILE)
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}
        self.next_state = np.frombuffer(model.tk_nextmove, width[model.tk_nextmove.itemsize]).astype(np.int32)
        self.row_base = np.frombuffer(model.tk_row, width[model.tk_row.itemsize]).astype(np.int64) << 8
        self.feature = np.asarray(model.tk_output, np.int32)  # state → the n-gram it completes, or -1
        self.weights = torch.from_numpy(np.asarray(model.nb_ptc, np.float32))  # (features, languages)
        self.prior = np.asarray(model.nb_pc, np.float32)
        self.languages = np.asarray(model.nb_classes, object)  # a few languages have two columns (scripts)

    @property
    def known(self) -> set[str]:
        return set(self.languages)

    @staticmethod
    def _bytes(line: str) -> bytes:
        """py3langid's own preparation of a line: lower-cased if all upper case, NFC, UTF-8."""
        if line.isupper():
            line = line.lower()
        return unicodedata.normalize("NFC", line).encode("utf-8", errors="surrogatepass")

    def classify(self, lines: Sequence[str]) -> list[str]:
        """The most probable language of each line."""
        import torch

        n = len(lines)
        if n == 0:
            return []
        data = [self._bytes(line) for line in lines]
        lengths = np.fromiter(map(len, data), np.int64, n)
        flat = np.frombuffer(b"".join(data), np.uint8)
        starts = np.zeros(n, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        # longest first, so that the lines still being walked at byte k are always a prefix of the order
        order = np.argsort(-lengths, kind="stable")
        starts, lengths = starts[order], lengths[order]
        walking = np.searchsorted(-lengths, -np.arange(int(lengths[0]) if n else 0), side="left")
        state = np.zeros(n, np.int64)
        lines_hit, features_hit = [np.zeros(0, np.int64)], [np.zeros(0, np.int32)]
        for k, m in enumerate(walking):
            state[:m] = self.next_state[self.row_base[state[:m]] + flat[starts[:m] + k]]
            found = self.feature[state[:m]]
            hit = np.flatnonzero(found >= 0)
            lines_hit.append(hit)
            features_hit.append(found[hit])
        line_of = np.concatenate(lines_hit)
        n_features = self.weights.shape[0]
        keys, counts = np.unique(line_of * n_features + np.concatenate(features_hit), return_counts=True)
        line_of, feature = keys // n_features, keys % n_features
        result = np.full(n, UNDETERMINED, object)
        if len(keys):
            first = np.flatnonzero(np.r_[True, line_of[1:] != line_of[:-1]])
            scores = torch.nn.functional.embedding_bag(  # Σ log(1 + count) · log P(feature | language)
                torch.from_numpy(feature),
                self.weights,
                torch.from_numpy(first),
                mode="sum",
                per_sample_weights=torch.from_numpy(np.log1p(counts.astype(np.float32))),
            ).numpy()
            best = (scores + self.prior).argmax(axis=1)
            result[order[line_of[first]]] = self.languages[best]
        return result.tolist()


@cache
def identifier() -> LanguageIdentifier:
    """One identifier per process (loading the model takes about a second)."""
    return LanguageIdentifier()


LANGUAGE_ID_LINES = 10_000
"""Lines classified at once: the automaton walk keeps about 16 bytes per byte of text of that many lines."""


def start_worker() -> None:
    """A language-identification worker: one thread (the processes are the parallelism), default signals.

    The worker is forked with SIGTERM and SIGINT blocked and unblocks them only once their handlers are the
    defaults: a `Pool.terminate()` that comes before this runs (prepare with nothing to identify) is then
    delivered to the default handler and ends the worker, instead of reaching the parent's handler that the
    fork copied, which swallowed it and left the parent waiting for the worker forever.
    """
    import signal

    import torch

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    torch.set_num_threads(1)


def languages_of(pairs: tuple[list[str], list[str]]) -> tuple[list[str], list[str]]:
    """(source languages, target languages) of a chunk of pairs: what worker processes run."""
    found: tuple[list[str], list[str]] = ([], [])
    for side, lines in zip(found, pairs, strict=True):
        for start in range(0, len(lines), LANGUAGE_ID_LINES):
            side += identifier().classify(lines[start : start + LANGUAGE_ID_LINES])
    return found


def wrong_language(src_found: list[str], tgt_found: list[str], src_lang: str, tgt_lang: str) -> np.ndarray:
    """True where either side is identified as a language other than the declared one."""
    src = np.asarray(src_found, object)
    tgt = np.asarray(tgt_found, object)
    return ((src != src_lang) & (src != UNDETERMINED)) | ((tgt != tgt_lang) & (tgt != UNDETERMINED))


def copies(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """True where the target is the source, unchanged (an untranslated line)."""
    return np.fromiter((s == t for s, t in zip(src, tgt, strict=True)), bool, len(src))


def pair_keys(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """A 64-bit BLAKE2b digest of each pair (tab-joined: normalized text holds no tab)."""
    digests = b"".join(
        hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=8).digest() for s, t in zip(src, tgt, strict=True)
    )
    return np.frombuffer(digests, np.uint64)


class SeenPairs:
    """The set of pairs seen so far, as sorted runs of 64-bit digests: 8 bytes a distinct pair.

    Runs are merged when one grows as large as the one before it (as in a log-structured merge tree), so a
    lookup searches O(log n) runs and every digest is re-sorted O(log n) times.
    """

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(map(len, self.runs))

    def first_seen(self, keys: np.ndarray) -> np.ndarray:
        """True for each key seen neither earlier in `keys` nor in an earlier call; remembers them all."""
        unique, first = np.unique(keys, return_index=True)
        new = np.ones(len(unique), bool)
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, unique), len(run) - 1)
            new &= run[at] != unique
        if new.any():
            self.runs.append(unique[new])
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            merged = np.concatenate([self.runs[-1], last])
            merged.sort()
            self.runs[-1] = merged
        keep = np.zeros(len(keys), bool)
        keep[first[new]] = True
        return keep
