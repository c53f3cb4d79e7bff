"""The Transformer of §3, assembled from registered components."""

from attnx.model.builders import (
    TRAINING_ONLY,
    ComponentSpec,
    TransformerConfig,
    architecture,
    build_transformer,
)
from attnx.model.transformer import DecoderState, Transformer

__all__ = [
    "TRAINING_ONLY",
    "ComponentSpec",
    "DecoderState",
    "Transformer",
    "TransformerConfig",
    "architecture",
    "build_transformer",
]
