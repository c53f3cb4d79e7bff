"""Every file and test the paper map names exists, so the map cannot drift from the code."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

PAPER_MAP = REPO / "docs" / "paper-map.md"
REFERENCE = re.compile(r"`((?:src|tests|configs|plugins|bench)/[^`\s:]+)(?:::(\w+))?`")


def references() -> list[tuple[str, str | None]]:
    found = REFERENCE.findall(PAPER_MAP.read_text(encoding="utf-8"))
    return sorted({(path, test or None) for path, test in found})


def test_the_map_names_files_and_tests():
    refs = references()
    assert len({path for path, _ in refs}) >= 20
    assert sum(test is not None for _, test in refs) >= 20


@pytest.mark.parametrize(("path", "test"), references(), ids=lambda v: v or "file")
def test_reference_exists(path, test):
    file = REPO / path
    assert file.is_file(), f"{PAPER_MAP.name} names {path}, which does not exist"
    if test is not None:
        assert file.name.startswith("test_"), f"{path}::{test}: not a test file"
        assert re.search(rf"^\s*def {test}\(", file.read_text(encoding="utf-8"), flags=re.M), (
            f"{PAPER_MAP.name} names {path}::{test}, which is not a test in that file"
        )
