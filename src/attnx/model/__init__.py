"""The Transformer of §3, assembled from registered components."""

from attnx.model.builders import ComponentSpec, TransformerConfig, build_transformer
from attnx.model.transformer import DecoderState, Transformer

__all__ = ["ComponentSpec", "DecoderState", "Transformer", "TransformerConfig", "build_transformer"]
