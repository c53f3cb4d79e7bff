"""A batch's terminology phrases ([`terms`][attnx.inference.terms]) as tensors the search reads: per sentence
and phrase, its automaton on the pieces that move it, and the rules every other piece follows."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnx.data.batch import PAD_ID
from attnx.inference.terms import MID, START, Term, Vocabulary

__all__ = ["TermTables"]

FIELDS = ("tokens", "nxt", "events", "offers", "lengths", "need", "waiting", "free_start", "pieces", "spaced")
"""The tables' tensors indexed by sentence: moved to the device together, kept together on re-packing."""


class TermTables:
    """A batch's phrases as tensors: per sentence `C` of them (padding: length 0, needed 0 times).

    Args:
        terms: Per sentence, its phrases.
        needs: Per sentence, how many times each must appear (None: once each).
    """

    def __init__(
        self,
        vocab: Vocabulary,
        terms: Sequence[Sequence[Term]],
        device: torch.device | str,
        needs: Sequence[Sequence[int]] | None = None,
    ) -> None:
        b = len(terms)
        c = max(max((len(t) for t in terms), default=0), 1)
        s = max((x.states for t in terms for x in t), default=2)
        m = max(max((len(x.tokens) for t in terms for x in t), default=0), 1)
        self.tokens = torch.full((b, c, m), -1, dtype=torch.long)
        self.nxt = torch.full((b, c, s, m), MID, dtype=torch.long)
        self.events = torch.zeros((b, c, s, m), dtype=torch.long)
        self.offers = torch.full((b, c, s, 2), -1, dtype=torch.long)
        self.lengths = torch.zeros((b, c), dtype=torch.long)
        self.need = torch.zeros((b, c), dtype=torch.long)
        self.waiting = torch.full((b, c), -1, dtype=torch.long)  # the state that waits for a boundary
        self.free_start = torch.ones((b, c), dtype=torch.bool)
        self.pieces = torch.zeros(b, dtype=torch.long)  # the output length the phrases take
        # per phrase, the pieces that begin it after a space (and a space on its own): what may not follow an
        # opening bracket while the phrase is to be written
        spaced = [
            [
                [
                    t
                    for m, t in enumerate(term.tokens)
                    if vocab.pieces[t][:1] == "▁" and term.nxt[START][m] > START
                ]
                + ([vocab.ids["▁"]] if "▁" in vocab.ids else [])
                for term in row
            ]
            for row in terms
        ]
        w = max((len(x) for row in spaced for x in row), default=1) or 1
        self.spaced = torch.full((b, c, w), -1, dtype=torch.long)
        for i, row in enumerate(spaced):
            for j, x in enumerate(row):
                self.spaced[i, j, : len(x)] = torch.tensor(x, dtype=torch.long)
        for i, row in enumerate(terms):
            for j, term in enumerate(row):
                k, st = len(term.tokens), term.states
                need = 1 if needs is None else needs[i][j]
                self.tokens[i, j, :k] = torch.tensor(term.tokens, dtype=torch.long)
                self.nxt[i, j, :st, :k] = torch.tensor(term.nxt, dtype=torch.long).view(st, k)
                self.events[i, j, :st, :k] = torch.tensor(term.events, dtype=torch.long).view(st, k)
                self.offers[i, j, :st] = torch.tensor(term.offers, dtype=torch.long)
                self.lengths[i, j], self.need[i, j] = len(term.text), need
                self.waiting[i, j] = len(term.text) + 1 if term.waits else -1
                self.free_start[i, j] = term.free_start
                self.pieces[i] += term.pieces * need
        for name in FIELDS:
            setattr(self, name, getattr(self, name).to(device))
        self.starts_free = vocab.starts_free.to(device)
        self.ends_free = vocab.ends_free.to(device)
        self.opens, self.joins = vocab.opens.to(device), vocab.joins.to(device)
        self.empty = vocab.empty.to(device)
        self.by_ids = vocab.by_ids  # ids stand for themselves: no spaces to write or leave out

    def keep(self, index: Tensor) -> None:
        """Keep the sentences `index` (re-packing)."""
        for name in FIELDS:
            setattr(self, name, getattr(self, name)[index])

    def start(self, rows: int) -> Tensor:
        """`(N, C)` the state of rows that wrote nothing yet."""
        return torch.full((rows, self.lengths.shape[1]), START, dtype=torch.long, device=self.lengths.device)

    def advance(self, state: Tensor, tokens: Tensor, row_sent: Tensor) -> tuple[Tensor, Tensor]:
        """`(N, T, C)` states after each of `tokens` `(N, T)` from `state` `(N, C)`, and the phrases each
        completes (events)."""
        cand = self.tokens[row_sent]  # (N, C, M)
        n, c, m = cand.shape
        at = state.clamp(max=self.nxt.shape[2] - 1)[:, :, None, None].expand(n, c, 1, m)
        nxt = self.nxt[row_sent].gather(2, at).squeeze(2)  # (N, C, M)
        events = self.events[row_sent].gather(2, at).squeeze(2)
        match = cand.unsqueeze(1) == tokens[:, :, None, None]  # (N, T, C, M)
        found = match.any(dim=3)
        pos = match.to(torch.uint8).argmax(dim=3, keepdim=True)  # (N, T, C, 1)
        t = tokens.shape[1]
        new = nxt.unsqueeze(1).expand(n, t, c, m).gather(3, pos).squeeze(3)
        hit = events.unsqueeze(1).expand(n, t, c, m).gather(3, pos).squeeze(3)
        ends_free = self.ends_free[tokens].unsqueeze(2)  # (N, T, 1)
        default = torch.where(self.free_start[row_sent].unsqueeze(1) | ends_free, START, MID)
        waiting = (state == self.waiting[row_sent]).unsqueeze(1)  # (N, 1, C)
        default_hit = (waiting & self.starts_free[tokens].unsqueeze(2)).long()
        new, hit = torch.where(found, new, default), torch.where(found, hit, default_hit)
        empty = self.empty[tokens].unsqueeze(2)  # (N, T, 1)
        return torch.where(empty, state.unsqueeze(1), new), hit.masked_fill(empty, 0)

    def offered(self, state: Tensor, row_sent: Tensor, last: Tensor | None) -> tuple[Tensor, Tensor]:
        """`(N, C, 2)` the pieces to offer each row for each phrase (-1: none): at a word start after an opening
        bracket or low quote (`last`: each row's last token; None: nothing written) the phrase without a space,
        after `"`, `'`, `-` or `/` with or without one, elsewhere with one; and `(N, C, W)` the pieces withheld
        after an opening bracket (-1: none), which the row may not write there (`( Frau`): every piece that
        begins the phrase after a space, and a space on its own."""
        at = state.clamp(max=self.offers.shape[2] - 1)[:, :, None, None].expand(-1, -1, 1, 2)
        offers = self.offers[row_sent].gather(2, at).squeeze(2)  # (N, C, 2): at START (bare, spaced)
        if self.by_ids:
            return offers, torch.full_like(self.spaced[row_sent], -1)
        if last is None:
            opens = joins = torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
        else:
            opens, joins = self.opens[last], self.joins[last]
        start = state == START
        bare = start & ~(opens | joins).unsqueeze(1)
        spaced = start & opens.unsqueeze(1)
        withheld = self.spaced[row_sent].masked_fill(~spaced.unsqueeze(-1), -1)
        offers[..., 0] = offers[..., 0].masked_fill(bare, -1)
        offers[..., 1] = offers[..., 1].masked_fill(spaced, -1)
        return offers, withheld

    def waits(self, state: Tensor, row_sent: Tensor) -> Tensor:
        """`(N, C)`: rows whose output ends with a whole phrase that the next boundary (or `</s>`) counts."""
        return state == self.waiting[row_sent]

    @staticmethod
    def progress(state: Tensor) -> Tensor:
        """`(N, ..., C)` characters of each phrase the output ends with (0 mid-word or at a start)."""
        return (state - 1).clamp(min=0)

    def ban(self, log_probs: Tensor, state: Tensor, row_sent: Tensor) -> None:
        """Ban in place every piece (and `</s>`) that would complete a phrase from `state` `(N, C)`."""
        cand = self.tokens[row_sent]  # (N, C, M)
        n, c, m = cand.shape
        at = state.clamp(max=self.events.shape[2] - 1)[:, :, None, None].expand(n, c, 1, m)
        hit = self.events[row_sent].gather(2, at).squeeze(2) > 0  # (N, C, M)
        # the entries that complete nothing ban <pad>, which is never written anyway
        log_probs.scatter_(1, cand.masked_fill(~hit | (cand < 0), PAD_ID).view(n, -1), -torch.inf)
        waiting = self.waits(state, row_sent).any(dim=1)  # (N,)
        if bool(waiting.any()):
            log_probs.masked_fill_(waiting.unsqueeze(1) & self.starts_free[: log_probs.shape[1]], -torch.inf)
