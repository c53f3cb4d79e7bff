"""Helpers of the prepare tests: a bad input's one error line, and the real command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.cli import main as attnx


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line a bad input prints on stderr; the exit status is 1 (bad data) or 2 (bad options)."""
    assert attnx(["prepare", *argv]) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith("attnx prepare: error: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def base(raw: Path, out: Path) -> list[str]:
    return ["--src_lang", "en", "--tgt_lang", "de", "--train", str(raw / "train"), "--output", str(out)]


def attnx_prepare(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de"]
    command += ["--drop_wrong_language", "false"]
    return subprocess.run(command + list(map(str, argv)), capture_output=True, text=True, env=os.environ)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr
