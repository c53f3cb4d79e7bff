"""bench/bench_corpus_mix.py (the realized corpus mix against the asked one) at toy size: Multi30k cut into two
named corpora, a few steps of the tiny config, a row per corpus with shares that add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, bench_script


def test_toy_run_has_a_row_per_corpus(shared_data: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    argv = ["--data", str(shared_data), "--work", str(tmp_path / "work"), "--sizes", "big=300", "small=100"]
    argv += ["--weights", "big=1", "small=1", "--steps", "4", "--max_tokens", "512", "--vocab_size", "300"]
    argv += ["--config", str(REPO / "configs" / "tiny.yaml"), "--json", str(out)]
    assert bench_script("bench_corpus_mix").main(argv) == 0
    rows = json.loads(out.read_text())
    assert [row["corpus"] for row in rows] == ["big", "small"]
    assert [row["asked"] for row in rows] == [0.5, 0.5]
    for key in ("expected", "realized_pairs", "realized_tokens"):
        assert sum(row[key] for row in rows) == pytest.approx(1.0)
    printed = capsys.readouterr().out
    assert "CPU: " in printed and "| big | 300 | 50.0% |" in printed
