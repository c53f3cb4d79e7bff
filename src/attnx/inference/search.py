"""§6.1 Decoding: greedy and beam search over [`Transformer.decode_step`][attnx.model.transformer.Transformer.decode_step] (cached keys/values).

The paper decodes with "beam search with a beam size of 4 and length penalty α = 0.6", a "maximum output
length during inference to input length + 50, but terminate early when possible". Here:

* **Length penalty.** A finished hypothesis `Y` (its tokens and the closing `</s>`; `|Y|` counts the
  `</s>` as tensor2tensor does) scores `log P(Y) / lp(|Y|)` with the GNMT penalty
  `lp(n) = ((5 + n) / 6) ** α` (Wu et al. 2016, the paper's reference [38]), or `n ** α` with
  `length_penalty="fairseq"`. Live hypotheses are ranked by `log P` alone.
* **Maximum length.** `input length` is the number of real source positions (`src_mask.sum(1)`, which
  includes the source `</s>`, as tensor2tensor and fairseq count it). A hypothesis holds at most
  `L = floor(max_len_a * input length + max_len_b)` tokens before `</s>`; at that point `</s>` is the
  only token allowed (with its real log-probability), so a model that never ends a sentence stops at
  exactly `L` tokens. `L` is also capped so that `L + 1` target positions fit the model
  (`SearchConfig.max_positions`).
* **The beam.** Each sentence owns `beam` slots. Each step, the live hypotheses' extensions are ranked by
  `log P` and the best `k` are kept, where `k` is the number of slots not yet taken by finished
  hypotheses; an extension ending in `</s>` takes its slot for good (the beam shrinks). So beam 1 is
  exactly greedy search, and a beam wider than the number of possible prefixes is exhaustive search.
* **Early termination.** A live hypothesis with `t` tokens and log-probability `s <= 0` can only end as
  a hypothesis of total length `m` in `[t + 1, L + 1]` with log-probability `s' <= s` (log-probs of
  further tokens are `<= 0`). Its final score `s' / lp(m)` is therefore at most
  `s / max(lp(t + 1), lp(L + 1))`: `s` is negative, so dividing it by the *largest* reachable penalty
  gives the largest value (for α >= 0 that is `lp(L + 1)`, the GNMT form grows with length). A sentence
  stops once the best live hypothesis's bound cannot beat the `nbest`-th best finished score, so the
  `nbest` best hypotheses returned are exactly those the full search would return.
* **Vectorized, and shrinking.** A step is a few tensor operations over the decoder rows of all sentences at
  once: the `beam` best tokens of each row, then the `beam` best of each sentence's candidates. Python
  only files away finished hypotheses. Rows of finished hypotheses and stopped sentences go dead; following
  back-pointers within a sentence moves only the self-attention caches (`same_sources=True`), and once
  the dead rows decoded reach [`COMPACT_AFTER`][attnx.inference.search.COMPACT_AFTER] of the live ones, the rows are re-packed to the live
  hypotheses of the sentences still searched ([`DecoderState.reorder`][attnx.model.transformer.DecoderState.reorder]), so work shrinks as
  hypotheses and sentences finish.

`PAD` and `BOS` are never generated; `UNK` is allowed. Encoder keys/values for the encoder-decoder
attention are computed once per sentence ([`Transformer.start_decoding`][attnx.model.transformer.Transformer.start_decoding], one row per sentence for the
first step) and then copied to the rows of that sentence's hypotheses. Nothing here needs Lightning.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID
from attnx.inference.config import LengthPenalty, SearchConfig

__all__ = [
    "Hypothesis",
    "beam_search",
    "greedy_search",
    "length_penalty",
    "max_output_length",
    "max_output_lengths",
    "translate_batch",
]


@dataclass
class Hypothesis:
    """A finished translation: `tokens` without BOS/EOS, `score = log_prob / lp(len(tokens) + 1)`."""

    tokens: list[int]
    score: float
    log_prob: float


def length_penalty(length: int | float | Tensor, alpha: float, kind: LengthPenalty = "gnmt"):
    """`lp(|Y|)`: GNMT `((5 + |Y|) / 6) ** α` or fairseq `|Y| ** α`; `|Y|` counts the `</s>`."""
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "fairseq":
        return length**alpha
    raise ValueError(f"length_penalty must be 'gnmt' or 'fairseq', got {kind!r}")


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


@contextlib.contextmanager
def _decoding(model: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd for the duration, restoring the model's mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def _next_scores(model: nn.Module, tokens: Tensor, state, at_max: Tensor) -> tuple[Tensor, Tensor]:
    """Logits `(N, V)` of the next token with PAD/BOS banned and `</s>` forced at `at_max`, and the
    `(N, 1)` log-normalizer of the *unrestricted* distribution: `log p = logit - normalizer`.

    Log-probabilities stay the model's own (banned tokens are not renormalized away); only the few
    candidates kept are ever turned into log-probabilities, never the whole `(N, V)` table.
    """
    logits = model.decode_step(tokens, state).float()  # (N, V)
    normalizer = logits.logsumexp(dim=-1, keepdim=True)
    logits[:, PAD_ID] = -math.inf
    logits[:, BOS_ID] = -math.inf
    if bool(at_max.any()):
        eos = logits[:, EOS_ID].clone()
        logits[at_max] = -math.inf
        logits[:, EOS_ID] = eos
    return logits, normalizer


def greedy_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    *,
    max_positions: int | None = None,
) -> list[list[int]]:
    """The most probable next token at every step; returns each row's ids without BOS/EOS."""
    with _decoding(model):
        b = src.shape[0]
        limits = max_output_lengths(src_mask, max_len_a, max_len_b, max_positions).to(src.device)
        state = model.start_decoding(model.encode(src, src_mask), src_mask)
        rows = torch.arange(b, device=src.device)  # sentence of each live row
        history = torch.empty(b, 0, dtype=torch.long, device=src.device)
        last = torch.full((b,), BOS_ID, dtype=torch.long, device=src.device)
        results: list[list[int]] = [[] for _ in range(b)]
        step = 0
        while rows.numel():
            logits, _ = _next_scores(model, last, state, limits == step)
            last = logits.argmax(dim=-1)  # (N,)
            history = torch.cat([history, last.unsqueeze(1)], dim=1)
            ended = last == EOS_ID
            if bool(ended.any()):
                for row, ids in zip(rows[ended].tolist(), history[ended, :-1].tolist(), strict=True):
                    results[row] = ids
                keep = (~ended).nonzero().squeeze(1)
                state.reorder(keep)
                rows, history, last, limits = rows[keep], history[keep], last[keep], limits[keep]
            step += 1
        return results


COMPACT_AFTER = 0.2
"""Re-pack the decoder rows once the dead rows decoded since the last re-pack reach this fraction of the
live ones. Re-packing copies each kept row's source side (memory and encoder-decoder keys/values), which
costs about a tenth of one decoding step of that row; decoding a dead row costs a whole step."""


def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    config: SearchConfig,
    *,
    nbest: int | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search (module docstring); per sentence, up to `nbest` (default: beam) hypotheses, best first.

    Decoder rows are grouped by sentence, at most `beam` each: `row_sent`/`row_pos` say which sentence
    and which of its positions a row holds. Each step ranks every sentence's candidates in a dense
    `(sentences, beam)` table; the next hypotheses then either reuse the current rows (a row stays with its
    sentence: only self-attention caches move) or, when a sentence needs more rows or enough rows have gone
    dead (finished hypotheses, finished sentences), the rows are re-packed to exactly the live hypotheses.
    """
    k = config.beam
    if k < 1:
        raise ValueError(f"beam must be >= 1, got {k}")
    nbest = k if nbest is None else min(nbest, k)
    device = src.device
    with _decoding(model):
        b = src.shape[0]
        v = model.vocab_size
        kk = min(k, v)  # tokens kept per row
        limits = max_output_lengths(src_mask, config.max_len_a, config.max_len_b, config.max_positions)
        limits = limits.to(device)  # (B',) per sentence still searched
        # Largest penalty a live hypothesis can still reach (see the module docstring); lp is monotone.
        lp_final = length_penalty(limits.float() + 1, config.alpha, config.length_penalty)
        state = model.start_decoding(model.encode(src, src_mask), src_mask)  # one row per sentence

        sentences = torch.arange(b, device=device)  # (B',) original index of each sentence still searched
        slots = torch.full((b,), k, dtype=torch.long, device=device)  # beam slots not taken by finished
        best_finished = torch.full((b, nbest), -math.inf, device=device)  # (B', nbest) sorted scores
        row_sent = torch.arange(b, device=device)  # (N,) sentence of each decoder row
        row_pos = torch.zeros(b, dtype=torch.long, device=device)  # (N,) its position within the sentence
        scores = torch.zeros(b, device=device)  # (N,) log P of each row's hypothesis; -inf: dead row
        history = torch.empty(b, 0, dtype=torch.long, device=device)  # (N, t) tokens so far
        last = torch.full((b,), BOS_ID, dtype=torch.long, device=device)
        finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        rank = torch.arange(k, device=device)
        dead_rows = 0  # dead rows decoded since the last re-pack

        t = 0  # tokens in every live hypothesis
        while sentences.numel():
            n, rows_now = sentences.numel(), row_sent.numel()
            logits, normalizer = _next_scores(model, last, state, limits[row_sent] == t)  # (N, V), (N, 1)
            # A sentence's K best extensions are among the K best tokens of each of its rows.
            row_top, row_token = logits.topk(kk, dim=1)  # (N, K')
            cand = torch.full((n, k, kk), -math.inf, device=device)
            cand[row_sent, row_pos] = scores.unsqueeze(1) + (row_top - normalizer)  # log P
            cand_token = torch.zeros((n, k, kk), dtype=torch.long, device=device)
            cand_token[row_sent, row_pos] = row_token
            slot_row = torch.zeros((n, k), dtype=torch.long, device=device)  # (B', K) row at each position
            slot_row[row_sent, row_pos] = torch.arange(rows_now, device=device)

            top, index = cand.view(n, -1).topk(k, dim=1)  # (B', K) best extensions, sorted
            source = slot_row.gather(1, index // kk)  # row each extension continues
            token = cand_token.view(n, -1).gather(1, index)  # token appended
            taken = (rank < slots.unsqueeze(1)) & (top > -math.inf)
            ends = taken & (token == EOS_ID)
            live = taken & (token != EOS_ID)

            if bool(ends.any()):
                normalized = top / length_penalty(t + 1, config.alpha, config.length_penalty)
                sent, col = ends.nonzero(as_tuple=True)
                for s, ids, score, logp in zip(
                    sentences[sent].tolist(),
                    history[source[sent, col]].tolist(),
                    normalized[sent, col].tolist(),
                    top[sent, col].tolist(),
                    strict=True,
                ):
                    finished[s].append(Hypothesis(ids, score, logp))
                slots = slots - ends.sum(1)
                merged = torch.cat([best_finished, normalized.masked_fill(~ends, -math.inf)], dim=1)
                best_finished = merged.topk(nbest, dim=1).values

            # Live extensions first, in score order; the rest of the K positions are dead (-inf).
            order = (~live).to(torch.int8).argsort(dim=1, stable=True)
            live, top = live.gather(1, order), top.gather(1, order)
            source, token = source.gather(1, order), token.gather(1, order)
            t += 1

            lp_now = length_penalty(float(t + 1), config.alpha, config.length_penalty)
            bound = top[:, 0].masked_fill(~live[:, 0], -math.inf) / torch.clamp(lp_final, min=lp_now)
            done = (slots == 0) | (bound <= best_finished[:, -1])
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
                state.reorder(rows)
                keep = ~done
                row_sent, row_pos = (keep.cumsum(0) - 1)[sent], col
                scores, last = top[sent, col], token[sent, col]
                sentences, slots, limits = sentences[keep], slots[keep], limits[keep]
                lp_final, best_finished = lp_final[keep], best_finished[keep]
                dead_rows = 0
            else:
                # Same rows, same sentences: row (j, c) takes the c-th live hypothesis of sentence j.
                alive = live[row_sent, row_pos]
                rows = torch.where(alive, source[row_sent, row_pos], torch.arange(rows_now, device=device))
                state.reorder(rows, same_sources=True)
                scores = top[row_sent, row_pos].masked_fill(~alive, -math.inf)
                last = token[row_sent, row_pos]
                slots = slots.masked_fill(done, 0)  # a finished sentence rides along, dead, until re-packed
            history = torch.cat([history[rows], last.unsqueeze(1)], dim=1)

        return [sorted(h, key=lambda h: h.score, reverse=True)[:nbest] for h in finished]


def translate_batch(model: nn.Module, src: Tensor, src_mask: Tensor, config: SearchConfig) -> list[list[int]]:
    """Best translation ids per row (no BOS/EOS): greedy when `config.beam == 1`, else beam search."""
    if config.beam == 1:
        return greedy_search(
            model, src, src_mask, config.max_len_a, config.max_len_b, max_positions=config.max_positions
        )
    nbest = beam_search(model, src, src_mask, config, nbest=1)
    return [hyps[0].tokens if hyps else [] for hyps in nbest]
