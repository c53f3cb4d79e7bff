"""bench/bench_sampling.py (what subword sampling costs the training loader) at toy size: a row for the prepared
segmentation and one per alpha, with sampling resegmenting pairs and planning more batches an epoch."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import bench_script


def test_toy_run_has_a_row_per_setting(corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    argv = ["--corpus", str(corpus), "--max_tokens", "512", "--alphas", "0.2", "--batches", "3"]
    assert bench_script("bench_sampling").main([*argv, "--json", str(out)]) == 0
    prepared, sampled = json.loads(out.read_text())
    assert prepared["alpha"] == 0 and prepared["resegmented"] == 0
    assert sampled["resegmented"] > 0.5 and sampled["batches_per_epoch"] > prepared["batches_per_epoch"]
    assert prepared["batches_timed"] == sampled["batches_timed"] == 3
    assert "| 0.2 |" in capsys.readouterr().out
