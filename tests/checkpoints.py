"""A minimal decodable checkpoint (model weights and attnx's metadata, no training state), and the small
SentencePiece model it carries, for tests and benchmarks that need a model without training one through
Lightning."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnx.checkpoint import STATE_PREFIX, atomic_save, make_metadata
from attnx.data.tokenizer import Tokenizer
from attnx.model import Transformer, TransformerConfig


def save_model(path: str | Path, model: Transformer, config: TransformerConfig, tokenizer: Tokenizer) -> None:
    """Write ``model`` as a checkpoint that `attnx.checkpoint.load_model` (so ``attnx translate``) reads."""
    state = {STATE_PREFIX + k: v for k, v in model.state_dict().items()}
    atomic_save({"state_dict": state, "attnx": make_metadata(config, tokenizer)}, path)


def train_tokenizer(lines: Iterable[str], vocab_size: int, **options: Any) -> Tokenizer:
    """A SentencePiece model trained in memory on `lines`, with attnx's special ids (pad 0, unk 1, bos 2,
    eos 3); `options` go to the trainer (`model_type` defaults to `bpe`)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        **{"model_type": "bpe", **options},
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    return Tokenizer.from_bytes(model.getvalue())
