"""A minimal decodable checkpoint (model weights and attnx's metadata, no training state), for tests and
benchmarks that need a model without training one through Lightning."""

from __future__ import annotations

from pathlib import Path

from attnx.checkpoint import STATE_PREFIX, atomic_save, make_metadata
from attnx.data.tokenizer import Tokenizer
from attnx.model import Transformer, TransformerConfig


def save_model(path: str | Path, model: Transformer, config: TransformerConfig, tokenizer: Tokenizer) -> None:
    """Write ``model`` as a checkpoint that `attnx.checkpoint.load_model` (so ``attnx translate``) reads."""
    state = {STATE_PREFIX + k: v for k, v in model.state_dict().items()}
    atomic_save({"state_dict": state, "attnx": make_metadata(config, tokenizer)}, path)
