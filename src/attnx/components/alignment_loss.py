"""Guided alignment: the §5.4 loss plus a term that pulls one encoder-decoder attention toward an aligner's links.

The loss component `guided_alignment` ([`GuidedAlignmentLoss`][attnx.components.alignment_loss.GuidedAlignmentLoss])
is fairseq's `label_smoothed_cross_entropy_with_alignment` (`--alignment-lambda`), Eole's `lambda_align` and
Marian's `--guided-alignment`: for each target position `t` that has links to source positions `A(t)` (from an
external aligner, prepared with `attnx prepare --train_align`), the target distribution puts `1 / |A(t)|` on each
linked source piece, and the term is the cross-entropy of the chosen attention row against it:

```text
alignment = Σ_t Σ_{s ∈ A(t)} -(1 / |A(t)|) · log attn[t, s]
objective = label-smoothed loss + alignment_lambda · alignment      (both summed, divided by target tokens)
```

The attention is one decoder layer's encoder-decoder attention, one head or the mean of its heads, computed in
the same forward pass as the loss (the model computes explicit weights for that layer only). Positions without
links (and batches of a split prepared without alignments) add nothing.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from attnx.components.loss import LabelSmoothedLoss, LossSums, TranslationModel
from attnx.data.batch import Batch
from attnx.errors import ConfigError
from attnx.hookspecs import hookimpl

SMALLEST_PROBABILITY = 1e-9
"""Attention weights are clamped to this before the log: a weight that underflows to 0 (bf16) gives a large,
finite term rather than an infinite loss."""

KEY = "model.loss.args"


def alignment_cross_entropy(attention: Tensor, links: Tensor) -> tuple[Tensor, Tensor]:
    """(cross-entropy sum, aligned target positions) of `attention` `(B, T, S)` against `links` `(N, 3)` long
    (batch row, target position, source position): each target position's links share its probability mass
    equally. Computed in float32 at least, without a read-back to the host (the counts stay on the device)."""
    rows, width = attention.shape[0] * attention.shape[1], attention.shape[1]
    key = links[:, 0] * width + links[:, 1]  # (N,) target position in (B*T) order
    dtype = torch.promote_types(attention.dtype, torch.float32)
    counts = torch.zeros(rows, dtype=dtype, device=attention.device)
    counts.index_add_(0, key, torch.ones(len(key), dtype=dtype, device=attention.device))
    linked = attention[links[:, 0], links[:, 1], links[:, 2]].to(dtype)  # (N,)
    cross_entropy = -(linked.clamp_min(SMALLEST_PROBABILITY).log() / counts[key]).sum()
    return cross_entropy, (counts > 0).sum()


class GuidedAlignmentLoss:
    """`guided_alignment`: §5.4 label-smoothed cross-entropy (fused, as `label_smoothed`) plus
    `alignment_lambda` × the cross-entropy of one encoder-decoder attention against the training pairs' alignments.

    The corpus must be prepared with alignments (`attnx prepare --train_align`, docs/training.md); a training
    batch without them is refused. `attnx translate --search.alignment` prints the last layer's mean over heads:
    the defaults train exactly that attention.

    Args:
        epsilon: ε_ls (the paper: 0.1).
        alignment_lambda: Weight of the alignment term (fairseq's `--alignment-lambda`; Garg et al. 2019 use
            0.05). 0 computes and logs it (`train/alignment_loss`, `val/alignment_loss`) without training on it.
        layer: Decoder layer whose encoder-decoder attention is guided, 0-based, negative from the last.
        head: One head's index, or `mean` for the mean of the layer's heads.
        chunk_rows: As `label_smoothed`'s.
    """

    capturable = False
    """Steps with this loss are never captured as CUDA graphs: the number of links is a shape that depends on
    the data."""

    def __init__(
        self,
        epsilon: float = 0.1,
        alignment_lambda: float = 0.05,
        layer: int = -1,
        head: int | Literal["mean"] = "mean",
        chunk_rows: int | None = None,
    ) -> None:
        if isinstance(alignment_lambda, bool) or not isinstance(alignment_lambda, (int, float)):
            raise ConfigError(f"{KEY}.alignment_lambda must be a number ≥ 0, got {alignment_lambda!r}")
        if not (math.isfinite(alignment_lambda) and alignment_lambda >= 0):
            raise ConfigError(
                f"{KEY}.alignment_lambda must be a finite number ≥ 0 (e.g. 0.05), got {alignment_lambda}"
            )
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ConfigError(f"{KEY}.layer must be a decoder layer index (e.g. -1: the last), got {layer!r}")
        if head != "mean" and (isinstance(head, bool) or not isinstance(head, int) or head < 0):
            raise ConfigError(f"{KEY}.head must be a head index ≥ 0 or 'mean', got {head!r}")
        self.main = LabelSmoothedLoss(epsilon, chunk_rows)
        self.epsilon = epsilon
        self.alignment_lambda = float(alignment_lambda)
        self.layer = layer
        self.head = head

    def __call__(self, model: TranslationModel, batch: Batch) -> LossSums:
        links = batch.alignment
        if links is None and torch.is_grad_enabled() and model.training:  # type: ignore[attr-defined]
            raise ConfigError(
                "loss guided_alignment: the training batches carry no alignments; prepare the corpus with "
                "`attnx prepare --train_align FILE` (and train without data.subword_sampling, whose new "
                "segmentation the alignments would not match), or use loss label_smoothed"
            )
        memory = model.encode(batch.src, batch.src_mask)  # (B, S, D)
        weights: list[Tensor] | None = None if links is None else []
        try:
            features = model.decode_features(
                batch.tgt_in, memory, batch.src_mask, weights=weights, weights_layer=self.layer
            )  # (B, T, D)
        except IndexError as err:
            raise ConfigError(f"{KEY}.layer: {err}") from None
        sums = self.main.score(model, batch, features)
        if weights is None or links is None:
            return sums
        attention = weights[0]  # (B, H, T, S)
        heads = attention.shape[1]
        if self.head == "mean":
            attention = attention.mean(dim=1)  # (B, T, S)
        elif self.head < heads:
            attention = attention[:, self.head]  # (B, T, S)
        else:
            raise ConfigError(f"{KEY}.head is {self.head}, the model's layers have {heads} heads (0-based)")
        cross_entropy, aligned = alignment_cross_entropy(attention, links)
        return sums._replace(alignment=cross_entropy, aligned=aligned, alignment_lambda=self.alignment_lambda)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_loss("guided_alignment", GuidedAlignmentLoss)
