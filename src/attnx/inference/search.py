"""§6.1 Decoding: one generation loop over a [`Decoder`][attnx.inference.decoder.Decoder] (cached keys/values),
given its token selection (beam search or sampling, [`selection`][attnx.inference.selection]) and its
constraints ([`constraints`][attnx.inference.constraints]).

The paper decodes with "beam search with a beam size of 4 and length penalty α = 0.6", a "maximum output
length during inference to input length + 50, but terminate early when possible". The length penalty and
the maximum length `L` are [`lengths`][attnx.inference.lengths]'s; the loop adds:

* **Ranking.** Finished hypotheses are ranked by `log P(Y) / lp(|Y|)`, live hypotheses by `log P` alone.
* **Early termination.** A live hypothesis with `t` tokens and log-probability `s <= 0` can only end as
  a hypothesis of total length `m` in `[t + 1, L + 1]` with log-probability `s' <= s` (log-probs of
  further tokens are `<= 0`). Its final score `s' / lp(m)` is therefore at most
  `s / max(lp(t + 1), lp(L + 1))`: `s` is negative, so dividing it by the *largest* reachable penalty
  gives the largest value (for α >= 0 that is `lp(L + 1)`, the GNMT form grows with length). A sentence
  stops once the best live hypothesis's bound cannot beat the `nbest`-th best finished score, so the
  `nbest` best hypotheses returned are exactly those the full search would return. Sampling stops a
  sentence when all its samples have ended.
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

from attnx.data.batch import BOS_ID, EOS_ID
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.constraints import Constraints, prefix_table
from attnx.inference.decoder import Decoder, as_decoder, decoding
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lengths import length_penalty, max_output_lengths
from attnx.inference.lexical import LexicalBeam, PhraseIds, compile_phrases
from attnx.inference.selection import token_selection
from attnx.inference.term_tables import TermTables
from attnx.inference.terms import Vocabulary

__all__ = ["beam_search", "generate", "greedy_search", "translate_batch"]


COMPACT_AFTER = 0.2
"""Re-pack the decoder rows once the dead rows decoded since the last re-pack reach this fraction of the
live ones. Re-packing copies each kept row's source side (memory and encoder-decoder keys/values), which
costs about a tenth of one decoding step of that row; decoding a dead row costs a whole step."""


def generate(
    model: nn.Module | Decoder,
    src: Tensor,
    src_mask: Tensor,
    config: SearchConfig,
    *,
    prefixes: Sequence[Sequence[int]] | None = None,
    generator: torch.Generator | None = None,
    constraints: Sequence[PhraseIds | None] | None = None,
    vocabulary: Vocabulary | None = None,
) -> list[list[Hypothesis]]:
    """Per sentence of the padded batch `src` `(B, S)`, up to `config.nbest` hypotheses, best first.

    `prefixes`: per sentence, target ids every hypothesis must start with (empty: none). `generator`:
    the random numbers of sampling (default: torch's global generator, seeded by `config.seed` when set).
    `constraints`: per sentence, phrases its hypotheses must contain ([`lexical`][attnx.inference.lexical],
    beam search only) and phrases they must not (None: none), matched on the text the pieces of `vocabulary`
    spell ([`terms`][attnx.inference.terms]; None: on the ids themselves).

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
        select = token_selection(config, decoder.vocab_size, generator)
        prefix_ids, prefix_lengths = prefix_table(prefixes, b, device)
        phrases = [c or PhraseIds() for c in constraints] if constraints is not None else [PhraseIds()] * b
        if len(phrases) != b:
            raise ConfigError(
                f"{len(phrases)} constraints for {b} sources: give one (possibly None) per source"
            )
        lexical, bans = None, None
        if any(c.include or c.exclude for c in phrases):  # the pieces' spelling, built only for phrases
            words = vocabulary or Vocabulary.of_ids(decoder.vocab_size)
        if any(c.include for c in phrases):
            if config.sampling:
                raise ConfigError(
                    "phrases an output must contain need beam search: leave out search.sampling"
                )
            terms, needs, origin = compile_phrases(words, phrases, include=True)
            tables = TermTables(words, terms, device, needs)
            lexical = LexicalBeam(k, decoder.vocab_size, tables, [c.ordered for c in phrases], device, origin)
        if any(c.exclude for c in phrases):
            terms, _, _ = compile_phrases(words, phrases, include=False)
            bans = TermTables(words, terms, device)
        rules = Constraints(config, prefix_ids, prefix_lengths, bans)
        limits = max_output_lengths(src_mask, config.max_len_a, config.max_len_b, config.max_positions)
        limits = limits.to(device)  # (B',) per sentence still searched
        if prefix_lengths is not None:
            limits = torch.maximum(limits, prefix_lengths)
        if lexical is not None:  # room for the prefix and every phrase after it
            limits = torch.maximum(
                limits, lexical.tables.pieces + (0 if prefix_lengths is None else prefix_lengths)
            )
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
            no_eos = None if lexical is None else lexical.unfinished(row_sent)
            log_probs = rules.apply(log_probs, t, limits[row_sent] == t, history, row_sent, no_eos)
            if lexical is None:
                top, source, token, step = select.candidates(log_probs, scores, row_sent, row_pos, n)
            else:
                top, source, token, step = lexical.candidates(
                    log_probs, scores, row_sent, row_pos, n, history
                )
            taken = (rank < slots.unsqueeze(1)) & (top > -math.inf)
            ends = taken & (token == EOS_ID)
            live = taken & (token != EOS_ID)

            if bool(ends.any()):
                normalized = top / length_penalty(t + 1, config.alpha, config.length_penalty)
                sent, col = ends.nonzero(as_tuple=True)
                rows = source[sent, col]
                unmet = [None] * rows.numel() if lexical is None else lexical.unmet(rows, row_sent)
                for s, ids, per_token, last_step, score, logp, missed in zip(
                    sentences[sent].tolist(),
                    history[rows].tolist(),
                    steps[rows].tolist(),
                    step[sent, col].tolist(),
                    normalized[sent, col].tolist(),
                    top[sent, col].tolist(),
                    unmet,
                    strict=True,
                ):
                    finished[s].append(Hypothesis(ids, score, logp, [*per_token, last_step], unmet=missed))
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
                best = top.masked_fill(~live, -math.inf).amax(dim=1)  # (B',) the best live hypothesis
                bound = best / torch.clamp(lp_final, min=lp_now)
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
                rules.keep(keep.nonzero().squeeze(1))
                if lexical is not None:
                    lexical.keep(keep.nonzero().squeeze(1))
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
            if lexical is not None:
                lexical.follow(rows, history, row_sent)
            rules.follow(rows, history, row_sent)

        # A hypothesis with every phrase it must contain ranks before one the maximum length ended first.
        return [
            sorted(h, key=lambda h: (-len(h.unmet or ()), h.score), reverse=True)[:nbest] for h in finished
        ]


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
