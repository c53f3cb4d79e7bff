"""Fixtures of the export tests: the small trained model of tests/trained.py, loaded; torch on one thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.checkpoint import LoadedModel, load_model
from tests.conftest import one_thread


@pytest.fixture(scope="session")
def loaded(trained: Path) -> LoadedModel:
    return load_model(trained)


_one_thread = pytest.fixture(autouse=True)(one_thread)
