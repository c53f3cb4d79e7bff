"""§3 The Transformer: encoder and decoder stacks over shared embeddings (reads like Figure 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnx.components.attention import attention_backends
from attnx.components.protocols import POSITIONAL_PLACES
from attnx.model.cache import AttentionCache


@dataclass
class DecoderState:
    """Everything incremental decoding carries between steps; one row per hypothesis.

    `caches[i]` holds layer `i`'s self-attention cache (grows each step) and encoder-decoder cache
    (keys/values of the encoder output, computed once per sentence by
    [`Transformer.start_decoding`][attnx.model.transformer.Transformer.start_decoding]).
    """

    memory: Tensor  # (B, S, D)
    src_mask: Tensor  # (B, S) bool, True = real token
    caches: list[tuple[AttentionCache, AttentionCache]] = field(default_factory=list)
    offset: int = 0  # target positions decoded so far

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep rows `index`, in that order: follows beam back-pointers and drops finished sentences.

        `same_sources=True` promises that each new row has the same source sentence as the row it
        replaces (beam back-pointers within each sentence's rows): the source side (memory, mask,
        encoder-decoder keys/values) is then already right and only the self-attention caches move.
        """
        if not same_sources:
            self.memory = self.memory.index_select(0, index)
            self.src_mask = self.src_mask.index_select(0, index)
        for self_cache, cross_cache in self.caches:
            self_cache.reorder(index)
            if not same_sources:
                cross_cache.reorder(index)


class Transformer(nn.Module):
    """§3 Encoder-decoder Transformer.

    Parts are passed in built (see [`build_transformer`][attnx.model.builders.build_transformer]); this
    class only wires them: embeddings × √d_model (§3.4) plus positions (§3.5), dropout, N encoder layers, N
    decoder layers, and the pre-softmax projection, whose weight is the embedding matrix when
    `output_projection` is None (§3.4), plus `output_bias` `(V,)` where one is given (Marian's
    `final_logits_bias`; the paper has none).

    Each pass over the layers (encoding, teacher-forced decoding, one decoding step) runs inside
    [`attention_backends`][attnx.components.attention.attention_backends]: the attention kernels are chosen
    once a pass, for every attention component alike, never inside an attention call.
    """

    POSITIONAL_ACTS_ON = POSITIONAL_PLACES
    """Where this Transformer applies a positional component (its `acts_on`): added to the scaled embeddings,
    or handed to every self-attention of its stack (queries and keys, or scores)."""

    def __init__(
        self,
        *,
        src_embedding: nn.Embedding,
        tgt_embedding: nn.Embedding,
        src_positional: nn.Module,
        tgt_positional: nn.Module,
        encoder_layers: nn.ModuleList,
        decoder_layers: nn.ModuleList,
        encoder_norm: nn.Module | None,
        decoder_norm: nn.Module | None,
        output_projection: nn.Linear | None,
        dropout: float,
        output_bias: nn.Parameter | None = None,
        pad_id: int,
        max_positions: int,
        checkpoint_layers: bool = False,
    ) -> None:
        super().__init__()
        self.src_embedding = src_embedding
        self.tgt_embedding = tgt_embedding
        self.src_positional = src_positional
        self.tgt_positional = tgt_positional
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_norm = encoder_norm if encoder_norm is not None else nn.Identity()
        self.decoder_norm = decoder_norm if decoder_norm is not None else nn.Identity()
        self.output_projection = output_projection
        self.output_bias = output_bias  # (V,) or None: no bias, and no key in the state dict
        self.dropout = dropout
        self.pad_id = pad_id
        self.max_positions = max_positions  # longest source or target (with </s> or <s>) it reads
        self.checkpoint_layers = checkpoint_layers
        """Training keeps each layer's input only and recomputes the layer in the backward pass."""
        self.d_model = tgt_embedding.embedding_dim
        self.embed_scale = math.sqrt(self.d_model)

    @property
    def vocab_size(self) -> int:
        return self.tgt_embedding.num_embeddings

    @property
    def output_weight(self) -> Tensor:
        """The `(V, D)` pre-softmax weight: the shared embedding matrix unless sharing is off."""
        if self.output_projection is None:
            return self.tgt_embedding.weight
        return self.output_projection.weight

    def logits(self, features: Tensor) -> Tensor:
        """The pre-softmax projection of decoder outputs `(..., D)` -> logits `(..., V)`, bias included."""
        return F.linear(features, self.output_weight, self.output_bias)

    def _embed(
        self, tokens: Tensor, embedding: nn.Embedding, positional: nn.Module, offset: int = 0
    ) -> Tensor:
        x = embedding(tokens) * self.embed_scale  # (B, T, D)
        if positional.acts_on == "embeddings":
            x = positional(x, offset)
        return F.dropout(x, self.dropout, self.training)

    @staticmethod
    def _inside(positional: nn.Module) -> nn.Module | None:
        """The positional component to hand the layers' self-attention: itself when it acts inside attention."""
        return None if positional.acts_on == "embeddings" else positional

    def _layer(
        self,
        layer: nn.Module,
        *args: Tensor | None,
        weights: list | None = None,
        positions: nn.Module | None = None,
    ) -> Tensor:
        """`layer(*args)`, or with `checkpoint_layers` while training its activation checkpoint: the forward
        runs again in the backward pass, with the RNG state it had (the same dropout masks: the same
        gradients) and the same attention kernels."""
        if not (self.checkpoint_layers and self.training and torch.is_grad_enabled()) or weights is not None:
            return layer(*args, weights=weights, positions=positions)

        def run(*inputs: Tensor | None) -> Tensor:
            with attention_backends(inputs[0]):  # the recomputation runs outside the pass's own context
                return layer(*inputs, positions=positions)

        return checkpoint(run, *args, use_reentrant=False)

    def encode(self, src: Tensor, src_mask: Tensor, weights: list | None = None) -> Tensor:
        """`src` `(B, S)` token ids, `src_mask` `(B, S)` True at real tokens -> memory `(B, S, D)`."""
        x = self._embed(src, self.src_embedding, self.src_positional)
        with attention_backends(x):
            for layer in self.encoder_layers:
                x = self._layer(
                    layer, x, src_mask, weights=weights, positions=self._inside(self.src_positional)
                )
        return self.encoder_norm(x)

    def decode_features(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        weights: list | None = None,
        weights_layer: int | None = None,
    ) -> Tensor:
        """Teacher-forced decoder output before the pre-softmax projection, `(B, T, D)`.

        Training projects only the rows it scores (padding never reaches the `V`-wide softmax). A `weights`
        list receives each decoder layer's encoder-decoder attention `(B, H, T, S)`; with `weights_layer`
        (0-based, negative from the last) only that layer's, the others keep the fused kernel (what guided
        alignment trains on, in the same pass).
        """
        n = len(self.decoder_layers)
        if weights_layer is not None and not -n <= weights_layer < n:
            raise IndexError(f"decoder layer {weights_layer} does not exist: the decoder has {n} layers")
        x = self._embed(tgt_in, self.tgt_embedding, self.tgt_positional)
        with attention_backends(x):
            for i, layer in enumerate(self.decoder_layers):
                asked = weights_layer is None or i == weights_layer % n
                x = self._layer(
                    layer,
                    x,
                    memory,
                    src_mask,
                    weights=weights if asked else None,
                    positions=self._inside(self.tgt_positional),
                )
        return self.decoder_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, weights: list | None = None) -> Tensor:
        """Teacher-forced decoding of `tgt_in` `(B, T)` -> logits `(B, T, V)`; position i sees `tgt_in[:, :i+1]`."""
        return self.logits(self.decode_features(tgt_in, memory, src_mask, weights))  # (B, T, V)

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)

    def start_decoding(self, memory: Tensor, src_mask: Tensor) -> DecoderState:
        """Fresh decoding state with encoder-decoder keys/values computed once, from `memory`."""
        state = DecoderState(memory=memory, src_mask=src_mask)
        probe = memory[:, :1]  # any query fills a static cache with the keys/values of the whole memory
        with attention_backends(memory):
            for layer in self.decoder_layers:
                self_cache, cross_cache = AttentionCache(static=False), AttentionCache(static=True)
                layer.cross_attn(probe, memory, key_mask=src_mask, cache=cross_cache)
                state.caches.append((self_cache, cross_cache))
        return state

    def decode_step(self, tokens: Tensor, state: DecoderState, weights: list | None = None) -> Tensor:
        """One incremental step: `tokens` `(B,)`, the last token of each hypothesis -> logits `(B, V)`.

        Equal to the last position of [`decode`][attnx.model.transformer.Transformer.decode] over the whole
        prefix; `state` is advanced in place. A `weights` list receives each layer's encoder-decoder
        attention `(B, H, 1, S)` (computed explicitly; without it the fused kernel runs).
        """
        x = self._embed(
            tokens.unsqueeze(1), self.tgt_embedding, self.tgt_positional, state.offset
        )  # (B, 1, D)
        with attention_backends(x):
            for layer, cache in zip(self.decoder_layers, state.caches, strict=True):
                x = layer(
                    x,
                    state.memory,
                    state.src_mask,
                    cache=cache,
                    weights=weights,
                    positions=self._inside(self.tgt_positional),
                )
        state.offset += 1
        return self.logits(self.decoder_norm(x[:, 0]))  # (B, V)
