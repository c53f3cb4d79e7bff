"""[`load`][attnx.inference.load.load]: the [`Translator`][attnx.inference.translator.Translator] for a file or
directory, whichever engine reads it."""

from __future__ import annotations

from pathlib import Path

import torch

from attnx.checkpoint import CheckpointError
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig
from attnx.inference.ctranslate2 import CTranslate2Translator, is_ctranslate2_model
from attnx.inference.eager import EagerTranslator
from attnx.inference.translator import Translator

__all__ = ["load"]


def load(
    path: str | Path,
    device: str | torch.device = "cpu",
    search: SearchConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Translator:
    """A translator for `path`: a checkpoint file of `attnx fit`/`attnx average` (decoded by
    [`EagerTranslator`][attnx.inference.eager.EagerTranslator]), or a directory written by
    `attnx export --format ctranslate2` (decoded by
    [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator]).

    Both kinds answer the same calls: `translate(lines)`, `translate_ids(ids)`, `to(device)`,
    `with_search(**changes)`, `search`, `tokenizer`.
    """
    path = Path(path)
    if path.is_dir():
        if is_ctranslate2_model(path):
            return CTranslate2Translator.load(path, device=device, search=search, max_tokens=max_tokens)
        raise CheckpointError(
            f"{path} is a directory but not a model exported by `attnx export --format ctranslate2`; "
            "give a checkpoint file (*.ckpt) or an exported CTranslate2 directory"
        )
    return EagerTranslator.from_checkpoint(path, device=device, search=search, max_tokens=max_tokens)
