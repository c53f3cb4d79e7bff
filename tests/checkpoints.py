"""What tests use to make a decodable model without Lightning: the small SentencePiece model it carries and
[`attnx.checkpoint.save_model`][attnx.checkpoint.format.save_model] to write it; and
[`flip_bytes`][tests.checkpoints.flip_bytes] to damage a written one as a bad disk or copy would."""

from __future__ import annotations

import random
import struct
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnx.checkpoint import save_model
from attnx.data.tokenizer import Tokenizer, train_sentencepiece

__all__ = ["flip_bytes", "save_model", "train_tokenizer"]


def train_tokenizer(lines: Iterable[str], vocab_size: int, **options: Any) -> Tokenizer:
    """A SentencePiece model trained in memory on `lines` with attnx's special ids; `options` go to the trainer."""
    return train_sentencepiece(vocab_size, sentences=lines, **options)


def flip_bytes(path: Path, count: int = 570, seed: int = 0) -> str:
    """Change `count` bytes inside the largest tensor of the checkpoint at `path` (the largest member of another
    zip archive), in place, leaving the archive's structure and recorded CRC-32s as they were; returns the
    member's name."""
    with zipfile.ZipFile(path) as archive:
        tensors = [info for info in archive.infolist() if "/data/" in info.filename] or archive.infolist()
        member = max(tensors, key=lambda info: info.file_size)
    with open(path, "r+b") as f:
        f.seek(member.header_offset + 26)  # the local header's name and extra-field lengths
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        start = member.header_offset + 30 + name_length + extra_length
        rng = random.Random(seed)
        for offset in sorted(rng.sample(range(member.file_size), min(count, member.file_size))):
            f.seek(start + offset)
            byte = f.read(1)[0]
            f.seek(start + offset)
            f.write(bytes([byte ^ rng.randrange(1, 256)]))
    return member.filename
