"""A minimal decodable checkpoint (model weights and attnx's metadata, no training state), and the small
SentencePiece model it carries, for tests and benchmarks that need a model without training one through
Lightning."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnx.checkpoint import STATE_PREFIX, atomic_save, make_metadata
from attnx.data.tokenizer import Tokenizer, train_sentencepiece
from attnx.model import Transformer, TransformerConfig


def save_model(path: str | Path, model: Transformer, config: TransformerConfig, tokenizer: Tokenizer) -> None:
    """Write ``model`` as a checkpoint that `attnx.checkpoint.load_model` (so ``attnx translate``) reads."""
    state = {STATE_PREFIX + k: v for k, v in model.state_dict().items()}
    atomic_save({"state_dict": state, "attnx": make_metadata(config, tokenizer)}, path)


def train_tokenizer(lines: Iterable[str], vocab_size: int, **options: Any) -> Tokenizer:
    """A SentencePiece model trained in memory on `lines` with attnx's special ids; `options` go to the trainer."""
    return train_sentencepiece(vocab_size, sentences=lines, **options)
