"""How to decode, as plain settings (no torch): the schema of `search` in commands and configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LengthPenalty = Literal["gnmt", "fairseq"]

DEFAULT_MAX_TOKENS = 4096
"""Source tokens per decoding batch, padding included: every engine's, `attnx translate`'s and `attnx serve`'s default."""


@dataclass
class SearchConfig:
    """How to decode (§6.1 defaults: beam 4, α = 0.6, maximum length input + 50)."""

    beam: int = 4
    """Beam size; 1 = greedy search."""
    alpha: float = 0.6
    """Length penalty exponent α."""
    length_penalty: LengthPenalty = "gnmt"
    """`gnmt`: `((5 + |Y|) / 6) ** α` (the paper's, §6.1); `fairseq`: `|Y| ** α`."""
    max_len_a: float = 1.0
    """Maximum output length = `max_len_a * input length + max_len_b` (paper: input length + 50)."""
    max_len_b: int = 50
    """See `max_len_a`."""
    max_positions: int | None = None
    """Target positions the model accepts (its `max_len`); caps the maximum output length. None: no cap."""


PAPER_SEARCH = SearchConfig()
"""§6.1's search: beam 4, α 0.6 with the GNMT length penalty, maximum output length input + 50."""
