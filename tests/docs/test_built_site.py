"""The site builds with ``mkdocs build --strict`` (every cross-reference resolves), and no built page shows a
raw Sphinx role such as ``:class:`X``` that mkdocstrings does not render: docstrings link with
``[`X`][attnx.path.X]`` or quote names in backticks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

DOCS = REPO / "docs"
# A role as the built HTML shows it: its backticks turned into <code>, or kept inside a code block.
RAW_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):(?:<code>|`|&#96;)")

# Pages whose raw roles come from files converted separately; strict, so the marker must go once they pass.
PENDING: dict[str, str] = {}


def built_page(site: Path, page: str) -> Path:
    """Where mkdocs (``use_directory_urls``) writes ``docs/page``."""
    stem = page.removesuffix(".md")
    return site / "index.html" if stem == "index" else site / stem / "index.html"


def pages() -> list:
    found = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    return [
        pytest.param(page, marks=pytest.mark.xfail(strict=True, reason=PENDING[page]))
        if page in PENDING
        else page
        for page in found
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    problems = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        problems or [done.stderr[-3000:]]
    )
    return out


def test_every_page_is_built_where_expected(site):
    missing = [page for page in (p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
               if not built_page(site, page).is_file()]  # fmt: skip
    assert not missing, f"pages not found in the built site: {missing}"


@pytest.mark.parametrize("page", pages())
def test_no_raw_sphinx_role_on_the_page(site, page):
    html = built_page(site, page).read_text(encoding="utf-8")
    found = [html[max(0, m.start() - 40) : m.end() + 60].replace("\n", " ") for m in RAW_ROLE.finditer(html)]
    assert not found, f"docs/{page} shows {len(found)} raw Sphinx role(s), e.g.:\n" + "\n".join(found[:10])


# reST that Markdown leaves as text: an inline literal (``x``, shown with its backticks inside code blocks,
# such as the --help texts of the CLI page) or a literal-block marker ending a paragraph ("goes::").
RAW_REST = re.compile(r"``|[^\s>]::</p>")


@pytest.mark.parametrize("page", pages())
def test_no_raw_restructuredtext_on_the_page(site, page):
    html = built_page(site, page).read_text(encoding="utf-8")
    found = [html[max(0, m.start() - 60) : m.end() + 20].replace("\n", " ") for m in RAW_REST.finditer(html)]
    assert not found, f"docs/{page} shows {len(found)} reST leftover(s), e.g.:\n" + "\n".join(found[:10])


def test_pending_pages_exist():
    for page in PENDING:
        assert (DOCS / page).is_file(), f"docs/{page} is gone: drop it from PENDING"
