"""§5.4 Label smoothing: cross-entropy against a smoothed target distribution, padding ignored."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class LossSums(NamedTuple):
    """Sums over the counted (non-padding) target positions of one batch."""

    loss: Tensor  # label-smoothed cross-entropy, summed; what is optimized (after dividing by ``tokens``)
    nll: Tensor  # plain negative log-likelihood of the reference tokens, summed; perplexity = exp(nll / tokens)
    tokens: Tensor  # number of counted positions


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> LossSums:
    """Label-smoothed cross-entropy (§5.4, ε_ls), summed over the positions where ``target != ignore_index``.

    The target distribution puts ``1 - ε`` on the reference token and spreads ``ε`` uniformly over all
    ``V`` vocabulary entries (the reference and padding included), so per position::

        loss = (1 - ε) · (-log p_y) + ε · mean_v (-log p_v)

    This is the cross-entropy form: it equals ``torch.nn.functional.cross_entropy(..., label_smoothing=ε)``
    and differs from the KL-divergence form ``KL(q ‖ p)`` only by the constant entropy of ``q``, so both have
    the same gradients. ``logits`` ``(..., V)`` (any float dtype; computed in float32), ``target`` ``(...)``.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing ε must be in [0, 1), got {epsilon}")
    keep = target != ignore_index  # (N,) after flattening
    logits = logits.reshape(-1, logits.shape[-1])[
        keep.reshape(-1)
    ]  # (N, V): padded positions never reach softmax
    target = target.reshape(-1)[keep.reshape(-1)]
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -lprobs.gather(1, target.unsqueeze(1)).sum()
    if epsilon == 0.0:
        loss = nll
    else:
        smooth = -lprobs.mean(dim=-1).sum()
        loss = (1.0 - epsilon) * nll + epsilon * smooth
    return LossSums(loss=loss, nll=nll.detach(), tokens=keep.sum())
