"""Fixtures for decoding tests: a tiny SentencePiece model trained on real Multi30k text, a tiny checkpoint."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from attnx.checkpoint import LoadedModel, load_model
from attnx.data.tokenizer import Tokenizer
from attnx.model import build_transformer
from tests.checkpoints import save_model, train_tokenizer
from tests.conftest import one_thread, tiny_config


def multi30k_lines(data: Path, name: str, n: int) -> list[str]:
    with gzip.open(data / "multi30k" / name, "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


@pytest.fixture(scope="session")
def tokenizer(shared_data: Path) -> Tokenizer:
    """Joint BPE over 300 English and 300 German Multi30k training sentences, attnx's special ids."""
    lines = multi30k_lines(shared_data, "train.en.gz", 300) + multi30k_lines(shared_data, "train.de.gz", 300)
    return train_tokenizer(lines, 200, character_coverage=1.0)


@pytest.fixture(scope="session")
def checkpoint(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny model (max_len 64) with its tokenizer, as ``attnx fit`` would save it."""
    config = tiny_config(vocab_size=tokenizer.vocab_size, max_len=64)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    save_model(path, build_transformer(config), config, tokenizer)
    return path


@pytest.fixture(scope="session")
def loaded(checkpoint: Path) -> LoadedModel:
    return load_model(checkpoint)


_one_thread = pytest.fixture(autouse=True)(one_thread)
