"""bench/bench_startup.py at toy size: one run of each kind it times, on the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import bench_script
from tests.inference.conftest import checkpoint, tokenizer  # noqa: F401

bench = bench_script("bench_startup")


@pytest.mark.slow
def test_toy_run_times_every_kind_in_turns_and_reports_the_machine(
    checkpoint: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    capsys,
):
    """Every row it promises, each with its command, figures and ratios, and the machine above them; the kinds
    are run in turns, one round after another."""
    import torch

    serve = pytest.importorskip("litserve", reason="the serve row needs the serve extra") is not None
    ct2 = pytest.importorskip("ctranslate2") is not None
    order: list[str] = []
    kinds = bench.kinds

    def recorded(*args):
        rows = kinds(*args)
        for row in rows:
            run = row.run
            row.run = lambda run=run, what=row.what: order.append(what) or run()
        return rows

    bench.kinds = recorded
    table = tmp_path / "table.md"
    argv = ["--model", str(checkpoint), "--repeats", "2", "--warm_ups", "0", "--precision", "32-true"]
    try:
        assert bench.main([*argv, "--threads", "1", "--output", str(table)]) == 0
    finally:
        bench.kinds = kinds
    out = capsys.readouterr().out
    assert out.startswith("CPU: ") and f"torch {torch.__version__}" in out.splitlines()[0]
    text = table.read_text(encoding="utf-8")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()[4:]}
    expected = ["import torch", "translate"] + ["serve, to its first answer"] * serve
    expected += ["translate, CTranslate2", "bare CTranslate2"] * ct2
    assert list(rows) == expected
    assert order == expected * 2  # in turns
    for what, cells in rows.items():
        assert len(cells) == len(bench.COLUMNS), what
        assert 0 < float(cells[3]) <= float(cells[2]), what  # best <= median
        assert float(cells[4]) > 0 and float(cells[5].rstrip(" |")) > 0, what
    assert rows["import torch"][4] == "1.00" and rows["bare CTranslate2"][5].rstrip(" |") == "1.00"
    assert f"attnx translate --model {checkpoint}" in rows["translate"][1]


def test_a_model_that_is_no_file_is_refused_before_anything_runs(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit:
        bench.main(["--model", str(tmp_path / "missing.ckpt")])
    assert exit.value.code == 2 and "is not a checkpoint file" in capsys.readouterr().err
