"""Lexically constrained beam search: target phrases every output must contain, found by dynamic beam
allocation (Post & Vilar 2018), vectorized over sentences and phrases as Hu et al. (2019) do.

Per sentence, `C` phrases of target ids (`include`), met in any order or, when `ordered`, one after the
other. A phrase is *met* once the hypothesis contains it; its *progress* is the number of tokens of its
phrases met, plus the longest start of an unmet phrase the hypothesis ends with. Each step:

1. **Candidates.** Every live row offers its `k` most probable next tokens and, for every unmet phrase
   (ordered: the next one), the token that continues each start of that phrase the row ends with (the
   phrase's first token included), each once.
2. **Banks.** A candidate's bank is the progress its hypothesis would have.
3. **Allocation.** A sentence's candidates are ranked by score within their bank, and the beam is filled
   round-robin over banks, most progress first: the best of every bank, then the second best, and so on.
   A hypothesis with little progress but a good score keeps a slot beside those that wrote the phrases.
4. **Ending.** `</s>` is banned until every phrase is met; the maximum length still wins, and a hypothesis
   it ends says which phrases it missed (`Hypothesis.unmet`).

Everything is a few tensor operations over the rows of all sentences, on the CPU and the GPU alike; the
state per row (`met`) follows the search's back-pointers. Nothing here needs Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnx.data.batch import PAD_ID

__all__ = ["LexicalBeam", "PhraseIds", "phrase_table"]


@dataclass
class PhraseIds:
    """One input's lexical constraints as target ids (SentencePiece pieces, no `<s>`/`</s>`)."""

    include: list[list[int]] = field(default_factory=list)
    """Phrases every output must contain."""
    exclude: list[list[int]] = field(default_factory=list)
    """Phrases no output may contain."""
    ordered: bool = False
    """The `include` phrases must appear in the given order, each after the end of the one before."""


def phrase_table(
    phrases: Sequence[Sequence[Sequence[int]]], device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """Per sentence, its phrases as a `(B, C, P)` table of ids (`<pad>` after each phrase, empty phrases to
    fill the `C`) and their lengths `(B, C)` (0: no phrase)."""
    b = len(phrases)
    c = max((len(p) for p in phrases), default=0)
    width = max((len(x) for p in phrases for x in p), default=0)
    ids = torch.full((b, max(c, 1), max(width, 1)), PAD_ID, dtype=torch.long)
    lengths = torch.zeros((b, max(c, 1)), dtype=torch.long)
    for i, p in enumerate(phrases):
        for j, x in enumerate(p):
            ids[i, j, : len(x)] = torch.as_tensor(list(x), dtype=torch.long)
            lengths[i, j] = len(x)
    return ids.to(device), lengths.to(device)


def ends_with_starts(history: Tensor, ids: Tensor, limit: Tensor) -> Tensor:
    """`(N, C, P)`: whether row `i`'s `history` `(N, t)` ends with the first `j` tokens of phrase `c` of `ids`
    `(N, C, P)` (`j = 0`: always), counting no more than `limit` `(N,)` last tokens."""
    n, c, p = ids.shape
    t = history.shape[1]
    starts = torch.zeros((n, c, p), dtype=torch.bool, device=ids.device)
    starts[:, :, 0] = True
    for j in range(1, min(p, t + 1)):
        tail = history[:, t - j :].unsqueeze(1)  # (N, 1, j)
        starts[:, :, j] = (ids[:, :, :j] == tail).all(dim=2) & (limit >= j).unsqueeze(1)
    return starts


class LexicalBeam:
    """Beam search with dynamic beam allocation over the phrases of each sentence (module docstring).

    Args:
        k: The beam.
        vocab_size: Tokens a row may write.
        phrases: Per sentence of the batch, its `include` phrases (ids; an empty list: none).
        ordered: Per sentence, whether its phrases must appear in order.
    """

    def __init__(
        self,
        k: int,
        vocab_size: int,
        phrases: Sequence[Sequence[Sequence[int]]],
        ordered: Sequence[bool],
        device: torch.device | str,
    ) -> None:
        self.k = k
        self.kk = min(k, vocab_size)  # most probable tokens offered per row
        self.ids, self.lengths = phrase_table(phrases, device)  # (B', C, P), (B', C)
        self.ordered = torch.as_tensor(list(ordered), dtype=torch.bool, device=device)  # (B',)
        self.banks = max(sum(len(x) for x in p) for p in phrases) + 1 if phrases else 1
        self.met = self.lengths == 0  # (N, C) per row; one row per sentence at the start
        self.since = torch.zeros(len(phrases), dtype=torch.long, device=device)  # (N,) tokens since the last
        # ordered phrase was met

    def keep(self, index: Tensor) -> None:
        """Keep the sentences `index` (re-packing)."""
        self.ids, self.lengths, self.ordered = self.ids[index], self.lengths[index], self.ordered[index]

    def unfinished(self) -> Tensor:
        """`(N,)`: rows whose hypothesis has not met all its phrases (they may not write `</s>`)."""
        return ~self.met.all(dim=1)

    def unmet(self, rows: Tensor) -> list[list[int]]:
        """Per row of `rows`, the indices of the phrases its hypothesis has not met."""
        real = self.lengths.shape[1]
        return [[c for c in range(real) if not m[c]] for m in self.met[rows].tolist()]

    def active(self, row_sent: Tensor) -> Tensor:
        """`(N, C)`: the phrases a row may make progress on: the unmet ones, or for an ordered sentence the
        first unmet one."""
        unmet = ~self.met
        first = unmet & (unmet.cumsum(dim=1) == 1)
        return torch.where(self.ordered[row_sent].unsqueeze(1), first, unmet)

    def candidates(
        self, log_probs: Tensor, scores: Tensor, row_sent: Tensor, row_pos: Tensor, n: int, history: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`(B', K)` extensions in allocation order: log P so far, the row each continues, its token, the
        token's log-prob (`-inf` log P: no extension); the selection's answer, with the phrases' banks."""
        k, device = self.k, log_probs.device
        ids, lengths = self.ids[row_sent], self.lengths[row_sent]  # (N, C, P), (N, C)
        limit = torch.where(self.ordered[row_sent], self.since, history.shape[1])
        c, p = ids.shape[1], ids.shape[2]
        position = torch.arange(p, device=device)
        # (N, C, P): the row ends with the first j tokens of phrase c, which it may continue
        open_ = ends_with_starts(history, ids, limit) & (position < lengths.unsqueeze(2))
        open_ &= self.active(row_sent).unsqueeze(2)
        row_top, row_token = log_probs.topk(self.kk, dim=1)  # (N, K')
        phrase_token = ids.view(-1, c * p)  # (N, C P) the token continuing each open start
        offered = open_.view(-1, c * p) & ~(phrase_token.unsqueeze(2) == row_token.unsqueeze(1)).any(dim=2)
        same = (phrase_token.unsqueeze(2) == phrase_token.unsqueeze(1)) & offered.unsqueeze(1)  # (N, CP, CP)
        offered &= ~torch.tril(same, diagonal=-1).any(dim=2)  # each token once per row
        token = torch.cat([row_token, phrase_token], dim=1)  # (N, M)
        step = torch.cat([row_top, log_probs.gather(1, phrase_token).masked_fill(~offered, -math.inf)], dim=1)

        # The bank of each candidate: the progress of its hypothesis.
        match = open_.unsqueeze(1) & (ids.unsqueeze(1) == token.view(*token.shape, 1, 1))  # (N, M, C, P)
        reached = (match * (position + 1)).amax(dim=3)  # (N, M, C) phrase tokens matched after the token
        done = (reached == lengths.unsqueeze(1)) & (lengths.unsqueeze(1) > 0)
        met = self.met.unsqueeze(1) | done
        bank = (lengths.unsqueeze(1) * met).sum(dim=2) + reached.masked_fill(done, 0).amax(dim=2)  # (N, M)

        m = token.shape[1]
        table = torch.full((n, k, m), -math.inf, dtype=log_probs.dtype, device=device)
        table[row_sent, row_pos] = scores.unsqueeze(1) + step
        cand_token = torch.zeros((n, k, m), dtype=torch.long, device=device)
        cand_token[row_sent, row_pos] = token
        cand_step = torch.zeros((n, k, m), dtype=log_probs.dtype, device=device)
        cand_step[row_sent, row_pos] = step
        cand_bank = torch.zeros((n, k, m), dtype=torch.long, device=device)
        cand_bank[row_sent, row_pos] = bank
        slot_row = torch.zeros((n, k), dtype=torch.long, device=device)
        slot_row[row_sent, row_pos] = torch.arange(row_sent.numel(), device=device)

        score, order = table.view(n, -1).sort(dim=1, descending=True)  # (B', K M)
        bank = cand_bank.view(n, -1).gather(1, order).clamp(max=self.banks - 1)
        onehot = F.one_hot(bank, self.banks)  # (B', K M, banks)
        rank = (onehot.cumsum(dim=1) * onehot).sum(dim=2) - 1  # place within its bank, by score
        key = rank * self.banks + (self.banks - 1 - bank)  # round-robin, most progress first
        key = key.masked_fill(score == -math.inf, torch.iinfo(torch.long).max)
        pick = order.gather(1, key.topk(k, dim=1, largest=False).indices)  # (B', K) in allocation order
        top = table.view(n, -1).gather(1, pick)
        source = slot_row.gather(1, pick // m)
        return top, source, cand_token.view(n, -1).gather(1, pick), cand_step.view(n, -1).gather(1, pick)

    def follow(self, rows: Tensor, history: Tensor, row_sent: Tensor) -> None:
        """After the search moved to rows `rows` of the last step and appended their tokens to `history`
        `(N, t)`: mark the phrases the new hypotheses complete."""
        self.met, self.since = self.met[rows], self.since[rows] + 1
        ids, lengths = self.ids[row_sent], self.lengths[row_sent]  # (N, C, P), (N, C)
        t = history.shape[1]
        limit = torch.where(self.ordered[row_sent], self.since, t)
        done = torch.zeros_like(self.met)
        for length in range(1, min(ids.shape[2], t) + 1):
            ends = (ids[:, :, :length] == history[:, t - length :].unsqueeze(1)).all(dim=2)
            done |= ends & (lengths == length) & (limit >= length).unsqueeze(1)
        done &= self.active(row_sent)
        self.met = self.met | done
        self.since = self.since.masked_fill(done.any(dim=1), 0)
