"""A thin wrapper over one joint SentencePiece model (shared source/target vocabulary, §5.1)."""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
"""Special ids fixed in every SentencePiece model attnx trains."""


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
            raise ValueError(
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
