"""BPE-dropout (Provilkov et al., 2020) as SentencePiece's BPE model performs it, written out so that its draws
are a function of a seed alone, identical in every process, on every DDP rank and in a resumed run
(SentencePiece's own BPE sampling can differ from one process to the next). What
[`SampledBatches`][attnx.data.sampling.SampledBatches] draws for a BPE model, and what the batches' headroom is
planned from ([`headroom`][attnx.data.sampling.headroom]).

A word (a piece starting with `▁` and the pieces after it) starts as its characters; the adjacent pair whose
merge is the best-scored piece of the vocabulary is merged, each merge skipped with probability `alpha`, until
no pair merges.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

__all__ = ["MergeTable", "dropout_ids"]


class MergeTable:
    """The merges of a SentencePiece BPE model: every normal piece with its score (higher merges first)."""

    def __init__(self, sp: spm.SentencePieceProcessor) -> None:
        self.sp = sp
        self.ids = {
            sp.id_to_piece(i): i
            for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))
        }
        self.scores = {piece: sp.get_score(i) for piece, i in self.ids.items()}

    def words(self, ids: Sequence[int]) -> list[str | int]:
        """The words of a prepared segmentation: each piece starting with `▁` opens one; a piece that is not
        text (`<unk>`, a byte) stays as its id."""
        words: list[str | int] = []
        for i in ids:
            piece = self.sp.id_to_piece(i)
            if piece not in self.ids:
                words.append(int(i))
            elif piece.startswith("▁") or not words or isinstance(words[-1], int):
                words.append(piece)
            else:
                words[-1] += piece
        return words

    def split(self, word: str, rng: np.random.Generator, alpha: float) -> list[str]:
        """The pieces of `word` when each merge is dropped with probability `alpha`."""
        symbols = list(word)
        n = len(symbols)
        nxt = list(range(1, n + 1))
        prev = list(range(-1, n - 1))
        agenda: list[tuple[float, int, str, str]] = []

        def offer(left: int) -> None:
            right = nxt[left]
            if right < n:
                merged = symbols[left] + symbols[right]
                if merged in self.scores:
                    heapq.heappush(agenda, (-self.scores[merged], left, symbols[left], symbols[right]))

        for i in range(n - 1):
            offer(i)
        while agenda:
            _, left, a, b = heapq.heappop(agenda)
            right = nxt[left]
            if not symbols[left] or right >= n or symbols[left] != a or symbols[right] != b:
                continue  # stale: a neighbour merged since
            if alpha and rng.random() < alpha:
                continue
            symbols[left], symbols[right] = a + b, ""
            nxt[left] = nxt[right]
            if nxt[right] < n:
                prev[nxt[right]] = left
            offer(left)
            if prev[left] >= 0:
                offer(prev[left])
        return [x for x in symbols if x]

    def sample(self, ids: Sequence[int], rng: np.random.Generator, alpha: float) -> list[int]:
        """A prepared sentence (ids) re-segmented with BPE-dropout `alpha`."""
        out: list[int] = []
        for word in self.words(ids):
            if isinstance(word, int):
                out.append(word)
            else:
                out += [self.ids.get(x, self.sp.unk_id()) for x in self.split(word, rng, alpha)]
        return out


def dropout_ids(
    table: MergeTable, sentences: Sequence[Sequence[int]], alpha: float, seed: tuple[int, ...]
) -> list[list[int]]:
    """Each prepared sentence (ids) re-segmented with BPE-dropout `alpha`, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    return [table.sample(ids, rng, alpha) for ids in sentences]
