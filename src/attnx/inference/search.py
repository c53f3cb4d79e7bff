"""§6.1 Decoding: one generation loop over a [`Decoder`][attnx.inference.decoder.Decoder] (cached keys/values),
with beam search or sampling as its token-selection strategy.

The paper decodes with "beam search with a beam size of 4 and length penalty α = 0.6", a "maximum output
length during inference to input length + 50, but terminate early when possible". Here:

* **Length penalty.** A finished hypothesis `Y` (its tokens and the closing `</s>`; `|Y|` counts the
  `</s>` as tensor2tensor does) scores `log P(Y) / lp(|Y|)` with the GNMT penalty
  `lp(n) = ((5 + n) / 6) ** α` (Wu et al. 2016, the paper's reference [38]), or `n ** α` with
  `length_penalty="fairseq"`. Live hypotheses are ranked by `log P` alone.
* **Maximum length.** `input length` is the number of real source positions (`src_mask.sum(1)`, which
  includes the source `</s>`, as tensor2tensor and fairseq count it). A hypothesis holds at most
  `L = floor(max_len_a * input length + max_len_b)` tokens before `</s>` (at least the forced prefix's
  length); at that point `</s>` is the only token allowed (with its real log-probability), so a model that
  never ends a sentence stops at exactly `L` tokens. `L` is also capped so that `L + 1` target positions
  fit the model (`SearchConfig.max_positions`).
* **The beam.** Each sentence owns `beam` slots. Each step, the live hypotheses' extensions are ranked by
  `log P` and the best `k` are kept, where `k` is the number of slots not yet taken by finished
  hypotheses; an extension ending in `</s>` takes its slot for good (the beam shrinks). So beam 1 is
  exactly greedy search, and a beam wider than the number of possible prefixes is exhaustive search.
* **Sampling.** The same loop with another selection: each sentence owns `nbest` slots, one per sample,
  and each live row draws its next token from the model's distribution, shaped by `temperature`, then cut
  to the `top_k` most probable tokens, to the tokens of probability at least `epsilon` (the most probable
  always stays) and to the nucleus of probability `top_p`. Reported log-probabilities
  are the model's own (unshaped), so forced scoring gives them back.
* **Early termination.** A live hypothesis with `t` tokens and log-probability `s <= 0` can only end as
  a hypothesis of total length `m` in `[t + 1, L + 1]` with log-probability `s' <= s` (log-probs of
  further tokens are `<= 0`). Its final score `s' / lp(m)` is therefore at most
  `s / max(lp(t + 1), lp(L + 1))`: `s` is negative, so dividing it by the *largest* reachable penalty
  gives the largest value (for α >= 0 that is `lp(L + 1)`, the GNMT form grows with length). A sentence
  stops once the best live hypothesis's bound cannot beat the `nbest`-th best finished score, so the
  `nbest` best hypotheses returned are exactly those the full search would return. Sampling stops a
  sentence when all its samples have ended.
* **Constraints.** `<pad>` and `<s>` are never generated; `<unk>` is allowed. `min_length` bans `</s>`
  before that many tokens, `no_repeat_ngram` bans any token that would repeat an n-gram of the
  hypothesis, and a forced prefix allows only its next token until it is written (its log-probabilities
  count in the score). The maximum length wins over all of them, and a row left with no allowed token may
  end (`</s>`).
* **Vectorized, and shrinking.** A step is a few tensor operations over the decoder rows of all sentences at
  once. Python only files away finished hypotheses. Rows of finished hypotheses and stopped sentences go
  dead; following back-pointers within a sentence moves only the self-attention caches
  (`same_sources=True`), and once the dead rows decoded reach [`COMPACT_AFTER`][attnx.inference.search.COMPACT_AFTER]
  of the live ones, the rows are re-packed to the live hypotheses of the sentences still searched
  ([`DecoderState.reorder`][attnx.model.transformer.DecoderState.reorder]), so work shrinks as hypotheses
  and sentences finish.

Encoder keys/values for the encoder-decoder attention are computed once per sentence
([`Transformer.start_decoding`][attnx.model.transformer.Transformer.start_decoding], one row per sentence for
the first step) and then copied to the rows of that sentence's hypotheses. Nothing here needs Lightning.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID
from attnx.errors import ConfigError
from attnx.inference.config import LengthPenalty, SearchConfig
from attnx.inference.decoder import Decoder, as_decoder, decoding
from attnx.inference.hypothesis import Hypothesis

__all__ = [
    "beam_search",
    "generate",
    "greedy_search",
    "length_penalty",
    "max_output_length",
    "max_output_lengths",
    "translate_batch",
]


def length_penalty(length: int | float | Tensor, alpha: float, kind: LengthPenalty = "gnmt"):
    """`lp(|Y|)`: GNMT `((5 + |Y|) / 6) ** α` or fairseq `|Y| ** α`; `|Y|` counts the `</s>`."""
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "fairseq":
        return length**alpha
    raise ConfigError(f"length_penalty must be 'gnmt' or 'fairseq', got {kind!r}")


def max_output_lengths(
    src_mask: Tensor, max_len_a: float, max_len_b: int, max_positions: int | None = None
) -> Tensor:
    """Per-sentence `L = floor(a * input length + b)` `(B,)`: tokens allowed before the forced `</s>`."""
    lengths = [max_output_length(n, max_len_a, max_len_b, max_positions) for n in src_mask.sum(1).tolist()]
    return torch.tensor(lengths, dtype=torch.long, device=src_mask.device)


def max_output_length(
    input_length: int, max_len_a: float, max_len_b: int, max_positions: int | None = None
) -> int:
    """`L = floor(a * input length + b)` tokens allowed before the forced `</s>`, for a source of
    `input_length` positions (its `</s>` included), capped so that `L + 1` positions fit the model."""
    cap = math.inf if max_positions is None else max_positions - 1  # L tokens + </s>: L + 1 positions
    return max(0, min(cap, math.floor(max_len_a * input_length + max_len_b)))


COMPACT_AFTER = 0.2
"""Re-pack the decoder rows once the dead rows decoded since the last re-pack reach this fraction of the
live ones. Re-packing copies each kept row's source side (memory and encoder-decoder keys/values), which
costs about a tenth of one decoding step of that row; decoding a dead row costs a whole step."""


# ------------------------------------------------------------------------------------------- constraints


class Constraints:
    """What a step may generate, per row: the bans of the module docstring, applied to log-probabilities."""

    def __init__(self, config: SearchConfig, prefixes: Tensor | None, prefix_lengths: Tensor | None) -> None:
        self.min_length = config.min_length
        self.ngram = config.no_repeat_ngram
        self.prefixes = prefixes  # (B', P) forced prefix ids per sentence still searched, PAD-padded
        self.prefix_lengths = prefix_lengths  # (B',)

    def keep(self, index: Tensor) -> None:
        """Keep the sentences `index` (re-packing)."""
        if self.prefixes is not None and self.prefix_lengths is not None:
            self.prefixes, self.prefix_lengths = self.prefixes[index], self.prefix_lengths[index]

    def apply(self, log_probs: Tensor, t: int, at_max: Tensor, history: Tensor, row_sent: Tensor) -> Tensor:
        """Ban in place what rows with `t` tokens `history` `(N, t)` may not write next; `at_max` `(N,)`: only `</s>`."""
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


# ----------------------------------------------------------------------------------- token selection


class BeamSelection:
    """Beam search: each sentence keeps the `k` most probable extensions of all its rows."""

    stops_early = True

    def __init__(self, k: int, vocab_size: int) -> None:
        self.k = k
        self.kk = min(k, vocab_size)  # tokens kept per row

    def candidates(
        self, log_probs: Tensor, scores: Tensor, row_sent: Tensor, row_pos: Tensor, n: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`(B', K)` extensions, best first: log P so far, the row each continues, its token, the token's log-prob."""
        k, kk, device = self.k, self.kk, log_probs.device
        rows_now = row_sent.numel()
        # A sentence's K best extensions are among the K best tokens of each of its rows.
        row_top, row_token = log_probs.topk(kk, dim=1)  # (N, K')
        cand = torch.full((n, k, kk), -math.inf, device=device)
        cand[row_sent, row_pos] = scores.unsqueeze(1) + row_top  # log P
        cand_token = torch.zeros((n, k, kk), dtype=torch.long, device=device)
        cand_token[row_sent, row_pos] = row_token
        cand_step = torch.zeros((n, k, kk), device=device)
        cand_step[row_sent, row_pos] = row_top
        slot_row = torch.zeros((n, k), dtype=torch.long, device=device)  # (B', K) row at each position
        slot_row[row_sent, row_pos] = torch.arange(rows_now, device=device)
        top, index = cand.view(n, -1).topk(k, dim=1)  # (B', K) best extensions, sorted
        source = slot_row.gather(1, index // kk)
        token = cand_token.view(n, -1).gather(1, index)
        step = cand_step.view(n, -1).gather(1, index)
        return top, source, token, step


class SampleSelection:
    """Ancestral sampling: each row draws one next token from the model's distribution, shaped by
    `temperature`, `top_k`, `epsilon` and `top_p`."""

    stops_early = False

    def __init__(self, k: int, config: SearchConfig, generator: torch.Generator | None) -> None:
        self.k = k
        self.temperature = config.temperature
        self.top_k = config.top_k
        self.top_p = config.top_p
        self.epsilon = config.epsilon
        self.generator = generator

    def shaped(self, log_probs: Tensor) -> Tensor:
        """The `(N, V)` probabilities draws are made from."""
        logits = log_probs / self.temperature if self.temperature != 1.0 else log_probs
        if 0 < self.top_k < logits.shape[1]:
            kth = logits.topk(self.top_k, dim=1).values[:, -1:]  # (N, 1)
            logits = logits.masked_fill(logits < kth, -math.inf)
        probs = logits.softmax(dim=1)
        if self.epsilon > 0:  # epsilon sampling: drop the improbable tokens, never the most probable one
            low = (probs < self.epsilon) & (probs < probs.amax(dim=1, keepdim=True))
            probs = probs.masked_fill(low, 0.0)
            probs = probs / probs.sum(dim=1, keepdim=True)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=1, descending=True)
            before = sorted_probs.cumsum(dim=1) - sorted_probs  # mass of the more probable tokens
            cut = before >= self.top_p  # the nucleus: tokens until the mass reaches top_p (>= 1 token)
            probs = probs.scatter(1, order, sorted_probs.masked_fill(cut, 0.0))
        return probs

    def candidates(
        self, log_probs: Tensor, scores: Tensor, row_sent: Tensor, row_pos: Tensor, n: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        k, device = self.k, log_probs.device
        probs = self.shaped(log_probs)  # every row has an allowed token (Constraints.apply)
        token = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)  # (N,)
        step = log_probs.gather(1, token.unsqueeze(1)).squeeze(1)
        cand = torch.full((n, k), -math.inf, device=device)
        cand[row_sent, row_pos] = scores + step
        cand_token = torch.zeros((n, k), dtype=torch.long, device=device)
        cand_token[row_sent, row_pos] = token
        cand_step = torch.zeros((n, k), device=device)
        cand_step[row_sent, row_pos] = step
        slot_row = torch.zeros((n, k), dtype=torch.long, device=device)
        slot_row[row_sent, row_pos] = torch.arange(row_sent.numel(), device=device)
        top, index = cand.topk(k, dim=1)  # live samples first (the loop takes the first `slots`)
        return top, slot_row.gather(1, index), cand_token.gather(1, index), cand_step.gather(1, index)


# ------------------------------------------------------------------------------------------------ the loop


def _prefix_tensor(
    prefixes: Sequence[Sequence[int]] | None, b: int, device
) -> tuple[Tensor | None, Tensor | None]:
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


def generate(
    model: nn.Module | Decoder,
    src: Tensor,
    src_mask: Tensor,
    config: SearchConfig,
    *,
    prefixes: Sequence[Sequence[int]] | None = None,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """Per sentence of the padded batch `src` `(B, S)`, up to `config.nbest` hypotheses, best first.

    `prefixes`: per sentence, target ids every hypothesis must start with (empty: none). `generator`:
    the random numbers of sampling (default: torch's global generator, seeded by `config.seed` when set).

    Decoder rows are grouped by sentence, at most `k` each (the beam, or the number of samples):
    `row_sent`/`row_pos` say which sentence and which of its positions a row holds. Each step ranks every
    sentence's candidates in a dense `(sentences, k)` table; the next hypotheses then either reuse the
    current rows (a row stays with its sentence: only self-attention caches move) or, when a sentence needs
    more rows or enough rows have gone dead (finished hypotheses, finished sentences), the rows are
    re-packed to exactly the live hypotheses.
    """
    decoder = as_decoder(model)
    k = config.width
    nbest = min(config.nbest, k)
    device = src.device
    if config.sampling and generator is None and config.seed is not None:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    with decoding(decoder):
        b = src.shape[0]
        select = (
            SampleSelection(k, config, generator) if config.sampling else BeamSelection(k, decoder.vocab_size)
        )
        prefix_table, prefix_lengths = _prefix_tensor(prefixes, b, device)
        constraints = Constraints(config, prefix_table, prefix_lengths)
        limits = max_output_lengths(src_mask, config.max_len_a, config.max_len_b, config.max_positions)
        limits = limits.to(device)  # (B',) per sentence still searched
        if prefix_lengths is not None:
            limits = torch.maximum(limits, prefix_lengths)
        # Largest penalty a live hypothesis can still reach (see the module docstring); lp is monotone.
        lp_final = length_penalty(limits.float() + 1, config.alpha, config.length_penalty)
        state = decoder.start(src, src_mask)  # one row per sentence

        sentences = torch.arange(b, device=device)  # (B',) original index of each sentence still searched
        slots = torch.full((b,), k, dtype=torch.long, device=device)  # slots not taken by finished
        best_finished = torch.full((b, nbest), -math.inf, device=device)  # (B', nbest) sorted scores
        row_sent = torch.arange(b, device=device)  # (N,) sentence of each decoder row
        row_pos = torch.zeros(b, dtype=torch.long, device=device)  # (N,) its position within the sentence
        if config.sampling and k > 1:  # every sample draws from its own row from the first token on
            row_sent = row_sent.repeat_interleave(k)
            row_pos = torch.arange(k, device=device).repeat(b)
            decoder.reorder(state, row_sent)
        rows_now = row_sent.numel()
        scores = torch.zeros(rows_now, device=device)  # (N,) log P of each row's hypothesis; -inf: dead row
        history = torch.empty(rows_now, 0, dtype=torch.long, device=device)  # (N, t) tokens so far
        steps = torch.empty(rows_now, 0, device=device)  # (N, t) their log-probabilities
        last = torch.full((rows_now,), BOS_ID, dtype=torch.long, device=device)
        finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        rank = torch.arange(k, device=device)
        dead_rows = 0  # dead rows decoded since the last re-pack

        t = 0  # tokens in every live hypothesis
        while sentences.numel():
            n, rows_now = sentences.numel(), row_sent.numel()
            log_probs = decoder.step(last, state)  # (N, V)
            log_probs = constraints.apply(log_probs, t, limits[row_sent] == t, history, row_sent)
            top, source, token, step = select.candidates(log_probs, scores, row_sent, row_pos, n)
            taken = (rank < slots.unsqueeze(1)) & (top > -math.inf)
            ends = taken & (token == EOS_ID)
            live = taken & (token != EOS_ID)

            if bool(ends.any()):
                normalized = top / length_penalty(t + 1, config.alpha, config.length_penalty)
                sent, col = ends.nonzero(as_tuple=True)
                rows = source[sent, col]
                for s, ids, per_token, last_step, score, logp in zip(
                    sentences[sent].tolist(),
                    history[rows].tolist(),
                    steps[rows].tolist(),
                    step[sent, col].tolist(),
                    normalized[sent, col].tolist(),
                    top[sent, col].tolist(),
                    strict=True,
                ):
                    finished[s].append(Hypothesis(ids, score, logp, [*per_token, last_step]))
                slots = slots - ends.sum(1)
                merged = torch.cat([best_finished, normalized.masked_fill(~ends, -math.inf)], dim=1)
                best_finished = merged.topk(nbest, dim=1).values

            # Live extensions first, in score order; the rest of the K positions are dead (-inf).
            order = (~live).to(torch.int8).argsort(dim=1, stable=True)
            live, top = live.gather(1, order), top.gather(1, order)
            source, token, step = source.gather(1, order), token.gather(1, order), step.gather(1, order)
            t += 1

            done = slots == 0
            if select.stops_early:
                lp_now = length_penalty(float(t + 1), config.alpha, config.length_penalty)
                bound = top[:, 0].masked_fill(~live[:, 0], -math.inf) / torch.clamp(lp_final, min=lp_now)
                done |= bound <= best_finished[:, -1]
            if bool(done.all()):
                break
            live &= ~done.unsqueeze(1)
            n_live = live.sum(1)  # (B',)
            have = torch.bincount(row_sent, minlength=n)
            dead_rows += rows_now - int(n_live.sum())
            if bool((n_live > have).any()) or dead_rows >= COMPACT_AFTER * int(n_live.sum()):
                # Re-pack: exactly one row per live hypothesis, sentences still searched only.
                sent, col = live.nonzero(as_tuple=True)  # grouped by sentence, positions 0, 1, ...
                rows = source[sent, col]
                decoder.reorder(state, rows)
                keep = ~done
                row_sent, row_pos = (keep.cumsum(0) - 1)[sent], col
                scores, last, last_step = top[sent, col], token[sent, col], step[sent, col]
                sentences, slots, limits = sentences[keep], slots[keep], limits[keep]
                lp_final, best_finished = lp_final[keep], best_finished[keep]
                constraints.keep(keep.nonzero().squeeze(1))
                dead_rows = 0
            else:
                # Same rows, same sentences: row (j, c) takes the c-th live hypothesis of sentence j.
                alive = live[row_sent, row_pos]
                rows = torch.where(alive, source[row_sent, row_pos], torch.arange(rows_now, device=device))
                decoder.reorder(state, rows, same_sources=True)
                scores = top[row_sent, row_pos].masked_fill(~alive, -math.inf)
                last, last_step = token[row_sent, row_pos], step[row_sent, row_pos]
                slots = slots.masked_fill(done, 0)  # a finished sentence rides along, dead, until re-packed
            history = torch.cat([history[rows], last.unsqueeze(1)], dim=1)
            steps = torch.cat([steps[rows], last_step.unsqueeze(1)], dim=1)

        return [sorted(h, key=lambda h: h.score, reverse=True)[:nbest] for h in finished]


# ------------------------------------------------------------------------------------ shorthands


def beam_search(
    model: nn.Module | Decoder,
    src: Tensor,
    src_mask: Tensor,
    config: SearchConfig,
    *,
    nbest: int | None = None,
) -> list[list[Hypothesis]]:
    """[`generate`][attnx.inference.search.generate] with beam search: per sentence, up to `nbest`
    (default: the beam) hypotheses, best first."""
    nbest = config.beam if nbest is None else min(nbest, config.beam)
    return generate(model, src, src_mask, dataclasses.replace(config, nbest=nbest))


def greedy_search(
    model: nn.Module | Decoder,
    src: Tensor,
    src_mask: Tensor,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    *,
    max_positions: int | None = None,
) -> list[list[int]]:
    """The most probable next token at every step (beam 1); each row's ids without BOS/EOS."""
    config = SearchConfig(beam=1, max_len_a=max_len_a, max_len_b=max_len_b, max_positions=max_positions)
    return [hyps[0].tokens for hyps in generate(model, src, src_mask, config)]


def translate_batch(
    model: nn.Module | Decoder, src: Tensor, src_mask: Tensor, config: SearchConfig
) -> list[list[int]]:
    """Best translation ids per row (no BOS/EOS) of [`generate`][attnx.inference.search.generate]."""
    return [hyps[0].tokens if hyps else [] for hyps in generate(model, src, src_mask, config)]
