"""`attnx choices` lists what `auto` keeps on this machine and `--clear` forgets it."""

from __future__ import annotations

from pathlib import Path

from attnx.choices import remember
from attnx.cli import main as attnx


def test_choices_lists_and_clears_the_kept_measurements(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "kept.json"
    monkeypatch.setenv("ATTNX_CHOICES", str(path))
    remember("k", lambda: 1.25, "bf16 over fp32 decoding steps")
    assert attnx(["choices"]) == 0
    out = capsys.readouterr().out
    assert f"1 kept measurement(s) in {path}" in out and "bf16 over fp32 decoding steps: 1.25" in out
    assert attnx(["choices", "--clear"]) == 0
    assert f"cleared 1 kept measurement(s) from {path}" in capsys.readouterr().out
    assert attnx(["choices"]) == 0 and "0 kept measurement(s)" in capsys.readouterr().out


def test_choices_says_when_keeping_is_off(monkeypatch, capsys) -> None:
    monkeypatch.setenv("ATTNX_CHOICES", "off")
    assert attnx(["choices"]) == 0 and "keeping is off" in capsys.readouterr().out
