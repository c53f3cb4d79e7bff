"""What tests use to make a decodable model without Lightning: the small SentencePiece model it carries and
[`attnx.checkpoint.save_model`][attnx.checkpoint.format.save_model] to write it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnx.checkpoint import save_model
from attnx.data.tokenizer import Tokenizer, train_sentencepiece

__all__ = ["save_model", "train_tokenizer"]


def train_tokenizer(lines: Iterable[str], vocab_size: int, **options: Any) -> Tokenizer:
    """A SentencePiece model trained in memory on `lines` with attnx's special ids; `options` go to the trainer."""
    return train_sentencepiece(vocab_size, sentences=lines, **options)
