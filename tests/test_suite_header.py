"""What the test suite says of its own cost: the README's "Run the tests" and pytest's first lines agree, and the
quick subset they name exists."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from types import SimpleNamespace

import pytest

from tests.conftest import REPO, SUITE_COST, cost_unsaid, pytest_report_header


def test_the_readme_and_the_header_say_the_same_cost() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("Run the tests", 1)[1].split("\n## ", 1)[0]
    for fact in ("a quarter of an hour", "2-core machine", '`-m "not slow"`'):
        assert fact in section, f"README's test section no longer says {fact}"
        assert fact.strip("`") in SUITE_COST


def test_the_slow_marker_is_registered_and_used() -> None:
    settings = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    markers = settings["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("slow:") for marker in markers)
    marked = [p for p in (REPO / "tests").rglob("test_*.py") if "pytest.mark.slow" in p.read_text("utf-8")]
    assert marked, '-m "not slow" would leave nothing out'


def config(verbosity: int, whole: bool = True, worker: bool = False) -> SimpleNamespace:
    source = pytest.Config.ArgsSource.TESTPATHS if whole else pytest.Config.ArgsSource.ARGS
    fake = SimpleNamespace(args_source=source, get_verbosity=lambda: verbosity)
    if worker:
        fake.workerinput = {}
    return fake


def test_the_cost_is_a_header_and_under_quiet_the_first_line_of_the_whole_suite() -> None:
    assert pytest_report_header(config(0)) == [SUITE_COST]
    assert cost_unsaid(config(-1))  # `python -m pytest -q`: no header, so one line of its own
    assert not cost_unsaid(config(0))  # the header says it
    assert not cost_unsaid(config(-1, whole=False))  # one file or test: its cost is not the suite's
    assert not cost_unsaid(config(-1, worker=True))  # said once, by the controller


def test_pytest_q_of_the_whole_suite_says_its_cost_first() -> None:
    """The suite's testpaths narrowed to this file, collected only: what `python -m pytest -q` prints first."""
    argv = ["-q", "--co", "-n", "0", "-p", "no:cacheprovider", "-o", "testpaths=tests/test_suite_header.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == SUITE_COST
