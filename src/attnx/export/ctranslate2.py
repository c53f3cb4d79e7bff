"""Export a checkpoint to CTranslate2, and translate with the exported directory behind attnx's Translator calls.

[`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2] fills CTranslate2's own ``TransformerSpec`` (the spec API its OpenNMT-py, fairseq
and Marian converters use) from the rebuilt attnx model, then lets CTranslate2 validate, optimize (alias
shared weights, quantize) and save it. What needs care:

* **Positions.** CTranslate2's built-in sinusoid differs from the paper's in three ways: sines and cosines
  are concatenated halves rather than interleaved (``PE(pos, 2i) = sin``, ``PE(pos, 2i+1) = cos``), the
  frequencies use ``log(10000) / (d/2 - 1)`` rather than ``2i/d``, and positions start at 1. So the attnx
  table itself (float32, ``max_len`` rows, position 0 first) is written as the encoder's and decoder's
  ``position_encodings``; CTranslate2 then adds row ``t`` at position ``t``, exactly as attnx does.
  Learned positions (Table 3 row E) are written the same way.
* **Embeddings and output.** ``scale_embeddings`` multiplies by √d_model (§3.4); with shared embeddings the
  source, target and output matrices are one tensor, stored once (CTranslate2 aliases equal variables).
* **Vocabulary.** CTranslate2 speaks token strings: the vocabulary is the SentencePiece pieces in id order,
  so piece ``i`` is attnx id ``i`` (pad 0, unk 1, ``<s>`` 2, ``</s>`` 3); ``</s>`` is appended to the
  source and decoding starts from ``<s>``.
* **Norms.** Post-norm maps to ``pre_norm=False``; pre-norm to ``pre_norm=True`` with the stacks' final
  LayerNorm. The LayerNorm epsilon is written to the model config.

The directory also holds ``sentencepiece.model`` (the checkpoint's tokenizer) and ``attnx.json`` (format
version, the transformer config, the default search settings), which [`is_ctranslate2_model`][attnx.export.ctranslate2.is_ctranslate2_model] checks and
[`CTranslate2Translator`][attnx.export.ctranslate2.CTranslate2Translator] reads.

**Search.** [`CTranslate2Translator`][attnx.export.ctranslate2.CTranslate2Translator] maps [`SearchConfig`][attnx.inference.config.SearchConfig] onto
``ctranslate2.Translator.translate_batch``; how the two searches differ, and what is done about it:

* *Length penalty.* CTranslate2 divides a finished hypothesis's log-probability by ``|Y| ** length_penalty``
  and has no other form, so only ``length_penalty="fairseq"`` (``|Y| ** α``) can be reproduced; the GNMT
  form raises a ``ValueError`` for beams wider than 1 (greedy search has no penalty). With
  ``return_end_token=True`` the ``</s>`` is part of the hypothesis, so ``|Y|`` counts it as attnx does.
* *Maximum length.* attnx allows ``L`` tokens and then forces ``</s>``; CTranslate2 has one
  ``max_decoding_length`` per call and no forced end token: it stops after that many tokens, ``</s>`` or
  not. Sentences are therefore decoded in groups of equal ``L`` with ``max_decoding_length = L + 1`` (room
  for the ``</s>``); a hypothesis that reaches the limit without ``</s>`` has one token too many, which is
  cut, so no output is ever longer than attnx allows. Only for such sentences can the output differ from
  attnx's (attnx would have scored the forced ``</s>``; CTranslate2 ranks the unfinished hypothesis).
* *Beam bookkeeping.* attnx's beam shrinks when a hypothesis finishes (it keeps its slot) and stops when no
  live hypothesis can still win; CTranslate2 keeps ``beam`` live hypotheses and stops once ``beam``
  hypotheses have finished (``beam * patience``; ``patience`` is a [`CTranslate2Translator`][attnx.export.ctranslate2.CTranslate2Translator]
  argument). Both return the best finished hypothesis they found; the sets they explore differ after the
  first hypothesis finishes, so beam outputs agree on most but not all sentences (greedy outputs agree
  exactly).
* *Banned tokens.* attnx never generates ``<pad>`` or ``<s>``; they are suppressed here too. CTranslate2
  renormalizes the remaining probabilities (attnx keeps the model's own), which changes a step's
  log-probabilities by ``log(1 - p(<pad>) - p(<s>))``, about 1e-5 for a trained model: only near-ties can
  rank differently.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID
from attnx.data.tokenizer import Tokenizer
from attnx.export.common import ExportError, Target, layer_norm_eps, load_exportable, staged_output
from attnx.inference.search import SearchConfig
from attnx.inference.translator import (
    DEFAULT_MAX_TOKENS,
    encode_lines,
    one_line,
    translate_lines,
    truncate_ids,
)
from attnx.model import Transformer, TransformerConfig

log = logging.getLogger(__name__)

FORMAT = "attnx-ctranslate2"
FORMAT_VERSION = 1
METADATA = "attnx.json"
SPM_MODEL = "sentencepiece.model"
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
"""Weight types CTranslate2 can store; ``None`` keeps the checkpoint's float32."""

DEFAULT_SEARCH = SearchConfig(beam=4, alpha=0.6, length_penalty="fairseq", max_len_a=1.0, max_len_b=50)
"""§6.1's beam, α and maximum length, with the one length-penalty form CTranslate2 has (``|Y| ** α``)."""


TARGET = Target("CTranslate2", positional=("sinusoidal", "learned"), norm_positions=("post", "pre"))


def _ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError as err:
        raise ImportError(
            "CTranslate2 export and decoding need the ctranslate2 package: pip install 'attnx[ct2]'"
        ) from err
    return ctranslate2


# ------------------------------------------------------------------------------------------------- export


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


def _linear(spec: Any, layers: Sequence[nn.Linear]) -> None:
    """``spec`` gets the given projections stacked along the output dimension (CTranslate2's fused q/k/v)."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    if layers[0].bias is not None:
        spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


def _norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _positions(positional: nn.Module) -> np.ndarray:
    """The ``(max_len, D)`` vectors the positional component adds at positions 0, 1, ..."""
    if hasattr(positional, "table"):  # sinusoidal
        return _array(positional.table)
    return _array(positional.embedding.weight)  # learned


def _inputs(stack: Any, embeddings: Any, embedding: nn.Embedding, positional: nn.Module) -> None:
    embeddings.weight = _array(embedding.weight)
    stack.scale_embeddings = True  # × √d_model (§3.4)
    stack.position_encodings.encodings = _positions(positional)


def transformer_spec(model: Transformer, config: TransformerConfig, tokenizer: Tokenizer) -> Any:
    """The CTranslate2 ``TransformerSpec`` of ``model`` (config already checked), vocabulary registered."""
    _ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    pre_norm = config.norm_position == "pre"
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers),
        config.n_heads,
        pre_norm=pre_norm,
        activation=common_spec.Activation.RELU,
    )
    encoder, decoder = spec.encoder, spec.decoder

    _inputs(encoder, encoder.embeddings[0], model.src_embedding, model.src_positional)
    _inputs(decoder, decoder.embeddings, model.tgt_embedding, model.tgt_positional)
    decoder.projection.weight = _array(model.output_weight)

    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        attn = layer.self_attn
        _linear(layer_spec.self_attention.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
        _linear(layer_spec.self_attention.linear[1], [attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.attn_residual.norm)
        _linear(layer_spec.ffn.linear_0, [layer.ffn.w1])
        _linear(layer_spec.ffn.linear_1, [layer.ffn.w2])
        _norm(layer_spec.ffn.layer_norm, layer.ffn_residual.norm)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        attn, cross = layer.self_attn, layer.cross_attn
        _linear(layer_spec.self_attention.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
        _linear(layer_spec.self_attention.linear[1], [attn.out_proj])
        _norm(layer_spec.self_attention.layer_norm, layer.self_residual.norm)
        _linear(layer_spec.attention.linear[0], [cross.q_proj])
        _linear(layer_spec.attention.linear[1], [cross.k_proj, cross.v_proj])
        _linear(layer_spec.attention.linear[2], [cross.out_proj])
        _norm(layer_spec.attention.layer_norm, layer.cross_residual.norm)
        _linear(layer_spec.ffn.linear_0, [layer.ffn.w1])
        _linear(layer_spec.ffn.linear_1, [layer.ffn.w2])
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
        ckpt_path: Checkpoint written by ``attnx fit`` or ``attnx average``.
        output: Directory to create. It must not exist (or be empty) unless ``force``.
        quantization: Weight type: None (float32 as trained), ``int8``, ``int8_float32``, ``int8_float16``,
            ``int8_bfloat16``, ``int16``, ``float16`` or ``bfloat16``.
        search: Default search settings stored with the model (default [`DEFAULT_SEARCH`][attnx.export.ctranslate2.DEFAULT_SEARCH]); the length
            penalty must be the ``fairseq`` form for beams wider than 1.
        force: Replace an existing ``output``.

    Raises:
        ExportError: the model uses a component CTranslate2 cannot represent, or an argument is invalid.
    """
    ct2 = _ctranslate2()
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
        spec = transformer_spec(loaded.model, loaded.config, loaded.tokenizer)
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(str(work))
        (work / SPM_MODEL).write_bytes(loaded.tokenizer.to_bytes())
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "ctranslate2_version": ct2.__version__,
            "quantization": quantization,
            "transformer": loaded.config.to_dict(),
            "search": _search_dict(search),
            "tokenizer": SPM_MODEL,
            "source_checkpoint": Path(ckpt_path).name,
        }
        (work / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    return Path(output)


def read_metadata(directory: str | Path) -> dict[str, Any] | None:
    """``attnx.json`` of an exported directory, or None when ``directory`` is not one."""
    path = Path(directory) / METADATA
    if not path.is_file() or not (Path(directory) / "model.bin").is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def is_ctranslate2_model(directory: str | Path) -> bool:
    """Whether ``directory`` was written by [`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2] (any format version)."""
    return Path(directory).is_dir() and read_metadata(directory) is not None


# ----------------------------------------------------------------------------------------------- decoding


def check_search(search: SearchConfig) -> None:
    """Raise ``ValueError`` for settings CTranslate2's search cannot reproduce."""
    if search.beam < 1:
        raise ValueError(f"search.beam must be at least 1, got {search.beam}")
    if search.length_penalty not in ("gnmt", "fairseq"):
        raise ValueError(f"length_penalty must be 'gnmt' or 'fairseq', got {search.length_penalty!r}")
    if search.beam > 1 and search.length_penalty == "gnmt" and search.alpha != 0:
        raise ValueError(
            "CTranslate2 has only the |Y|^alpha length penalty (length_penalty='fairseq'), not GNMT's "
            "((5+|Y|)/6)^alpha; decode with length_penalty='fairseq' (or alpha=0, or beam=1), or with the "
            "attnx checkpoint"
        )


def _device(device: str | torch.device) -> tuple[str, int]:
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"CTranslate2 runs on cpu or cuda, not {device}")
    return device.type, device.index or 0


class CTranslate2Translator:
    """An exported model decoded by CTranslate2, with the calls of attnx's own Translator.

    Args:
        directory: Written by [`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2].
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        search: Search settings; default: those stored at export.
        max_tokens: Source tokens per CTranslate2 batch, padding included.
        compute_type: CTranslate2's compute type (``default``: the stored weight type where the device
            supports it).
        threads: CTranslate2 threads per translation (``intra_threads``; 0: its default).
        patience: CTranslate2's beam ``patience``: a sentence stops once ``beam * patience`` hypotheses
            have finished. At 1 (CTranslate2's default) it can stop before a live hypothesis that would
            still win under the length penalty has finished; 2 reproduces attnx's beam outputs more often
            at some cost in speed (docs/deploy.md).
    """

    def __init__(
        self,
        directory: str | Path,
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        compute_type: str = "default",
        threads: int = 0,
        patience: float = 1.0,
    ) -> None:
        directory = Path(directory)
        meta = read_metadata(directory)
        if meta is None:
            raise ValueError(
                f"{directory} is not a CTranslate2 model written by attnx export (no {METADATA} with "
                f"format {FORMAT!r} beside model.bin)"
            )
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{directory} has attnx-ctranslate2 format {meta.get('format_version')!r}; this attnx reads "
                f"{FORMAT_VERSION}: export the checkpoint again"
            )
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if patience <= 0:
            raise ValueError(f"patience must be positive, got {patience}")
        self.directory = directory
        self.metadata = meta
        self.config = TransformerConfig.from_dict(meta["transformer"])
        self.max_positions = self.config.max_len
        self.tokenizer = Tokenizer.load(directory / meta.get("tokenizer", SPM_MODEL))
        self.pieces = [self.tokenizer.sp.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        self.piece_ids = {piece: i for i, piece in enumerate(self.pieces)}
        if search is None:
            search = SearchConfig(**meta.get("search", {})) if meta.get("search") else DEFAULT_SEARCH
        self.search = self._capped(search)
        self.max_tokens = max_tokens
        self.compute_type = compute_type
        self.threads = threads
        self.patience = patience
        self._translator: Any = None
        self.to(device)

    @classmethod
    def load(
        cls,
        directory: str | Path,
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        compute_type: str = "default",
        threads: int = 0,
        patience: float = 1.0,
        **changes: Any,
    ) -> CTranslate2Translator:
        """A translator for ``directory``; keyword ``changes`` override search settings (e.g. ``beam=1``)."""
        translator = cls(directory, device, search, max_tokens, compute_type, threads, patience)
        if changes:
            translator.search = translator._capped(dataclasses.replace(translator.search, **changes))
        return translator

    def _capped(self, search: SearchConfig) -> SearchConfig:
        check_search(search)
        if search.max_positions is None or search.max_positions > self.max_positions:
            search = dataclasses.replace(search, max_positions=self.max_positions)
        return search

    @property
    def device(self) -> torch.device:
        return self._device

    def to(self, device: str | torch.device) -> CTranslate2Translator:
        """Load the model on ``device`` (``cpu``, ``cuda``, ``cuda:N``) and return this translator."""
        ct2 = _ctranslate2()
        kind, index = _device(device)
        self._translator = ct2.Translator(
            str(self.directory),
            device=kind,
            device_index=index,
            compute_type=self.compute_type,
            intra_threads=self.threads,
        )
        self._device = torch.device(kind, index) if kind == "cuda" else torch.device("cpu")
        return self

    def with_search(self, **changes: Any) -> CTranslate2Translator:
        """This translator with some search settings changed (the loaded model is shared)."""
        other = object.__new__(CTranslate2Translator)
        other.__dict__.update(self.__dict__)
        other.search = self._capped(dataclasses.replace(self.search, **changes))
        return other

    # ---------------------------------------------------------------------------------------------- ids

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids of ``lines`` (stripped; blank lines give ``[]``)."""
        return encode_lines(self.tokenizer, lines)

    def truncate(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Cut inputs the model cannot read (``max_positions`` with the source ``</s>``), with one warning."""
        return truncate_ids(ids, self.max_positions)

    def max_output_length(self, source_length: int) -> int:
        """``L = floor(a * (n + 1) + b)`` tokens before ``</s>`` for ``n`` source ids (+ ``</s>``), capped so
        that ``L + 1`` positions fit (as [`max_output_lengths`][attnx.inference.search.max_output_lengths])."""
        s = self.search
        cap = (s.max_positions or self.max_positions) - 1
        return max(0, min(cap, math.floor(s.max_len_a * (source_length + 1) + s.max_len_b)))

    def _options(self) -> dict[str, Any]:
        s = self.search
        return dict(
            beam_size=s.beam,
            patience=self.patience,
            length_penalty=s.alpha if s.length_penalty == "fairseq" else 0.0,
            min_decoding_length=0,
            return_end_token=True,  # |Y| counts the </s>, and a missing </s> marks a hypothesis cut at the limit
            max_input_length=0,  # inputs are truncated here, as attnx does
            suppress_sequences=[[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]],
            max_batch_size=self.max_tokens,
            batch_type="tokens",
        )

    def translate_ids(self, ids: Sequence[Sequence[int]], progress: bool = False) -> list[list[int]]:
        """Output ids for source ids (no BOS/EOS), one per input in input order; ``[]`` in gives ``[]`` out."""
        ids = self.truncate(ids)
        out: list[list[int]] = [[] for _ in ids]
        groups: dict[int, list[int]] = defaultdict(list)  # one max_decoding_length per CTranslate2 call
        for i, x in enumerate(ids):
            if x:
                groups[self.max_output_length(len(x))].append(i)
        options = self._options()
        eos = self.pieces[EOS_ID]
        total = sum(map(len, groups.values()))
        with tqdm(total=total, unit="sent", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
            for limit, members in sorted(groups.items()):
                results = self._translator.translate_batch(
                    [[self.pieces[t] for t in ids[i]] for i in members],
                    max_decoding_length=limit + 1,
                    **options,
                )
                for i, result in zip(members, results, strict=True):
                    tokens = result.hypotheses[0]
                    tokens = tokens[:-1] if tokens and tokens[-1] == eos else tokens[:limit]
                    out[i] = [self.piece_ids[t] for t in tokens]
                bar.update(len(members))
        return out

    def score_ids(
        self, source: Sequence[Sequence[int]], target: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Log-probability of every target token and of the closing ``</s>`` (teacher forcing), per pair."""
        results = self._translator.score_batch(
            [[self.pieces[t] for t in x] for x in source],
            [[self.pieces[t] for t in y] for y in target],
            max_batch_size=self.max_tokens,
            batch_type="tokens",
            max_input_length=0,
        )
        return [list(r.log_probs) for r in results]

    # --------------------------------------------------------------------------------------------- text

    def decode(self, ids: Sequence[int]) -> str:
        return one_line(self.tokenizer.decode(list(ids)))

    def translate(self, lines: Sequence[str] | str, progress: bool = False) -> list[str]:
        """Translations of ``lines`` (one segment each), same number and order; blank in gives blank out."""
        return translate_lines(self, lines, progress)

    def __call__(self, lines: Sequence[str]) -> list[str]:
        return self.translate(lines)

    def __repr__(self) -> str:
        return f"CTranslate2Translator({str(self.directory)!r}, device={str(self.device)!r}, search={self.search})"
