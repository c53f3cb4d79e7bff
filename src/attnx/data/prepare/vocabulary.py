"""Step 2: the joint SentencePiece BPE model, trained on both languages of the cleaned training text (§5.1), or
one brought from elsewhere (`--spm_model`: a vocabulary shared with other runs or toolkits), copied as it is.

A training text of more than `--sample_size` sentences is sampled by attnx with `--seed`
([`sample_sentences`][attnx.data.prepare.vocabulary.sample_sentences]), not by SentencePiece, whose own sampling
draws another sample at every run whatever seed it is given: the same command on the same text trains the same
model.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
from pathlib import Path

import sentencepiece as spm

from attnx.data import tokenizer
from attnx.data.corpus import SPM_MODEL
from attnx.data.errors import DataError
from attnx.data.prepare.settings import Settings
from attnx.errors import ConfigError

SAMPLE = "sentencepiece-sample.txt"
"""The sample of the training text SentencePiece trains on, in the scratch directory, when the text holds more
than `--sample_size` sentences."""

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
    sample, total = sample_sentences(texts, settings.sample_size, settings.seed, out / SAMPLE)
    drawn = f" (a sample of {settings.sample_size:,} of its {total:,} sentences)" if sample != texts else ""
    print(
        f"training SentencePiece BPE, {settings.vocab_size} pieces, on both sides of the cleaned training "
        f"text{drawn}"
    )
    try:
        return tokenizer.train_sentencepiece(
            settings.vocab_size,
            files=sample,
            model_prefix=out / Path(SPM_MODEL).stem,
            character_coverage=settings.character_coverage,
            input_sentence_size=settings.sample_size,  # never reached: the sample is no larger
            shuffle_input_sentence=False,
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


def sample_sentences(texts: list[Path], size: int, seed: int, out: Path) -> tuple[list[Path], int]:
    """(the files to train on, the sentences of `texts`): `texts` themselves when they hold at most `size`
    sentences (lines), else `out`, written with `size` of them drawn uniformly with `seed`, in the order they
    come (selection sampling, Knuth's Algorithm S: a pass to count, one to draw, nothing held in memory).

    The same texts, size and seed give the same sample on every machine; SentencePiece's own sampling
    (`input_sentence_size` with `shuffle_input_sentence`) draws another one at every run.
    """
    total = 0
    for path in texts:
        with open(path, "rb") as f:
            total += sum(1 for _ in f)
    if total <= size:
        return texts, total
    rng, needed, left = random.Random(seed), size, total
    with open(out, "wb") as sample:
        for path in texts:
            with open(path, "rb") as f:
                for line in f:
                    if rng.random() * left < needed:
                        sample.write(line if line.endswith(b"\n") else line + b"\n")
                        needed -= 1
                    left -= 1
    return [out], total


def read_sentencepiece(path: Path, settings: Settings) -> tokenizer.Tokenizer:
    """The SentencePiece model `--spm_model` names, checked before anything is read: a SentencePiece model
    file with attnx's special ids (pad 0, unk 1, bos 2, eos 3) in which every tag and user-defined symbol of
    `settings` is one piece.

    Raises:
        DataError: in one line naming the file and what is wrong with it.
    """
    if path.is_dir():  # e.g. a prepared corpus's folder: its spm.model is the file meant
        inside = (
            " (it holds spm.model: --spm_model " + str(path / "spm.model") + ")"
            if (path / "spm.model").is_file()
            else ""
        )
        raise DataError(f"--spm_model {path} is a folder: pass a SentencePiece model file (.model){inside}")
    if not path.is_file():
        raise DataError(f"--spm_model {path} does not exist")
    proto = path.read_bytes()
    try:
        processor = spm.SentencePieceProcessor(model_proto=proto) if proto else None
    except RuntimeError:
        processor = None
    if processor is None or processor.get_piece_size() == 0:
        raise DataError(
            f"--spm_model {path} is not a SentencePiece model (the .model file spm_train writes; not its .vocab)"
        )
    try:
        model = tokenizer.Tokenizer(processor, path)
    except ConfigError:
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        raise DataError(
            f"--spm_model {path} has special ids pad/unk/bos/eos = {ids}; attnx needs (0, 1, 2, 3): train it "
            "with spm_train --pad_id 0 --unk_id 1 --bos_id 2 --eos_id 3, or leave out --spm_model"
        ) from None
    split = [s for s in settings.symbols() if processor.piece_to_id(s) == processor.unk_id()]
    if split:
        raise DataError(
            f"{split[0]!r} (a --train_tag or --user_defined_symbols) is not a piece of --spm_model {path}: "
            "a brought model keeps its own pieces; leave it out, or train the model with it"
        )
    return model


def copy_sentencepiece(path: Path, model: tokenizer.Tokenizer, out: Path) -> tokenizer.Tokenizer:
    """`--spm_model`'s file copied byte for byte into `out/spm.model`, with the `spm.vocab` listing its pieces
    and scores as spm_train writes it; return the copy."""
    print(
        f"SentencePiece model {path}: {model.vocab_size} pieces, SHA-256 {model.sha256[:12]}…, copied as it is "
        "(nothing trained)"
    )
    shutil.copyfile(path, out / SPM_MODEL)
    lines = (f"{model.sp.id_to_piece(i)}\t{model.sp.get_score(i):g}\n" for i in range(model.vocab_size))
    (out / Path(SPM_MODEL).with_suffix(".vocab").name).write_text("".join(lines), encoding="utf-8")
    return tokenizer.Tokenizer.load(out / SPM_MODEL)
