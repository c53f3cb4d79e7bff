"""Every test that the promises page cites exists: `tests/x.py::name`, or `::name` for the file cited last."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

PROMISES = REPO / "docs" / "promises.md"
CITATION = re.compile(r"`(tests/[^`\s:]+\.py)?(?:::(\w+))?`")


def citations() -> list[tuple[str, str | None]]:
    found, current = set(), None
    for path, test in CITATION.findall(PROMISES.read_text(encoding="utf-8")):
        if not path and not test:
            continue
        current = path or current
        assert current, f"{PROMISES.name}: ::{test} cited before any test file"
        found.add((current, test or None))
    return sorted(found)


def test_the_page_cites_a_test_for_each_promise():
    assert sum(test is not None for _, test in citations()) >= 25


@pytest.mark.parametrize(("path", "test"), citations(), ids=lambda v: v or "file")
def test_cited_test_exists(path, test):
    file = REPO / path
    assert file.is_file(), f"{PROMISES.name} cites {path}, which does not exist"
    if test is not None:
        assert re.search(rf"^\s*def {test}\(", file.read_text(encoding="utf-8"), flags=re.M), (
            f"{PROMISES.name} cites {path}::{test}, which is not a test in that file"
        )
