"""[`load`][attnx.inference.load.load]: the [`Translator`][attnx.inference.translator.Translator] for a file or
directory, whichever engine reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnx.checkpoint import CheckpointError
from attnx.errors import ConfigError
from attnx.inference.compute_type import auto_compute_type, resolve_compute_type
from attnx.inference.config import AUTO, DEFAULT_MAX_TOKENS, SearchConfig, changed_search
from attnx.inference.ctranslate2 import CTranslate2Translator, is_ctranslate2_model
from attnx.inference.eager import EagerTranslator
from attnx.inference.translator import Translator

__all__ = ["DecodingPrecision", "decoding_precision", "load"]


@dataclass(frozen=True)
class DecodingPrecision:
    """What a loaded model decodes in once `auto` is resolved: a checkpoint's precision, or an export's compute
    type."""

    precision: str
    """What a checkpoint decodes in (`32-true`, `bf16-mixed`, `16-mixed`); for an export, the one asked for."""
    compute_type: str | None = None
    """An export's CTranslate2 compute type; None for checkpoints."""

    @property
    def label(self) -> str:
        """What runs: the compute type of an export, else the precision."""
        return self.compute_type or self.precision

    @classmethod
    def of(cls, translator: Translator, asked: str | None = AUTO) -> DecodingPrecision:
        """What `translator` (from [`load`][attnx.inference.load.load]) decodes in; `asked`: the precision it
        was loaded with, kept for an export."""
        if isinstance(translator, CTranslate2Translator):
            return cls(asked or AUTO, translator.compute_type)
        return cls(translator.precision)


def decoding_precision(
    path: str | Path | Sequence[str | Path], precision: str | None, device: str | torch.device
) -> DecodingPrecision:
    """What `path` (as [`load`][attnx.inference.load.load] takes it) decodes in on `device` with `precision`:
    the model is loaded there and `auto` (and None) measured on it, once per process, and said on standard
    error (a server resolves it once for all its workers)."""
    translator = load(path, device, precision=precision or AUTO)
    return DecodingPrecision.of(translator, precision)


def load(
    path: str | Path | Sequence[str | Path],
    device: str | torch.device = "cpu",
    search: SearchConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    weights: Sequence[float] | None = None,
    precision: str = AUTO,
    compute_type: str | None = None,
    **changes: Any,
) -> Translator:
    """A translator for `path`: a checkpoint file of `attnx fit`/`attnx average` (decoded by
    [`EagerTranslator`][attnx.inference.eager.EagerTranslator]), a directory written by
    `attnx export --format ctranslate2` (decoded by
    [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator]), or a list of checkpoint
    files decoded as one ensemble (optionally `weights`, one per checkpoint; they must share their
    SentencePiece model).

    `precision` (`32-true`, `bf16-mixed`, `16-mixed`): a checkpoint decodes under autocast in it; an export
    is loaded with the matching CTranslate2 compute type (float32, bfloat16, float16). `auto` (the default):
    a checkpoint decodes in bf16-mixed where the device's bf16 units make decoding faster, else 32-true
    ([`attnx.inference.precision`][attnx.inference.precision]); an export in the fastest compute type
    CTranslate2 supports on the device ([`attnx.inference.compute_type`][attnx.inference.compute_type]);
    the choice is said once on standard error. `compute_type`: an export's CTranslate2 compute type
    (`int8`, `float32`, ...), which `precision` then does not choose.

    `search` is the whole search (default: the model's own: an export's stored settings, a checkpoint's
    SearchConfig defaults); keywords change some settings of it, e.g. `attnx.load("model_ct2", beam=2)` keeps
    the length penalty stored with the export where `search=SearchConfig(beam=2)` would ask for GNMT's.

    Every kind answers the same calls: `generate(lines)`, `score(sources, targets)`, `translate(lines)`,
    `translate_ids(ids)`, `to(device)`, `with_search(**changes)`, `search`, `tokenizer`.
    """
    if not isinstance(path, (str, Path)):
        paths = [Path(p) for p in path]
        if len(paths) == 1 and weights is None:
            return load(
                paths[0],
                device,
                search,
                max_tokens,
                precision=precision,
                compute_type=compute_type,
                **changes,
            )
        exported = [p for p in paths if p.is_dir()]
        if exported:
            raise ConfigError(
                f"{exported[0]} is a directory: an ensemble decodes checkpoint files (*.ckpt) with attnx's own "
                "engine; CTranslate2 exports cannot be ensembled, give the checkpoints they were exported from"
            )
        return EagerTranslator.from_checkpoint(
            paths,
            device=device,
            search=changed(search, changes),
            max_tokens=max_tokens,
            weights=weights,
            precision=precision,
        )
    path = Path(path)
    if weights is not None:
        raise ConfigError("ensemble weights need an ensemble: give a list of checkpoints")
    if path.is_dir():
        if is_ctranslate2_model(path):
            compute_type = compute_type or resolve_compute_type(precision, device)
            auto = compute_type == AUTO
            if auto:
                compute_type = auto_compute_type(path, device, say=False).compute_type
            translator = CTranslate2Translator.load(
                path,
                device=device,
                search=search,
                max_tokens=max_tokens,
                compute_type=compute_type,
                **changes,
            )
            if auto:  # once it has loaded: an export refused is one line
                auto_compute_type(path, device)
            return translator
        raise CheckpointError(
            f"{path} is a directory but not a model exported by `attnx export --format ctranslate2`; "
            "give a checkpoint file (*.ckpt) or an exported CTranslate2 directory"
        )
    return EagerTranslator.from_checkpoint(
        path, device=device, search=changed(search, changes), max_tokens=max_tokens, precision=precision
    )


def changed(search: SearchConfig | None, changes: dict[str, Any]) -> SearchConfig | None:
    """`search` (None: SearchConfig's defaults, a checkpoint's own) with `changes`, as `with_search` makes them."""
    return changed_search(search or SearchConfig(), **changes) if changes else search
