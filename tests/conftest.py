"""Shared fixtures: where the real corpora are, tiny model configs, a fresh plugin registry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnx.model import TransformerConfig

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """Real corpora: ``$ATTNX_DATA_DIR`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("ATTNX_DATA_DIR", REPO.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "multi30k").is_dir():
        pytest.fail(f"real corpora not found at {path}: set ATTNX_DATA_DIR to the folder holding multi30k/")
    return path


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def tiny_config(**overrides) -> TransformerConfig:
    """A 2+2-layer, d_model 32 model: fast enough for every unit test."""
    values = dict(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        d_ff=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_len=128,
    )
    return TransformerConfig(**(values | overrides))


@pytest.fixture
def tiny() -> TransformerConfig:
    return tiny_config()
