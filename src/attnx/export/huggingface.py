"""Export a checkpoint as a Hugging Face `MarianMTModel` directory (weights, config, tokenizer files).

Marian's architecture in `transformers` is the paper's: post-norm layers, ReLU (when configured; Swish and
GELU too), embeddings scaled by √d_model, sinusoidal positions, one shared matrix for source, target and
output, and a logits bias (`final_logits_bias`: attnx's `output_bias`, zeros without it). One difference
matters for the paper's `sinusoidal` positions (`marian_sinusoidal` is Marian's own table, exported as it is): `MarianSinusoidalPositionalEmbedding` puts the sines in the first half of each vector and the
cosines in the second (same frequencies, position 0 first), where the paper and attnx interleave them
(`PE(pos, 2i) = sin`, `PE(pos, 2i+1) = cos`). Marian regenerates that table when it loads a model (its
weights are never read from the checkpoint), so the table cannot be replaced. Instead the exported model
works in a permuted basis of the d_model-wide residual stream: coordinate `j` of Marian's stream is
coordinate `perm[j]` of attnx's, with `perm = [0, 2, 4, ..., 1, 3, 5, ...]`, which turns attnx's table
into exactly Marian's. Every weight that reads the stream (embedding columns, q/k/v and first FFN layer
inputs, the tied output projection) and every weight that writes it (attention output and second FFN layer
rows and biases, LayerNorm gain and bias) is permuted the same way. LayerNorm statistics and dot products
do not depend on the order of coordinates, so the permuted model computes the same logits.

Files written: `config.json`, `generation_config.json` and `model.safetensors` (`save_pretrained`),
`source.spm` and `target.spm` (both the joint SentencePiece model), `vocab.json` (piece → id, the
SentencePiece ids themselves), `tokenizer_config.json` and `attnx.json` (where the model came from, and the SHA-256 of its
SentencePiece model, that of `source.spm` and `target.spm`).
`MarianTokenizer` appends `</s>` to the source as attnx does; generation starts from `<s>` (id 2),
never generates `<pad>` or `<s>` (`bad_words_ids`) and ends with a forced `</s>` at `max_length`,
as attnx's search does at its maximum length.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnx.data.tokenizer import Tokenizer
from attnx.export.common import Target, load_exportable, staged_output
from attnx.model import Transformer, TransformerConfig

FORMAT = "attnx-huggingface"
FORMAT_VERSION = 1
TARGET = Target(
    "Hugging Face Marian",
    positional=("sinusoidal", "marian_sinusoidal"),
    norm_positions=("post",),
    layer_norm_eps=1e-5,
    feedforward=("relu", "swish", "gelu"),
)
"""Marian has sinusoidal positions only, post-norm layers only, and `nn.LayerNorm`'s default epsilon."""

ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}
"""Marian's `activation_function` of each feed-forward network it takes (`gelu` is the exact one)."""


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "Hugging Face export needs the transformers and safetensors packages: pip install 'attnx[hf]'"
        ) from err
    return transformers


def residual_permutation(d_model: int) -> Tensor:
    """`perm` with Marian coordinate `j` = attnx coordinate `perm[j]`: sines first, then cosines."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(config: TransformerConfig) -> Any:
    """The `MarianConfig` of an attnx model config (already checked against `TARGET`)."""
    transformers = _transformers()
    return transformers.MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        max_position_embeddings=config.max_len,
        activation_function=ACTIVATIONS[config.feedforward.name],
        scale_embedding=True,
        dropout=config.dropout,
        attention_dropout=float(config.self_attention.args.get("dropout", 0.0)),
        activation_dropout=float(config.feedforward.args.get("dropout", 0.0)),
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID,
        share_encoder_decoder_embeddings=config.share_embeddings,
        tie_word_embeddings=config.share_embeddings,
        normalize_before=False,
        normalize_embedding=False,
        static_position_embeddings=True,
    )


def generation_config(config: TransformerConfig) -> Any:
    """Defaults for `generate`: start from `<s>`, ban `<pad>`/`<s>`, force `</s>` at the end.

    `max_length` (decoder start included) defaults to every position the model has; pass
    `max_new_tokens=L + 1` to allow `L` tokens and the `</s>`, as attnx's `L`.
    """
    transformers = _transformers()
    return transformers.GenerationConfig(
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        bad_words_ids=[[PAD_ID], [BOS_ID]],
        max_length=config.max_len,
        num_beams=4,
    )


@torch.no_grad()
def _copy_linear(
    dst: nn.Linear, src: nn.Linear | tuple[Tensor, Tensor | None], perm: Tensor, reads: bool, writes: bool
) -> None:
    """`dst` = `src` (a layer or its `(weight, bias)`) with input columns (`reads`) and/or output rows
    (`writes`) in Marian's basis."""
    weight, bias = (src.weight, src.bias) if isinstance(src, nn.Linear) else src
    weight = weight.detach().float()
    if reads:
        weight = weight[:, perm]
    if writes:
        weight = weight[perm]
    dst.weight.copy_(weight)
    if bias is None:
        dst.bias.zero_()  # Marian's projections always have a bias
    else:
        dst.bias.copy_(bias.detach().float()[perm] if writes else bias.detach().float())


@torch.no_grad()
def _copy_norm(dst: nn.LayerNorm, src: nn.LayerNorm, perm: Tensor) -> None:
    dst.weight.copy_(src.weight.detach().float()[perm])
    dst.bias.copy_(src.bias.detach().float()[perm])


def _copy_attention(dst: nn.Module, src: nn.Module, perm: Tensor) -> None:
    for name, projection in zip(("q_proj", "k_proj", "v_proj"), src.projections(), strict=True):
        _copy_linear(getattr(dst, name), projection, perm, reads=True, writes=False)
    _copy_linear(dst.out_proj, src.out_proj, perm, reads=False, writes=True)


def _copy_ffn(dst: nn.Module, src: nn.Module, perm: Tensor) -> None:
    _copy_linear(dst.fc1, src.w1, perm, reads=True, writes=False)
    _copy_linear(dst.fc2, src.w2, perm, reads=False, writes=True)


@torch.no_grad()
def marian_model(model: Transformer, config: TransformerConfig) -> Any:
    """A `MarianMTModel` computing the same logits as `model` (config already checked)."""
    transformers = _transformers()
    hf = transformers.MarianMTModel(marian_config(config)).eval()
    perm = residual_permutation(config.d_model)
    if config.positional.name == "marian_sinusoidal":  # already Marian's table: the basis stays attnx's
        perm = torch.arange(config.d_model)
    marian = hf.model
    marian.encoder.embed_tokens.weight.copy_(model.src_embedding.weight.detach().float()[:, perm])
    marian.decoder.embed_tokens.weight.copy_(model.tgt_embedding.weight.detach().float()[:, perm])
    hf.lm_head.weight.copy_(model.output_weight.detach().float()[:, perm])
    if model.output_bias is None:
        hf.final_logits_bias.zero_()
    else:
        hf.final_logits_bias.copy_(model.output_bias.detach().float().unsqueeze(0))  # (1, V)
    for dst, src in zip(marian.encoder.layers, model.encoder_layers, strict=True):
        _copy_attention(dst.self_attn, src.self_attn, perm)
        _copy_norm(dst.self_attn_layer_norm, src.attn_residual.norm, perm)
        _copy_ffn(dst, src.ffn, perm)
        _copy_norm(dst.final_layer_norm, src.ffn_residual.norm, perm)
    for dst, src in zip(marian.decoder.layers, model.decoder_layers, strict=True):
        _copy_attention(dst.self_attn, src.self_attn, perm)
        _copy_norm(dst.self_attn_layer_norm, src.self_residual.norm, perm)
        _copy_attention(dst.encoder_attn, src.cross_attn, perm)
        _copy_norm(dst.encoder_attn_layer_norm, src.cross_residual.norm, perm)
        _copy_ffn(dst, src.ffn, perm)
        _copy_norm(dst.final_layer_norm, src.ffn_residual.norm, perm)
    hf.generation_config = generation_config(config)
    return hf


def write_tokenizer(tokenizer: Tokenizer, config: TransformerConfig, directory: Path) -> None:
    """`MarianTokenizer` files: the joint SentencePiece model as source and target, ids as attnx's."""
    proto = tokenizer.to_bytes()
    (directory / "source.spm").write_bytes(proto)
    (directory / "target.spm").write_bytes(proto)
    vocab = {tokenizer.sp.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    (directory / "vocab.json").write_text(
        json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8"
    )
    pieces = [tokenizer.sp.id_to_piece(i) for i in (PAD_ID, UNK_ID, EOS_ID)]
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "pad_token": pieces[0],
        "unk_token": pieces[1],
        "eos_token": pieces[2],
        "model_max_length": config.max_len,
        "separate_vocabs": False,
        "sp_model_kwargs": {},
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def export_huggingface(ckpt_path: str | Path, output: str | Path, force: bool = False) -> Path:
    """Write a `MarianMTModel` directory for an attnx checkpoint; returns the directory.

    Load it with `MarianMTModel.from_pretrained(output)` and `MarianTokenizer.from_pretrained(output)`.

    Args:
        ckpt_path: Checkpoint written by `attnx fit` or `attnx average`.
        output: Directory to create. It must not exist (or be empty) unless `force`.
        force: Replace an existing `output`.

    Raises:
        ExportError: the model uses a part Marian cannot represent (pre-norm, learned positions, a plugin
            component, a LayerNorm epsilon other than 1e-5).
    """
    transformers = _transformers()
    with staged_output(output, force) as work:
        loaded = load_exportable(ckpt_path, TARGET)
        hf = marian_model(loaded.model, loaded.config)
        progress = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()  # one small file: no bar on the caller's terminal
        try:
            hf.save_pretrained(str(work))
        finally:
            if progress:
                transformers.utils.logging.enable_progress_bar()
        write_tokenizer(loaded.tokenizer, loaded.config, work)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "transformer": loaded.config.to_dict(),
            "source_checkpoint": Path(ckpt_path).name,
            "tokenizer_sha256": loaded.tokenizer.sha256,
            "residual_permutation": "none"
            if loaded.config.positional.name == "marian_sinusoidal"
            else "marian[j] = attnx[perm[j]], perm = even coordinates, then odd",
        }
        (work / "attnx.json").write_text(json.dumps(meta, indent=2) + "\n")
    return Path(output)
