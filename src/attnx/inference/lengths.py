"""§6.1's two length rules, shared by every engine and by forced scoring: the length penalty finished
hypotheses are ranked by, and the maximum output length.

The paper decodes with "length penalty α = 0.6" and a "maximum output length during inference to input
length + 50". Here:

* **Length penalty.** A finished hypothesis `Y` (its tokens and the closing `</s>`; `|Y|` counts the
  `</s>` as tensor2tensor does) scores `log P(Y) / lp(|Y|)` with the GNMT penalty
  `lp(n) = ((5 + n) / 6) ** α` (Wu et al. 2016, the paper's reference [38]), or `n ** α` with
  `length_penalty="fairseq"`.
* **Maximum length.** `input length` is the number of real source positions (`src_mask.sum(1)`, which
  includes the source `</s>`, as tensor2tensor and fairseq count it). A hypothesis holds at most
  `L = floor(max_len_a * input length + max_len_b)` tokens before `</s>`; at that point `</s>` is the only
  token allowed ([`Constraints`][attnx.inference.constraints.Constraints]). `L` is also capped so that
  `L + 1` target positions fit the model (`SearchConfig.max_positions`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnx.errors import ConfigError
from attnx.inference.config import LengthPenalty

__all__ = ["length_penalty", "max_output_length", "max_output_lengths"]


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
