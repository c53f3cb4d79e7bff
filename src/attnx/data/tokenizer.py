"""A thin wrapper over one joint SentencePiece model (shared source/target vocabulary, §5.1)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import sentencepiece as spm

from attnx.data.sentencepiece_proto import segmentation_digest, stable_proto
from attnx.errors import ConfigError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
"""Special ids fixed in every SentencePiece model attnx trains."""


SPECIAL_PIECES = {"pad_piece": "<pad>", "unk_piece": "<unk>", "bos_piece": "<s>", "eos_piece": "</s>"}


def train_sentencepiece(
    vocab_size: int,
    *,
    sentences: Iterable[str] | None = None,
    files: Sequence[str | Path] = (),
    model_prefix: str | Path | None = None,
    model_type: str = "bpe",
    **options: Any,
) -> Tokenizer:
    """Train a joint SentencePiece model with attnx's special ids (pad 0, unk 1, bos 2, eos 3).

    The text is `sentences` (an iterable of lines) or `files` (paths of text files, one sentence a line).
    With `model_prefix` the trainer writes `PREFIX.model` and `PREFIX.vocab`; without it the model stays in
    memory. The model records the names of `files` and of `model_prefix`, not their folders, and not the threads
    it was trained on ([`stable_proto`][attnx.data.sentencepiece_proto.stable_proto]): the same training writes
    the same bytes wherever it runs. `options` go to `SentencePieceTrainer.train` (`character_coverage`, `input_sentence_size`,
    `num_threads`, `user_defined_symbols`, ...). The one place attnx calls the trainer: `attnx prepare`, the
    tests and the benchmarks all train through it. SentencePiece's own errors come through as `RuntimeError`.
    """
    if (sentences is None) == (not files):
        raise ValueError("train_sentencepiece needs either sentences or files")
    source: dict[str, Any] = (
        {"sentence_iterator": iter(sentences)}
        if sentences is not None
        else {"input": [str(f) for f in files]}
    )
    writer = io.BytesIO()
    target: dict[str, Any] = {"model_prefix": str(model_prefix)} if model_prefix else {"model_writer": writer}
    spm.SentencePieceTrainer.train(
        **source,
        **target,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        **SPECIAL_PIECES,
        **{"minloglevel": 2, **options},
    )
    if not model_prefix:
        return Tokenizer.from_bytes(stable_proto(writer.getvalue(), files))
    path = Path(f"{model_prefix}.model")
    path.write_bytes(stable_proto(path.read_bytes(), files, model_prefix))
    return Tokenizer.load(path)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Tokenizer:
    """Joint SentencePiece BPE model with attnx's fixed special ids (pad 0, unk 1, bos 2, eos 3).

    `path` is the file it was read from (None when rebuilt from a checkpoint's bytes): what a message names.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None) -> None:
        self.sp = processor
        self.path = path
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ConfigError(
                f"SentencePiece model has special ids pad/unk/bos/eos = {ids}, attnx needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train it with `attnx prepare`"
            )

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"SentencePiece model {path} does not exist; create it with `attnx prepare`"
            )
        return cls(spm.SentencePieceProcessor(model_proto=path.read_bytes()), path)

    @classmethod
    def from_bytes(cls, proto: bytes) -> Tokenizer:
        """Rebuild from [`to_bytes`][attnx.data.tokenizer.Tokenizer.to_bytes] (how checkpoints carry their
        tokenizer)."""
        return cls(spm.SentencePieceProcessor(model_proto=proto))

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model, as checkpoints store it: the bytes of the `.model` file."""
        return self.sp.serialized_model_proto()

    @cached_property
    def sha256(self) -> str:
        """SHA-256 of [`to_bytes`][attnx.data.tokenizer.Tokenizer.to_bytes], what `sha256sum spm.model` prints:
        the identity of the tokenizer that checkpoints, prepared corpora and exports record."""
        return sha256_hex(self.to_bytes())

    @cached_property
    def segmentation(self) -> str:
        """[`segmentation_digest`][attnx.data.sentencepiece_proto.segmentation_digest]: the identity of the
        tokenizer as ids go (pieces, scores, types, normalization), equal for two files of the same model that
        record another training folder. What a checkpoint is checked against."""
        return segmentation_digest(self.to_bytes())

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without BOS/EOS."""
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str], num_threads: int = -1) -> list[list[int]]:
        return self.sp.encode(texts, out_type=int, num_threads=num_threads)

    def decode(self, ids: list[int]) -> str:
        """Detokenized text; special ids are dropped."""
        return self.sp.decode([i for i in ids if i > EOS_ID])
