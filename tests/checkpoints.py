"""What tests use to make a decodable model without Lightning: the small SentencePiece model it carries and
[`attnx.checkpoint.save_model`][attnx.checkpoint.format.save_model] to write it (`tiny_checkpoint`: one that
`attnx fit --config configs/tiny.yaml` accepts); `flip_bytes` to damage a written one as a bad disk or copy
would, and `poison_tensor` to write NaN into one with its CRC-32 recomputed."""

from __future__ import annotations

import random
import struct
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from attnx.checkpoint import save_model
from attnx.data.tokenizer import Tokenizer, train_sentencepiece
from attnx.model import TransformerConfig, build_transformer
from tests.conftest import REPO

__all__ = ["flip_bytes", "poison_tensor", "save_model", "tiny_checkpoint", "train_tokenizer"]


def train_tokenizer(lines: Iterable[str], vocab_size: int, **options: Any) -> Tokenizer:
    """A SentencePiece model trained in memory on `lines` with attnx's special ids; `options` go to the trainer."""
    return train_sentencepiece(vocab_size, sentences=lines, **options)


def tiny_checkpoint(corpus: Path, path: Path) -> Path:
    """A checkpoint of configs/tiny.yaml's model, randomly initialised, with the SentencePiece model of the
    prepared corpus `corpus`: what `attnx fit/test --config configs/tiny.yaml --data.data_dir CORPUS` accepts."""
    transformer = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())["model"]["transformer"]
    tokenizer = Tokenizer.load(corpus / "spm.model")
    config = TransformerConfig.from_dict({**transformer, "vocab_size": tokenizer.vocab_size})
    save_model(path, build_transformer(config), config, tokenizer)
    return path


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


def poison_tensor(path: Path, value: float = float("nan")) -> str:
    """Write `value` (float32) over the first 4 bytes of the largest tensor of the checkpoint at `path`, in place,
    and record the member's new CRC-32 in its local header and in the central directory, as a tool rewriting a
    tensor would: the archive stays sound, only the weights are changed. Returns the member's name."""
    with zipfile.ZipFile(path) as archive:
        tensors = [info for info in archive.infolist() if "/data/" in info.filename]
        member = max(tensors, key=lambda info: info.file_size)
        central = archive.start_dir
    with open(path, "r+b") as f:
        f.seek(member.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        start = member.header_offset + 30 + name_length + extra_length
        f.seek(start)
        data = bytearray(f.read(member.file_size))
        data[:4] = struct.pack("<f", value)
        f.seek(start)
        f.write(data)
        crc = struct.pack("<I", zlib.crc32(data))
        f.seek(member.header_offset + 14)  # the local header's CRC-32
        f.write(crc)
        f.seek(central)
        while True:  # the member's record in the central directory: its CRC-32 at offset 16
            record = f.tell()
            fixed = f.read(46)
            assert fixed[:4] == b"PK\x01\x02", "member not found in the central directory"
            name_length, extra_length, comment_length = struct.unpack("<HHH", fixed[28:34])
            name = f.read(name_length).decode()
            if name == member.filename:
                f.seek(record + 16)
                f.write(crc)
                break
            f.seek(extra_length + comment_length, 1)
    return member.filename


def reader_commands(corpus: Path, good: Path, path: Path) -> list[list[str]]:
    """The argv of every command that reads the checkpoint `path` (`good` is a sound one to average it with; run
    from a folder holding `input.en`): translate, test, fit --ckpt_path and --init_from, average, and the
    exports and serve of the optional extras that are installed."""
    import importlib.util
    import socket

    from tests.training.conftest import fit_args

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    commands = [
        ["translate", "--model", str(path), "--input", "input.en"],
        fit_args(corpus, "--ckpt_path", str(path), subcommand="test"),
        fit_args(corpus, "--ckpt_path", str(path)),
        fit_args(corpus, "--init_from", str(path)),
        ["average", "--checkpoints", f"[{good}, {path}]", "--output", "averaged.ckpt"],
    ]
    extras = [  # the commands of the optional extras, where they are installed
        ("ctranslate2", ["export", "--ckpt_path", str(path), "--format", "ctranslate2", "--output", "ct2"]),
        ("transformers", ["export", "--ckpt_path", str(path), "--format", "huggingface", "--output", "hf"]),
        ("litserve", ["serve", "--model", str(path), "--port", str(port)]),
    ]
    return commands + [argv for package, argv in extras if importlib.util.find_spec(package) is not None]
