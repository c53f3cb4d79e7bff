"""Export a checkpoint to CTranslate2 (the directory is decoded by [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator]).

[`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2] fills CTranslate2's own `TransformerSpec` (the spec API its OpenNMT-py, fairseq
and Marian converters use) from the rebuilt attnx model, then lets CTranslate2 validate, optimize (alias
shared weights, quantize) and save it. What needs care:

* **Positions.** CTranslate2's built-in sinusoid differs from the paper's in three ways: sines and cosines
  are concatenated halves rather than interleaved (`PE(pos, 2i) = sin`, `PE(pos, 2i+1) = cos`), the
  frequencies use `log(10000) / (d/2 - 1)` rather than `2i/d`, and positions start at 1. So the attnx
  table itself (float32, `max_len` rows, position 0 first) is written as the encoder's and decoder's
  `position_encodings`; CTranslate2 then adds row `t` at position `t`, exactly as attnx does.
  Learned positions (Table 3 row E) are written the same way.
  So are `marian_sinusoidal`'s and `fairseq_sinusoidal`'s tables (row `t` is what attnx adds at position `t`).
* **Embeddings and output.** `scale_embeddings` multiplies by √d_model (§3.4); with shared embeddings the
  source, target and output matrices are one tensor, stored once (CTranslate2 aliases equal variables).
  `output_bias` becomes the output projection's bias.
* **Vocabulary.** CTranslate2 speaks token strings: the vocabulary is the SentencePiece pieces in id order,
  so piece `i` is attnx id `i` (pad 0, unk 1, `<s>` 2, `</s>` 3); `</s>` is appended to the
  source and decoding starts from `<s>`.
* **Norms.** Post-norm maps to `pre_norm=False`; pre-norm to `pre_norm=True` with the stacks' final
  LayerNorm. The LayerNorm (or RMSNorm, `rms_norm`) epsilon is written to the model config.
* **Today's components** (`TARGET`): rotary positions become
  `rotary_dim` (0 for the whole head), `rotary_interleave` and `rotary_base`, with no position table; T5's
  relative bias becomes each self-attention's `relative_attention_bias` and its maximum distance; SwiGLU
  and GEGLU become `ffn_glu` with the SWISH or GELU activation (`linear_0` is W, `linear_0_noact` V);
  RMSNorm `rms_norm`; `kv_heads` `num_heads_kv`.

The directory also holds `sentencepiece.model` (the checkpoint's tokenizer) and `attnx.json` (format
version, the transformer config, the default search settings, the SentencePiece model's SHA-256 and that of
every file CTranslate2 wrote, [`check_digests`][attnx.checkpoint.digests.check_digests], and the name, size and
SHA-256 of the checkpoint it was exported from), which [`is_ctranslate2_model`][attnx.inference.ctranslate2.is_ctranslate2_model] checks and
[`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator] reads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnx.checkpoint.digests import RECORD, file_digests
from attnx.data.batch import BOS_ID, EOS_ID
from attnx.data.corpus import file_sha256
from attnx.data.tokenizer import Tokenizer
from attnx.export.common import (
    ExportError,
    Target,
    kv_heads,
    layer_norm_eps,
    load_exportable,
    staged_output,
)
from attnx.inference.config import SearchConfig
from attnx.inference.ctranslate2 import (
    DEFAULT_SEARCH,
    FORMAT,
    FORMAT_VERSION,
    METADATA,
    SPM_MODEL,
    check_search,
    import_ctranslate2,
)
from attnx.model import Transformer, TransformerConfig

QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
"""Weight types CTranslate2 can store; `None` keeps the checkpoint's float32."""

TARGET = Target(
    "CTranslate2",
    positional=("sinusoidal", "marian_sinusoidal", "fairseq_sinusoidal", "learned", "rotary", "t5_relative"),
    norm_positions=("post", "pre"),
    feedforward=("relu", "swish", "gelu", "swiglu", "geglu"),
    norm=("layernorm", "rmsnorm"),
    kv_heads=True,
)
"""What CTranslate2's `TransformerSpec` expresses of attnx's components: positions on the embeddings (any
table), rotary (`rotary_dim`, interleaved pairs, `rotary_base`) or T5's relative bias
(`relative_attention_bias`), ReLU, Swish or GELU feed-forward networks and gated ones (`ffn_glu`, SiLU or
GELU), LayerNorm or RMSNorm (`rms_norm`), and grouped-query attention (`num_heads_kv`, one count for a
decoder layer's two attentions); the logits' bias (`output_bias`) too."""

SOURCE = "source_checkpoint"
"""The metadata key of the file name of the checkpoint the export was made from (attnx translate decodes lines
with terminology constraints with it, when it lies beside the export)."""
SOURCE_SHA256 = "source_checkpoint_sha256"
"""The metadata key of that checkpoint's SHA-256 (exports before it was recorded have none)."""
SOURCE_BYTES = "source_checkpoint_bytes"
"""The metadata key of that checkpoint's size in bytes."""

GATES = {"swiglu": "SWISH", "geglu": "GELU"}
"""CTranslate2's activation of each gated feed-forward network (SiLU is Swish-1; GELU is the exact one)."""
ACTIVATIONS = GATES | {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}
"""CTranslate2's activation of each feed-forward network, gated or not."""


# ------------------------------------------------------------------------------------------------- export


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


def _linear(spec: Any, layers: Sequence[nn.Linear | tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    """`spec` gets the given projections (layers, or `(weight, bias)` pairs) stacked along the output
    dimension (CTranslate2's fused q/k/v)."""
    pairs = [(layer.weight, layer.bias) if isinstance(layer, nn.Linear) else layer for layer in layers]
    spec.weight = np.concatenate([_array(weight) for weight, _ in pairs])
    if pairs[0][1] is not None:
        spec.bias = np.concatenate([_array(bias) for _, bias in pairs])


def _norm(spec: Any, norm: nn.Module) -> None:
    spec.gamma = _array(norm.weight)
    if getattr(norm, "bias", None) is not None:  # RMSNorm has a gain alone
        spec.beta = _array(norm.bias)


def _ffn(spec: Any, ffn: nn.Module) -> None:
    if hasattr(ffn, "v"):  # gated: act(x W) ⊗ x V, then W2
        _linear(spec.linear_0, [ffn.w])
        _linear(spec.linear_0_noact, [ffn.v])
    else:
        _linear(spec.linear_0, [ffn.w1])
    _linear(spec.linear_1, [ffn.w2])


def _relative_bias(spec: Any, positional: nn.Module) -> None:
    """T5's table, the same for every layer of a stack (CTranslate2 stores it once per layer, aliased)."""
    if getattr(positional, "acts_on", None) == "scores":
        spec.relative_attention_bias = _array(positional.bias.weight)  # (buckets, H)
        spec.relative_attention_max_distance = np.dtype("int32").type(positional.max_distance)


def _stack_options(config: TransformerConfig) -> dict[str, Any]:
    """The keyword arguments CTranslate2's encoder and decoder specs take for the config's components."""
    from ctranslate2.specs import common_spec

    options: dict[str, Any] = {
        "pre_norm": config.norm_position == "pre",
        "activation": getattr(common_spec.Activation, ACTIVATIONS[config.feedforward.name]),
        "ffn_glu": config.feedforward.name in GATES,
        "rms_norm": config.norm.name == "rmsnorm",
        "num_heads_kv": kv_heads(config, config.self_attention),
    }
    if config.positional.name == "rotary":
        args = config.positional.args
        options |= {
            "rotary_dim": int(args.get("dim") or 0),  # 0: the whole head
            "rotary_interleave": True,  # adjacent pairs, as RoFormer
            "rotary_base": float(args.get("base", 10000.0)),
        }
    elif config.positional.name == "t5_relative":
        options["relative_attention_bias"] = True
    return options


def _positions(positional: nn.Module) -> np.ndarray:
    """The `(max_len, D)` vectors the positional component adds at positions 0, 1, ..."""
    if hasattr(positional, "table"):  # sinusoidal, marian_sinusoidal, fairseq_sinusoidal: row t at position t
        return _array(positional.table)
    return _array(positional.embedding.weight)  # learned


def _inputs(stack: Any, embeddings: Any, embedding: nn.Embedding, positional: nn.Module) -> None:
    embeddings.weight = _array(embedding.weight)
    stack.scale_embeddings = True  # × √d_model (§3.4)
    if positional.acts_on == "embeddings":  # else the stack's attention carries them (no table)
        stack.position_encodings.encodings = _positions(positional)


def transformer_spec(model: Transformer, config: TransformerConfig, tokenizer: Tokenizer) -> Any:
    """The CTranslate2 `TransformerSpec` of `model` (config already checked), vocabulary registered."""
    import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    options = _stack_options(config)
    pre_norm = options["pre_norm"]
    decoder_kv = kv_heads(config, config.cross_attention)  # equal to self-attention's (checked)
    encoder = transformer_spec.TransformerEncoderSpec(config.encoder_layers, config.n_heads, **options)
    decoder = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.n_heads, **(options | {"num_heads_kv": decoder_kv})
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    _inputs(encoder, encoder.embeddings[0], model.src_embedding, model.src_positional)
    _inputs(decoder, decoder.embeddings, model.tgt_embedding, model.tgt_positional)
    decoder.projection.weight = _array(model.output_weight)
    if model.output_bias is not None:  # output_bias: true (Marian's final_logits_bias)
        decoder.projection.bias = _array(model.output_bias)

    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        attn = layer.self_attn
        _linear(layer_spec.self_attention.linear[0], attn.projections())
        _linear(layer_spec.self_attention.linear[1], [attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.attn_residual.norm)
        _relative_bias(layer_spec.self_attention, model.src_positional)
        _ffn(layer_spec.ffn, layer.ffn)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_residual.norm)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        attn, cross = layer.self_attn, layer.cross_attn
        _linear(layer_spec.self_attention.linear[0], attn.projections())
        _linear(layer_spec.self_attention.linear[1], [attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.self_residual.norm)
        _relative_bias(layer_spec.self_attention, model.tgt_positional)
        q, k, v = cross.projections()
        _linear(layer_spec.attention.linear[0], [q])
        _linear(layer_spec.attention.linear[1], [k, v])
        _linear(layer_spec.attention.linear[2], [cross.out_proj])
        _norm(layer_spec.attention.layer_norm, layer.cross_residual.norm)
        _ffn(layer_spec.ffn, layer.ffn)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_residual.norm)
    if pre_norm:
        _norm(encoder.layer_norm, model.encoder_norm)
        _norm(decoder.layer_norm, model.decoder_norm)

    pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token = pieces[1]
    spec.config.bos_token = pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.decoder_start_token = pieces[BOS_ID]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = layer_norm_eps(config)
    return spec


def _search_dict(search: SearchConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(search).items() if k != "max_positions"}


def export_ctranslate2(
    ckpt_path: str | Path,
    output: str | Path,
    quantization: str | None = None,
    search: SearchConfig | None = None,
    force: bool = False,
) -> Path:
    """Write a CTranslate2 model directory for an attnx checkpoint; returns the directory.

    Args:
        ckpt_path: Checkpoint written by `attnx fit` or `attnx average`.
        output: Directory to create. It must not exist (or be empty) unless `force`.
        quantization: Weight type: None (float32 as trained), `int8`, `int8_float32`, `int8_float16`,
            `int8_bfloat16`, `int16`, `float16` or `bfloat16`.
        search: Default search settings stored with the model (default [`DEFAULT_SEARCH`][attnx.inference.ctranslate2.DEFAULT_SEARCH]); the length
            penalty must be the `fairseq` form for beams wider than 1.
        force: Replace an existing `output`.

    Raises:
        ExportError: the model uses a component CTranslate2 cannot represent, or an argument is invalid.
    """
    ct2 = import_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"quantization {quantization!r} is not one CTranslate2 stores; choose None or one of "
            + ", ".join(QUANTIZATIONS)
        )
    search = search or DEFAULT_SEARCH
    try:
        check_search(search)
    except ValueError as err:
        raise ExportError(f"search settings to store with the model: {err}") from err
    with staged_output(output, force) as work:
        loaded = load_exportable(ckpt_path, TARGET)
        # hashed in blocks (a checkpoint of gigabytes is never held in memory whole)
        source_sha256, source_bytes = file_sha256(Path(ckpt_path)), Path(ckpt_path).stat().st_size
        spec = transformer_spec(loaded.model, loaded.config, loaded.tokenizer)
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(str(work))
        written = file_digests(work)  # model.bin, config.json, the vocabulary: CTranslate2's own files
        (work / SPM_MODEL).write_bytes(loaded.tokenizer.to_bytes())
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "ctranslate2_version": ct2.__version__,
            "quantization": quantization,
            "transformer": loaded.config.to_dict(),
            "search": _search_dict(search),
            "tokenizer": SPM_MODEL,
            "tokenizer_sha256": loaded.tokenizer.sha256,
            SOURCE: Path(ckpt_path).name,
            SOURCE_SHA256: source_sha256,
            SOURCE_BYTES: source_bytes,
            RECORD: written,
        }
        (work / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    return Path(output)
