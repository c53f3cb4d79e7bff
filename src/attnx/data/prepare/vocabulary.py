"""Step 2: the joint SentencePiece BPE model, trained on both languages of the cleaned training text (§5.1)."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import sentencepiece as spm

from attnx.data import tokenizer
from attnx.data.corpus import SPM_MODEL
from attnx.data.errors import DataError
from attnx.data.prepare.settings import Settings

FULL_BELOW = 1 << 20
"""SentencePiece reports a model it could not write whole as one it cannot parse; with less free space than
this left where it wrote, that is the disk being full."""


def train_sentencepiece(
    texts: list[Path], out: Path, settings: Settings, workers: int
) -> tokenizer.Tokenizer:
    """Train the joint BPE model on `texts` (both languages) into `out/spm.model`, through
    [`attnx.data.tokenizer.train_sentencepiece`][attnx.data.tokenizer.train_sentencepiece] (attnx's special
    ids); return it.

    Raises:
        DataError: SentencePiece refused the vocabulary size or the text; the message says what to change.
    """
    spm.set_random_generator_seed(settings.seed)
    print(
        f"training SentencePiece BPE, {settings.vocab_size} pieces, on both sides of the cleaned training text"
    )
    try:
        return tokenizer.train_sentencepiece(
            settings.vocab_size,
            files=texts,
            model_prefix=out / Path(SPM_MODEL).stem,
            character_coverage=settings.character_coverage,
            input_sentence_size=settings.sample_size,
            shuffle_input_sentence=True,
            num_threads=workers,
            **({"user_defined_symbols": settings.symbols()} if settings.symbols() else {}),
        )
    except RuntimeError as e:
        if shutil.disk_usage(out).free < FULL_BELOW:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / SPM_MODEL)) from e
        message = str(e)
        if m := re.search(r"set it to a value <= (\d+)", message):
            raise DataError(
                f"--vocab_size {settings.vocab_size} is more than this training text supports; "
                f"use --vocab_size {m.group(1)} or less"
            ) from None
        if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message):
            raise DataError(
                f"--vocab_size {settings.vocab_size} is less than the {m.group(2)} pieces this text needs "
                f"(its characters plus 4 special ids); use a larger --vocab_size or a --character_coverage below "
                f"{settings.character_coverage}"
            ) from None
        raise DataError(f"SentencePiece training failed: {message}") from None
