"""bench/bench_decode_precision.py at toy size: every row it promises, on the trained fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import bench_script

bench = bench_script("bench_decode_precision")


def test_toy_run_reports_every_engine_and_precision(trained: Path, shared_data: Path, tmp_path: Path, capsys):
    ctranslate2 = pytest.importorskip("ctranslate2")
    table = tmp_path / "table.md"
    argv = ["--ckpt_path", str(trained), "--data", str(shared_data), "--sentences", "6", "--times", "2"]
    assert bench.main([*argv, "--beam", "2", "--repeats", "1", "--threads", "1", "--output", str(table)]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("CPU: ")  # the machine, above the figures
    text = table.read_text()
    assert text.startswith(
        "Decoding precision: 6 lines of Multi30k test_2016_flickr ×2, beam 2, 1 thread(s) ("
    )
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()[4:]}
    types = sorted(ctranslate2.get_supported_compute_types("cpu"))
    assert list(rows) == [
        "attnx fp32",
        "attnx auto",
        *[f"CTranslate2 {t}" for t in types],
        "CTranslate2 auto",
    ]
    fp32 = rows["attnx fp32"]
    assert fp32[1] == "32-true" and fp32[6] == "1.00" and fp32[9] == "100.0%"  # fp32 against itself
    for how, cells in rows.items():
        assert len(cells) == len(bench.COLUMNS), how
        assert all(float(cells[i]) > 0 for i in (3, 4, 5)), how  # decode s, sentences/s, tokens/s
        assert 0 <= float(cells[7]) <= 100 and cells[10].rstrip(" |") in (
            "within bounds",
            "DEGRADED: use fp32",
        )
    assert rows["CTranslate2 float32"][1] == "float32"
    assert rows["CTranslate2 auto"][1] in types
