"""§5.4 Label smoothing: cross-entropy against a smoothed target distribution, padding ignored."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnx.data.batch import Batch
from attnx.model import Transformer


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
    keep = target != ignore_index  # (...)
    vocab = logits.shape[-1]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # bf16/fp16 logits from autocast: softmax sums in float32
    nll, uniform = _NllAndUniform.apply(logits.reshape(-1, vocab), target.reshape(-1))  # (N,), (N,)
    nll = torch.where(keep.reshape(-1), nll, 0.0).sum()
    if epsilon == 0.0:
        loss = nll
    else:
        uniform = torch.where(keep.reshape(-1), uniform, 0.0).sum()
        loss = (1.0 - epsilon) * nll + epsilon * uniform
    return LossSums(loss=loss, nll=nll.detach(), tokens=keep.sum())


class _NllAndUniform(torch.autograd.Function):
    """Per row of ``(N, V)`` logits: ``-log p_y`` and ``mean_v(-log p_v)``, with a one-pass backward.

    Equal to ``log_softmax`` followed by ``gather`` and ``mean``, but never materializes the log-probabilities
    or the separate ``(N, V)`` gradients of the two terms: with ``lse = logsumexp(z)``,
    ``-log p_y = lse - z_y``, ``mean_v(-log p_v) = lse - mean(z)``, and the gradient with respect to ``z`` is
    ``(g_nll + g_uniform)·softmax(z) - g_nll·onehot(y) - g_uniform / V``. On the 8k-vocabulary model this
    halves the time of the loss (memory passes over the ``(N, V)`` array).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        lse = torch.logsumexp(logits, dim=-1)  # (N,)
        nll = lse - logits.gather(1, target.unsqueeze(1)).squeeze(1)
        uniform = lse - logits.mean(dim=-1)
        ctx.save_for_backward(logits, target, lse)
        return nll, uniform

    @staticmethod
    def backward(ctx, g_nll: Tensor, g_uniform: Tensor) -> tuple[Tensor, None]:
        logits, target, lse = ctx.saved_tensors
        grad = torch.exp(logits - lse.unsqueeze(1))  # softmax, (N, V)
        grad.mul_((g_nll + g_uniform).unsqueeze(1)).sub_((g_uniform / logits.shape[1]).unsqueeze(1))
        grad.scatter_add_(1, target.unsqueeze(1), -g_nll.unsqueeze(1))
        return grad, None


def translation_loss(model: Transformer, batch: Batch, epsilon: float) -> LossSums:
    """:func:`label_smoothed_nll` of ``model`` on ``batch`` (teacher forcing).

    Only the target positions that count are projected onto the vocabulary: padding is dropped from the
    ``(B, T, D)`` decoder output before the ``V``-wide projection and softmax, the costliest part of a small
    model's step.
    """
    memory = model.encode(batch.src, batch.src_mask)  # (B, S, D)
    features = model.decode_features(batch.tgt_in, memory, batch.src_mask)  # (B, T, D)
    logits = F.linear(features[batch.tgt_mask], model.output_weight)  # (N, V), N = real target tokens
    return label_smoothed_nll(logits, batch.tgt_out[batch.tgt_mask], epsilon, model.pad_id)
