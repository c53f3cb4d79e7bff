"""What a search step may write: the tokens each row is banned from, applied to the next-token
log-probabilities before the token selection ([`selection`][attnx.inference.selection]) sees them.

* `<pad>` and `<s>` are never generated; `<unk>` is allowed.
* `min_length` bans `</s>` before that many tokens.
* `no_repeat_ngram` bans any token that would repeat an n-gram of the hypothesis.
* Banned phrases (a sentence's `exclude` constraints, [`PhraseIds`][attnx.inference.lexical.PhraseIds]),
  matched on the text the pieces spell ([`terms`][attnx.inference.terms]): every piece that would complete one
  is banned, so the output never contains it, however spelled (as a whole word by default: after `Hund`, only
  what goes on with the word, as `Hundeleine` does, may follow).
* Until a hypothesis contains every phrase it must ([`lexical`][attnx.inference.lexical]), `</s>` is banned.
* A forced prefix allows only its next token until it is written (its log-probabilities count in the score);
  the maximum length is never below the prefix's length.
* At the maximum length ([`max_output_lengths`][attnx.inference.lengths.max_output_lengths]) `</s>` is the
  only token allowed, with its real log-probability, so a model that never ends a sentence stops at exactly
  `L` tokens. The maximum length wins over all the others, and a row left with no allowed token may end
  (`</s>`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.term_tables import TermTables

__all__ = ["Constraints", "prefix_table"]


class Constraints:
    """What a step may generate, per row: the bans of the module docstring, applied to log-probabilities."""

    def __init__(
        self,
        config: SearchConfig,
        prefixes: Tensor | None,
        prefix_lengths: Tensor | None,
        bans: TermTables | None = None,
    ) -> None:
        self.min_length = config.min_length
        self.ngram = config.no_repeat_ngram
        self.prefixes = prefixes  # (B', P) forced prefix ids per sentence still searched, PAD-padded
        self.prefix_lengths = prefix_lengths  # (B',)
        self.bans = bans  # the sentences' phrases to exclude
        self.ban_state: Tensor | None = None  # (N, D) each row's automaton per phrase, from its first step

    def keep(self, index: Tensor) -> None:
        """Keep the sentences `index` (re-packing)."""
        if self.prefixes is not None and self.prefix_lengths is not None:
            self.prefixes, self.prefix_lengths = self.prefixes[index], self.prefix_lengths[index]
        if self.bans is not None:
            self.bans.keep(index)

    def ban_phrases(self, log_probs: Tensor, t: int, history: Tensor, row_sent: Tensor) -> None:
        """Ban in place every piece that would complete a banned phrase after a row's output."""
        assert self.bans is not None
        if self.ban_state is None:
            self.ban_state = self.bans.start(row_sent.numel())
        self.bans.ban(log_probs, self.ban_state, row_sent)

    def follow(self, rows: Tensor, history: Tensor, row_sent: Tensor) -> None:
        """After the search moved to rows `rows` and appended their tokens to `history`: move the banned
        phrases' automata."""
        if self.bans is not None and self.ban_state is not None:
            state, _ = self.bans.advance(self.ban_state[rows], history[:, -1:], row_sent)
            self.ban_state = state.squeeze(1)

    def apply(
        self,
        log_probs: Tensor,
        t: int,
        at_max: Tensor,
        history: Tensor,
        row_sent: Tensor,
        no_eos: Tensor | None = None,
    ) -> Tensor:
        """Ban in place what rows with `t` tokens `history` `(N, t)` may not write next; `at_max` `(N,)`: only
        `</s>`; `no_eos` `(N,)`: rows that may not end yet (phrases still to write)."""
        raw_eos = log_probs[:, EOS_ID].clone()
        forced = None
        if self.prefixes is not None and self.prefix_lengths is not None and t < self.prefixes.shape[1]:
            forced = t < self.prefix_lengths[row_sent]  # (N,) rows still writing their prefix
            token = self.prefixes[row_sent, t].unsqueeze(1)  # (N, 1)
            forced_log_prob = log_probs.gather(1, token)
        log_probs[:, PAD_ID] = -math.inf
        log_probs[:, BOS_ID] = -math.inf
        constrained = False
        if t < self.min_length:
            log_probs[:, EOS_ID] = -math.inf
            constrained = True
        if no_eos is not None:
            log_probs[:, EOS_ID] = log_probs[:, EOS_ID].masked_fill(no_eos, -math.inf)
            constrained = True
        if self.bans is not None:
            self.ban_phrases(log_probs, t, history, row_sent)
            constrained = True
        n = self.ngram
        if n and t >= n:
            grams = history.unfold(1, n, 1)  # (N, t - n + 1, n) every n-gram written so far
            # an n-gram whose first n - 1 tokens end the row: its last token would repeat it
            tail = history[:, t - n + 1 :].unsqueeze(1)  # (N, 1, n - 1)
            seen = (grams[:, :, :-1] == tail).all(dim=2)  # (N, t - n + 1)
            log_probs.scatter_(1, grams[:, :, -1].masked_fill(~seen, PAD_ID), -math.inf)
            constrained = True
        if forced is not None and bool(forced.any()):  # the prefix's token, whatever the bans say
            only = torch.full_like(log_probs, -math.inf).scatter_(1, token, forced_log_prob)
            log_probs = torch.where(forced.unsqueeze(1), only, log_probs)
        if constrained:  # a row with nothing left to write may end
            stuck = ~torch.isfinite(log_probs).any(dim=1)
            at_max = at_max | stuck
        if bool(at_max.any()):
            log_probs[at_max] = -math.inf
            log_probs[:, EOS_ID] = torch.where(at_max, raw_eos, log_probs[:, EOS_ID])
        return log_probs


def prefix_table(
    prefixes: Sequence[Sequence[int]] | None, b: int, device: torch.device | str
) -> tuple[Tensor | None, Tensor | None]:
    """The forced prefixes of `b` sentences as a `(B, P)` table of ids (`<pad>` after each prefix) and their
    lengths `(B,)`; `(None, None)` when no sentence has one."""
    if prefixes is None or not any(prefixes):
        return None, None
    if len(prefixes) != b:
        raise ConfigError(f"{len(prefixes)} prefixes for {b} sources: give one (possibly empty) per source")
    width = max(len(p) for p in prefixes)
    table = torch.full((b, width), PAD_ID, dtype=torch.long)
    for i, p in enumerate(prefixes):
        table[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long)
    return table.to(device), lengths.to(device)
