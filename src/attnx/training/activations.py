"""The activations a training batch keeps for its backward pass: bytes per token of each layer, from the
config's components (the memory part of [the estimate][attnx.training.estimate]).

The coefficients are counted from the tensors attnx's own layers save for the backward pass
(`torch.autograd.graph.saved_tensors_hooks` over an encoder and a decoder layer, torch 2.13, dropout on) in
fp32; under bf16/fp16 autocast about 0.7 of it (matrix products save 2-byte copies; norms, softmax statistics
and residuals stay fp32). `tests/training/test_activations.py` counts them again for every built-in component.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnx.model import TransformerConfig
from attnx.model.builders import ComponentSpec, installed_registry, layer_matrices
from attnx.registry import ComponentRegistry, Kind
from attnx.training.throughput import precision_dtype

ENCODER_BYTES = (40, 4)  # (per d_model, per d_ff) for each source token and encoder layer, the paper's layer
DECODER_BYTES = (60, 4)  # the same for each target token and decoder layer
CROSS_BYTES = 8  # per d_model for each source token and decoder layer: cross-attention keys and values
EMBEDDING_BYTES = 12  # per d_model for each token: embedding, positions, dropout, the encoder's output
HALF_PRECISION_SHARE = 0.7
CPU_BF16_ATTENTION_BYTES = 6  # per head, query and key: bf16 on CPU computes attention explicitly (fp32
# softmax + bf16 copy), where the fused kernels of fp32 and of GPUs keep only a per-row statistic

GATED_HIDDEN_BYTES = 16
"""Per d_ff for each token and layer of a gated feed-forward network (`matrices = 3`): it keeps four hidden
tensors (the gate's input, its activation, the linear branch, their product) where the paper's network keeps
one (ReLU's output, which W2 reads as well: `ENCODER_BYTES[1]`)."""

GROUPED_KEY_VALUE_BYTES = 8
"""Per d_model × kv_heads / n_heads for each token and self-attention with grouped key/value heads: the
projection's output is kept beside the keys and values repeated for the query heads (new tensors, full size).
With a score bias the kernel keeps what it keeps without grouping (measured: no more)."""

NORM_BYTES = 4
"""Per d_model for each token and norm that is not PyTorch's LayerNorm (RMSNorm, a plugin's): written in
PyTorch operations, it keeps its normalized input too, where LayerNorm's kernel keeps two statistics a row."""

QUERIES_KEYS_BYTES = (12, 4)
"""Per d_model for each token and self-attention with positions that act on its queries and keys (rotary):
the turned queries and keys are new tensors; (without, with) grouped key/value heads, whose repeated keys are
new tensors anyway (measured: 4 in place of grouping's own, whatever kv_heads)."""

SCORE_BIAS_BYTES = 4
"""Per head and key for each query of a self-attention with positions that add a bias to its scores (T5's
relative bias, ALiBi): the fp32 mask that carries the bias into the kernel, one per sentence."""


@dataclass(frozen=True)
class LayerBytes:
    """Bytes the backward pass keeps, per token, for one layer of the config's components (fp32)."""

    encoder: float  # per source token and encoder layer
    decoder: float  # per target token and decoder layer
    cross: float  # per source token and decoder layer: cross-attention keys and values
    per_key: float  # per query, key and self-attention: the score bias's mask (0 without one)


def layer_bytes(config: TransformerConfig, registry: ComponentRegistry | None = None) -> LayerBytes:
    """The per-token bytes of an encoder and a decoder layer of `config`: the paper's layer
    (`ENCODER_BYTES`, `DECODER_BYTES`) with what each of its components keeps in place of the paper's,
    its classes looked up in `registry` (default: installed plugins)."""
    registry = installed_registry(registry)
    d, f, h = config.d_model, config.d_ff, config.n_heads
    ffn = registry.get(Kind.FEEDFORWARD, config.feedforward.name)
    hidden = GATED_HIDDEN_BYTES if getattr(ffn, "matrices", 2) == 3 else ENCODER_BYTES[1]
    norm = registry.get(Kind.NORM, config.norm.name)
    norms = 0 if isinstance(norm, type) and issubclass(norm, nn.LayerNorm) else NORM_BYTES * d
    place = getattr(registry.get(Kind.POSITIONAL, config.positional.name), "acts_on", "embeddings")

    def self_attention(spec: ComponentSpec) -> float:  # what it keeps beyond the paper's attention
        kv_heads = spec.args.get("kv_heads") or h
        if place == "queries_keys":
            return QUERIES_KEYS_BYTES[kv_heads < h] * d
        if place == "scores" or kv_heads == h:
            return 0.0
        return GROUPED_KEY_VALUE_BYTES * d * kv_heads / h

    extra = self_attention(config.self_attention)
    return LayerBytes(
        encoder=ENCODER_BYTES[0] * d + hidden * f + extra + 2 * norms,
        decoder=DECODER_BYTES[0] * d + hidden * f + extra + 3 * norms,
        cross=CROSS_BYTES * d,
        per_key=SCORE_BIAS_BYTES * h if place == "scores" else 0.0,
    )


def activation_bytes(
    config: TransformerConfig,
    src_tokens: int,
    tgt_tokens: int,
    precision: str = "32-true",
    device: str = "cuda",
    src_len: float = 25.0,
    tgt_len: float = 25.0,
    registry: ComponentRegistry | None = None,
) -> int:
    """Bytes of the activations one training batch keeps for its backward pass, plus the loss's share.

    `src_tokens`/`tgt_tokens`: the batch's padded tokens per side; `src_len`/`tgt_len`: its padded lengths
    (they matter where attention weights or a score bias are kept). Each layer keeps what
    [`layer_bytes`][attnx.training.activations.layer_bytes] says for its components. The loss projects the
    target positions onto the vocabulary and takes its gradients in the forward pass: the features' gradient
    is kept, and on GPUs the whole batch's logits exist at once for a moment (CPUs take them in chunks).
    """
    d, v = config.d_model, config.vocab_size
    per = layer_bytes(config, registry)
    encoder_layer = src_tokens * (per.encoder + per.per_key * src_len)
    decoder_layer = tgt_tokens * (per.decoder + per.per_key * tgt_len) + src_tokens * per.cross
    half = precision_dtype(precision) in (torch.bfloat16, torch.float16)
    share = HALF_PRECISION_SHARE if half else 1.0
    if config.activation_checkpointing:
        # each layer keeps its fp32 input; one layer at a time holds its whole activations, recomputed
        layers = 4 * d * (src_tokens * config.encoder_layers + tgt_tokens * config.decoder_layers)
        layers += share * max(encoder_layer, decoder_layer)
    else:
        layers = share * (config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer)
    layers += share * (src_tokens + tgt_tokens) * EMBEDDING_BYTES * d
    if half:
        # autocast keeps a 2-byte copy of every matrix it multiplies by until the backward pass
        encoder, decoder = layer_matrices(config, registry)
        layers += 2 * (config.encoder_layers * encoder + config.decoder_layers * decoder + v * d)
        if device == "cpu":
            heads = config.n_heads
            queries_keys = src_tokens * src_len * config.encoder_layers
            queries_keys += tgt_tokens * (tgt_len + src_len) * config.decoder_layers
            layers += CPU_BF16_ATTENTION_BYTES * heads * queries_keys
    loss = 4 * tgt_tokens * d + 4 * v * d  # the features' and the projection's gradients, fp32
    if device != "cpu":
        loss += 2 * 4 * tgt_tokens * v  # logits and their gradient, fp32, for a moment
    return int(layers + loss)
