"""[`load`][attnx.inference.load.load]: the [`Translator`][attnx.inference.translator.Translator] for a file or
directory, whichever engine reads it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from attnx.checkpoint import CheckpointError
from attnx.errors import ConfigError
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig, check_precision
from attnx.inference.ctranslate2 import CTranslate2Translator, is_ctranslate2_model
from attnx.inference.eager import EagerTranslator
from attnx.inference.translator import Translator

__all__ = ["load"]

COMPUTE_TYPES = {"32-true": "float32", "bf16-mixed": "bfloat16", "16-mixed": "float16"}
"""The CTranslate2 compute type an export is loaded with for each precision a checkpoint decodes in."""


def load(
    path: str | Path | Sequence[str | Path],
    device: str | torch.device = "cpu",
    search: SearchConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    weights: Sequence[float] | None = None,
    precision: str | None = None,
) -> Translator:
    """A translator for `path`: a checkpoint file of `attnx fit`/`attnx average` (decoded by
    [`EagerTranslator`][attnx.inference.eager.EagerTranslator]), a directory written by
    `attnx export --format ctranslate2` (decoded by
    [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator]), or a list of checkpoint
    files decoded as one ensemble (optionally `weights`, one per checkpoint; they must share their
    SentencePiece model).

    `precision` (`32-true`, `bf16-mixed`, `16-mixed`): a checkpoint decodes under autocast in it (default
    32-true); an export is loaded with the matching CTranslate2 compute type (float32, bfloat16, float16;
    default: the type it was exported with).

    Every kind answers the same calls: `generate(lines)`, `score(sources, targets)`, `translate(lines)`,
    `translate_ids(ids)`, `to(device)`, `with_search(**changes)`, `search`, `tokenizer`.
    """
    if not isinstance(path, (str, Path)):
        paths = [Path(p) for p in path]
        if len(paths) == 1 and weights is None:
            return load(paths[0], device, search, max_tokens, precision=precision)
        exported = [p for p in paths if p.is_dir()]
        if exported:
            raise ConfigError(
                f"{exported[0]} is a directory: an ensemble decodes checkpoint files (*.ckpt) with attnx's own "
                "engine; CTranslate2 exports cannot be ensembled, give the checkpoints they were exported from"
            )
        return EagerTranslator.from_checkpoint(
            paths,
            device=device,
            search=search,
            max_tokens=max_tokens,
            weights=weights,
            precision=precision or "32-true",
        )
    path = Path(path)
    if weights is not None:
        raise ConfigError("ensemble weights need an ensemble: give a list of checkpoints")
    if path.is_dir():
        if is_ctranslate2_model(path):
            if precision is not None:
                check_precision(precision, torch.device(device).type)
            options = {} if precision is None else {"compute_type": COMPUTE_TYPES[precision]}
            return CTranslate2Translator.load(
                path, device=device, search=search, max_tokens=max_tokens, **options
            )
        raise CheckpointError(
            f"{path} is a directory but not a model exported by `attnx export --format ctranslate2`; "
            "give a checkpoint file (*.ckpt) or an exported CTranslate2 directory"
        )
    return EagerTranslator.from_checkpoint(
        path, device=device, search=search, max_tokens=max_tokens, precision=precision or "32-true"
    )
