"""What the docs tell a user to run works from a fresh clone: no command or code block reads a folder beside
the checkout (`../shared`), and translations are scored with one command, `attnx score`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]

FENCED = re.compile(r"^[ \t]*(```+)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", flags=re.S | re.M)
INLINE_COMMAND = re.compile(r"`((?:attnx|python|python3|bash|nice|pip) [^`]+)`")

OUTSIDE = "../shared"
"""A folder beside a checkout: what the corpora of one machine are called, not a path a clone has."""


def commands(page: Path) -> list[str]:
    """Every fenced code block of `page` (inside admonitions too) and every inline command (`attnx ...`,
    `python ...`)."""
    text = page.read_text(encoding="utf-8")
    return [body for _, body in FENCED.findall(text)] + INLINE_COMMAND.findall(text)


def test_commands_are_found_in_blocks_notes_and_inline_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `attnx fit --config x` then\n\n```bash\nattnx test\n```\n\n"
        '??? note "How this was measured"\n\n    ```bash\n    python bench/a.py\n    ```\n',
        encoding="utf-8",
    )
    assert [c.strip() for c in commands(page)] == ["attnx test", "python bench/a.py", "attnx fit --config x"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_command_reads_a_folder_outside_the_clone(page: Path) -> None:
    found = [command.strip().splitlines()[0] for command in commands(page) if OUTSIDE in command]
    assert not found, (
        f"{page.name}: commands with {OUTSIDE} (use the paths attnx download and prepare make): {found}"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_translations_are_scored_with_attnx_score(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "python -m attnx.evaluation.bleu" not in text, f"{page.name}: score with `attnx score`"
