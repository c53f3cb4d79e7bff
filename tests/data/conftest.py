"""Fixtures of the data tests: tiny corpora written on the fly, Multi30k prepared once per session, and a toy
corpus prepared through `attnx prepare`."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.data.prepare import Inputs, Settings, prepare

GERMAN = {
    "the": "der", "a": "ein", "man": "Mann", "woman": "Frau", "dog": "Hund", "cat": "Katze", "runs": "läuft",
    "sits": "sitzt", "on": "auf", "in": "in", "under": "unter", "with": "mit", "red": "rot", "blue": "blau",
    "small": "klein", "big": "groß", "house": "Haus", "street": "Straße", "park": "Park", "ball": "Ball",
}  # fmt: skip
WORDS = list(GERMAN)


def sentences(n: int, seed: int = 0, lo: int = 3, hi: int = 12) -> list[str]:
    """``n`` deterministic pseudo-sentences of ``lo``–``hi`` words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def translate(lines: list[str]) -> list[str]:
    """A word-for-word "German" side, so that pair lengths match as in real data."""
    return [" ".join(GERMAN[w] for w in line.split()) for line in lines]


def write(path: Path, lines: list[str] | bytes, gz: bool = False) -> Path:
    """Write ``lines`` (each followed by a newline) or raw bytes to ``path`` (gzipped when ``gz``)."""
    data = lines if isinstance(lines, bytes) else "".join(f"{line}\n" for line in lines).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_pair(prefix: Path, src: list[str] | bytes, tgt: list[str] | bytes, gz: bool = False) -> Path:
    write(Path(f"{prefix}.en"), src, gz)
    write(Path(f"{prefix}.de"), tgt, gz)
    return prefix


def run(raw: Path, out: Path, *extra: str) -> int:
    """Prepare ``raw/train`` (or the `--train` in `extra`: a repeated list option collects its values) with a
    60-piece vocabulary (or the `--vocab_size` in `extra`); language identification is off: the toy corpora's word salad is no language (the
    cleaning tests use real lines)."""
    train = [] if "--train" in extra else ["--train", str(raw / "train")]
    vocab = [] if "--vocab_size" in extra else ["--vocab_size", "60"]  # an option given twice is refused
    return attnx(
        [
            "prepare",
            "--src_lang",
            "en",
            "--tgt_lang",
            "de",
            *train,
            "--output",
            str(out),
            *vocab,
            "--drop_wrong_language",
            "false",
        ]
        + list(extra)
    )


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A small clean corpus: raw/train (300 pairs), raw/valid (20), raw/test (20)."""
    raw = tmp_path / "raw"
    for name, n, seed in [("train", 300, 1), ("valid", 20, 2), ("test", 20, 3)]:
        src = sentences(n, seed)
        write_pair(raw / name, src, translate(src), gz=name == "valid")
    return raw


@pytest.fixture(scope="session")
def multi30k(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Multi30k en-de (train/valid/test_2016_flickr), 8000-piece joint BPE, prepared once."""
    raw = shared_data / "multi30k"
    out = tmp_path_factory.mktemp("multi30k")
    inputs = Inputs.from_prefixes(
        {"train": [raw / "train"], "valid": [raw / "val"], "test": [raw / "test_2016_flickr"]}, "en", "de"
    )
    prepare(inputs, out, Settings("en", "de", vocab_size=8000))
    return out
