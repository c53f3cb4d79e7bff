"""Forced scoring: the log-probability of given targets for given sources, in one teacher-forced pass
through a [`Decoder`][attnx.inference.decoder.Decoder] (the same seam the search decodes through), and hard
alignments from the encoder-decoder attention of that pass.

A beam output scored here gets back the `score` and `log_prob` the search reported for it (the search sums
the same per-token log-probabilities, one cached step at a time), so search outputs, n-best entries and
given targets are scored and aligned alike. Nothing here needs Lightning.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.decoder import Decoder, as_decoder, decoding
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lengths import length_penalty

__all__ = ["force_decode", "hard_alignments"]


def force_decode(
    model: nn.Module | Decoder,
    src: Tensor,
    src_mask: Tensor,
    targets: Sequence[Sequence[int]],
    config: SearchConfig,
    alignment: bool | None = None,
) -> list[Hypothesis]:
    """Score `targets[i]` (ids without `<s>`/`</s>`) as the translation of row `i` of `src` `(B, S)`.

    Each [`Hypothesis`][attnx.inference.hypothesis.Hypothesis] has `log_prob` (`</s>` included),
    `token_log_probs`, the `score` the search would rank it by (`config`'s length penalty) and, when
    `alignment` (default `config.alignment`), its hard alignment.
    """
    decoder = as_decoder(model)
    alignment = config.alignment if alignment is None else alignment
    if len(targets) != src.shape[0]:
        raise ConfigError(f"{len(targets)} targets for {src.shape[0]} sources")
    device = src.device
    # one tensor of every row at once: copying row by row cost 6% of the whole pass at 1,000 pairs
    tgt_out = pad_sequence(
        [torch.tensor([*y, EOS_ID], dtype=torch.long) for y in targets],
        batch_first=True,
        padding_value=PAD_ID,
    )  # (B, T): y </s>, padded
    tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], BOS_ID), tgt_out[:, :-1]], dim=1)
    tgt_in = tgt_in.masked_fill(tgt_in == EOS_ID, PAD_ID)  # <s> y, padded
    with decoding(decoder):
        log_probs, attention = decoder.forced(src, src_mask, tgt_in.to(device), tgt_out.to(device), alignment)
    aligned = hard_alignments(attention, src_mask) if attention is not None else None
    source_pieces = (src_mask.sum(1) - 1).tolist()  # without the source </s>
    out = []
    for i, (y, row) in enumerate(zip(targets, log_probs.tolist(), strict=True)):
        steps = row[: len(y) + 1]
        log_prob = sum(steps)
        score = log_prob / length_penalty(len(y) + 1, config.alpha, config.length_penalty)
        pairs = None
        if aligned is not None:
            pairs = [(a, j) for j, a in enumerate(aligned[i][: len(y)])] if source_pieces[i] else []
        out.append(Hypothesis(list(y), score, log_prob, steps, pairs))
    return out


def hard_alignments(attention: Tensor, src_mask: Tensor) -> list[list[int]]:
    """For each target position of `attention` `(B, T, S)`, the source piece it attends to most: argmax over
    the real source positions without the source `</s>` (meaningless where a source has no pieces)."""
    real = src_mask.clone()
    real[torch.arange(real.shape[0], device=real.device), src_mask.sum(1) - 1] = False  # the source </s>
    masked = attention.masked_fill(~real.unsqueeze(1), -1.0)
    return masked.argmax(dim=2).tolist()
