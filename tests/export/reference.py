"""attnx's own decoding and scoring, the reference every exported model is compared with."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from attnx.data.batch import BOS_ID, PAD_ID, collate
from attnx.inference.config import SearchConfig
from attnx.inference.lengths import length_penalty
from attnx.inference.search import translate_batch


def attnx_translate(
    model: nn.Module, sources: Sequence[Sequence[int]], search: SearchConfig
) -> list[list[int]]:
    """attnx's output ids for each source (batches of 50 sentences, in order)."""
    out: list[list[int]] = []
    for start in range(0, len(sources), 50):
        batch = collate([(x, []) for x in sources[start : start + 50]])
        out += translate_batch(model, batch.src, batch.src_mask, search)
    return out


@torch.inference_mode()
def attnx_log_probs(
    model: nn.Module, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Teacher-forced log-probability of every target token and of the closing ``</s>``, per pair."""
    model.eval()
    out: list[torch.Tensor] = []
    for start in range(0, len(sources), 50):
        batch = collate(list(zip(sources[start : start + 50], targets[start : start + 50], strict=True)))
        logits = model(batch.src, batch.tgt_in, batch.src_mask)  # (B, T, V)
        lprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)
        out += [row[: len(y) + 1] for row, y in zip(lprobs, targets[start : start + 50], strict=True)]
    return out


def attnx_score(
    model: nn.Module, source: Sequence[int], hypothesis: Sequence[int], search: SearchConfig
) -> float:
    """The score attnx's beam search gives a finished hypothesis: ``log P(Y) / lp(|Y|)``, ``|Y|`` with ``</s>``."""
    log_prob = float(attnx_log_probs(model, [source], [hypothesis])[0].sum())
    return log_prob / length_penalty(len(hypothesis) + 1, search.alpha, search.length_penalty)


@torch.inference_mode()
def top2_gap(model: nn.Module, source: Sequence[int], prefix: Sequence[int]) -> float:
    """Difference between the two largest next-token logits after ``prefix`` (how close a tie it is)."""
    batch = collate([(source, list(prefix))])
    logits = model(batch.src, batch.tgt_in, batch.src_mask)[0, len(prefix)].float()
    logits[[PAD_ID, BOS_ID]] = -math.inf  # never generated
    top = logits.topk(2).values
    return float(top[0] - top[1])
