"""Lexically constrained beam search: phrases every output must contain, found by dynamic beam allocation
(Post & Vilar 2018), vectorized over sentences and phrases as Hu et al. (2019) do.

Phrases are matched on the text the pieces spell, as whole words by default ([`terms`][attnx.inference.terms]):
however the model spells a phrase, it is seen, and a phrase listed twice must appear twice. Per sentence, `C`
phrases, met in any order or, when `ordered`, one after the other. A phrase's *progress* is its length in
characters once met, else the characters of it the output ends with. Each step:

1. **Candidates.** Every live row offers its `k` most probable next tokens and, for every unmet phrase
   (ordered: the next one), the piece that goes on writing it from where the row is (at a word start also its
   `▁`-led form), each once.
2. **Banks.** A candidate's bank is the progress its hypothesis would have, summed over the phrases.
3. **Allocation.** A sentence's candidates are ranked by score within their bank, and the beam is filled
   round-robin over banks, most progress first: the best of every bank, then the second best, and so on.
   A hypothesis with little progress but a good score keeps a slot beside those that wrote the phrases.
4. **Ending.** `</s>` is banned until every phrase is met (a phrase that ends the output is met by the end);
   the maximum length still wins, and a hypothesis it ends says which phrases it missed (`Hypothesis.unmet`).

Everything is a few tensor operations over the rows of all sentences, on the CPU and the GPU alike; the
state per row (each phrase's automaton, how many times each phrase was met) follows the search's back-pointers.
Nothing here needs Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnx.errors import ConfigError
from attnx.inference.term_tables import TermTables
from attnx.inference.terms import Term, Vocabulary

__all__ = ["LexicalBeam", "PhraseIds", "compile_phrases"]


@dataclass
class PhraseIds:
    """One input's lexical constraints: phrases as target ids (SentencePiece pieces, no `<s>`/`</s>`), matched on
    the text they spell ([`terms`][attnx.inference.terms])."""

    include: list[list[int]] = field(default_factory=list)
    """Phrases every output must contain (a phrase listed twice: twice)."""
    exclude: list[list[int]] = field(default_factory=list)
    """Phrases no output may contain."""
    ordered: bool = False
    """The `include` phrases must appear in the given order, each after the end of the one before."""
    whole_words: bool = True
    """Match the phrases as whole words (False: anywhere, e.g. inside compounds)."""


def compile_phrases(
    vocab: Vocabulary, phrases: Sequence[PhraseIds], include: bool
) -> tuple[list[list[Term]], list[list[int]], list[list[list[int]]]]:
    """Per sentence, its `include` (or `exclude`) phrases compiled for `vocab`, how many times each is needed,
    and which of the input's phrases each stands for: unordered phrases to include listed twice are one phrase
    needed twice."""
    terms, needs, origins = [], [], []
    for c in phrases:
        ids = c.include if include else c.exclude
        # the text the ids spell (the normalizer's, encode_phrases encoded), without a word's leading space
        texts = [vocab.spell(x) if vocab.by_ids else vocab.spell(x).strip("▁") for x in ids]
        if not all(texts):
            raise ConfigError("an empty phrase: give its words, or leave it out")
        whole = c.whole_words and not vocab.by_ids
        unique: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            key = text if include and not c.ordered else f"{i}\x00{text}"
            unique.setdefault(key, []).append(i)
        row = []
        for positions in unique.values():
            text = texts[positions[0]]
            try:
                row.append(vocab.term(text, whole))
            except ValueError as err:
                raise ConfigError(
                    f"the phrase {text.replace('▁', ' ')!r} has characters no piece of the model spells: {err}"
                ) from None
        terms.append(row)
        needs.append([len(positions) for positions in unique.values()])
        origins.append([positions for positions in unique.values()])
    return terms, needs, origins


class LexicalBeam:
    """Beam search with dynamic beam allocation over the phrases of each sentence (module docstring).

    Args:
        k: The beam.
        vocab_size: Tokens a row may write.
        tables: The batch's phrases to include, with how many times each must appear.
        ordered: Per sentence, whether its phrases must appear in order.
        origin: Per sentence and phrase of `tables`, the indices of the input's phrases it stands for (a phrase
            listed twice is one phrase needed twice); None: phrase `c` is phrase `c`.
    """

    def __init__(
        self,
        k: int,
        vocab_size: int,
        tables: TermTables,
        ordered: Sequence[bool],
        device: torch.device | str,
        origin: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> None:
        self.k = k
        self.kk = min(k, vocab_size)  # most probable tokens offered per row
        self.tables = tables
        self.ordered = torch.as_tensor(list(ordered), dtype=torch.bool, device=device)  # (B',)
        self.origin = origin
        self.sentence = torch.arange(len(ordered), device=device)  # (B',) index into `origin`
        self.banks = int((tables.lengths * tables.need).sum(1).max()) + 1 if len(ordered) else 1
        self.state = tables.start(len(ordered))  # (N, C) per row; one row per sentence at the start
        self.count = torch.zeros_like(self.state)  # (N, C) times each phrase was met

    def keep(self, index: Tensor) -> None:
        """Keep the sentences `index` (re-packing)."""
        self.tables.keep(index)
        self.ordered, self.sentence = self.ordered[index], self.sentence[index]

    def met(self, count: Tensor, state: Tensor, row_sent: Tensor) -> Tensor:
        """`(N, C)`: phrases met, counting one the end of the output would complete."""
        pending = self.tables.waits(state, row_sent) & self.active(count, row_sent)
        return count + pending.long() >= self.tables.need[row_sent]

    def unfinished(self, row_sent: Tensor) -> Tensor:
        """`(N,)`: rows whose hypothesis has not met all its phrases (they may not write `</s>`)."""
        return ~self.met(self.count, self.state, row_sent).all(dim=1)

    def unmet(self, rows: Tensor, row_sent: Tensor) -> list[list[int]]:
        """Per row of `rows` (rows of the last step, whose sentences `row_sent` gives), the indices of the input's
        phrases its hypothesis has not met."""
        count, state, sent = self.count[rows], self.state[rows], row_sent[rows]
        missing = (self.tables.need[sent] - count - self.tables.waits(state, sent).long()).clamp(min=0)
        out = []
        for row, s in zip(missing.tolist(), self.sentence[sent].tolist(), strict=True):
            phrases = []
            for c, gap in enumerate(row):
                if gap:
                    phrases += list(self.origin[s][c][-gap:]) if self.origin is not None else [c]
            out.append(sorted(phrases))
        return out

    def active(self, count: Tensor, row_sent: Tensor) -> Tensor:
        """`(N, C)` (or `(N, M, C)` for counts `(N, M, C)`): the phrases a row may make progress on: the unmet
        ones, or for an ordered sentence the first unmet one."""
        need, ordered = self.tables.need[row_sent], self.ordered[row_sent]
        if count.dim() == 3:
            need, ordered = need.unsqueeze(1), ordered.unsqueeze(1)
        unmet = count < need
        first = unmet & (unmet.cumsum(dim=-1) == 1)
        return torch.where(ordered.unsqueeze(-1), first, unmet)

    def _after(self, tokens: Tensor, row_sent: Tensor) -> tuple[Tensor, Tensor]:
        """`(N, T, C)` states and counts of each row after each of `tokens` `(N, T)`."""
        new, events = self.tables.advance(self.state, tokens, row_sent)
        active = self.active(self.count, row_sent).unsqueeze(1)
        return new, self.count.unsqueeze(1) + events * active

    def candidates(
        self, log_probs: Tensor, scores: Tensor, row_sent: Tensor, row_pos: Tensor, n: int, history: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`(B', K)` extensions in allocation order: log P so far, the row each continues, its token, the
        token's log-prob (`-inf` log P: no extension); the selection's answer, with the phrases' banks."""
        k, device, tables = self.k, log_probs.device, self.tables
        rows = row_sent.numel()
        offers, withheld = tables.offered(self.state, row_sent, history[:, -1] if history.shape[1] else None)
        active = self.active(self.count, row_sent)
        offers = offers.masked_fill(~active.unsqueeze(2), -1).view(rows, -1)
        withheld = withheld.masked_fill(~active.unsqueeze(2), -1).view(rows, -1)
        if bool((withheld >= 0).any()):  # a phrase right after an opening bracket: no space before it
            log_probs = _withhold(log_probs, withheld)
        row_top, row_token = log_probs.topk(self.kk, dim=1)  # (N, K')
        offered = (offers >= 0) & ~(offers.unsqueeze(2) == row_token.unsqueeze(1)).any(dim=2)
        same = (offers.unsqueeze(2) == offers.unsqueeze(1)) & offered.unsqueeze(1)  # (N, 2C, 2C)
        offered &= ~torch.tril(same, diagonal=-1).any(dim=2)  # each token once per row
        phrase_token = offers.clamp(min=0)
        token = torch.cat([row_token, phrase_token], dim=1)  # (N, M)
        step = torch.cat([row_top, log_probs.gather(1, phrase_token).masked_fill(~offered, -math.inf)], dim=1)

        # The bank of each candidate: the progress of its hypothesis.
        state, count = self._after(token, row_sent)  # (N, M, C)
        need, lengths = tables.need[row_sent].unsqueeze(1), tables.lengths[row_sent].unsqueeze(1)
        partial = tables.progress(state) * self.active(count, row_sent)  # the phrases still written
        bank = (lengths * count.minimum(need)).sum(dim=2) + partial.sum(dim=2)  # (N, M)

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
        slot_row[row_sent, row_pos] = torch.arange(rows, device=device)

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
        `(N, t)`: move each phrase's automaton by the new tokens and count the phrases they complete."""
        self.state, self.count = self.state[rows], self.count[rows]
        state, count = self._after(history[:, -1:], row_sent)
        self.state, self.count = state.squeeze(1), count.squeeze(1)


def _withhold(log_probs: Tensor, pieces: Tensor) -> Tensor:
    """`log_probs` `(N, V)` with each row's `pieces` `(N, K)` (-1: none) made impossible."""
    rows, cols = (pieces >= 0).nonzero(as_tuple=True)
    out = log_probs.clone()
    out[rows, pieces[rows, cols]] = -math.inf
    return out
