"""bench/plot_curves.py on a synthetic CSVLogger metrics.csv: rows with empty cells, as Lightning writes them."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.conftest import bench_script

plot_curves = bench_script("plot_curves")


def write_metrics(path: Path, *, minutes: bool = False) -> Path:
    """Training rows every step, a validation row every 10 steps, the way CSVLogger interleaves them."""
    fields = ["epoch", "step", "train/loss", "train/lr", "val/loss", "val/bleu"] + ["train/minutes"] * minutes
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        for step in range(1, 61):
            row = {"epoch": 0, "step": step, "train/loss": 9 * math.exp(-step / 20) + 2}
            row["train/lr"] = 512**-0.5 * min(step**-0.5, step * 20**-1.5)
            if minutes:
                row["train/minutes"] = step / 6
            writer.writerow(row)
            if step % 10 == 0:
                writer.writerow(
                    {
                        "epoch": 0,
                        "step": step,
                        "val/loss": 8 * math.exp(-step / 25) + 2.5,
                        "val/bleu": 30 * (1 - math.exp(-step / 30)),
                    }
                )
    return path


def test_renders_every_metric_to_a_png(tmp_path):
    rows = plot_curves.read_metrics(write_metrics(tmp_path / "metrics.csv"))
    out = tmp_path / "img" / "curves.png"
    drawn = plot_curves.plot(rows, out, smooth=5, title="synthetic")
    assert drawn == ["train/loss", "val/loss", "val/bleu", "train/lr"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curves_skip_rows_where_the_metric_is_empty(tmp_path):
    rows = plot_curves.read_metrics(write_metrics(tmp_path / "metrics.csv"))
    val = plot_curves.curve(rows, "val/bleu", "step")
    assert val.x == [10, 20, 30, 40, 50, 60]
    train = plot_curves.curve(rows, "train/loss", "step", smooth=3)
    assert len(train.x) == 60
    assert train.y[2] == pytest.approx(sum(9 * math.exp(-s / 20) + 2 for s in (1, 2, 3)) / 3)


def test_minutes_axis_needs_a_time_column(tmp_path, capsys):
    plain = write_metrics(tmp_path / "plain.csv")
    assert plot_curves.main([str(plain), "--x", "minutes", "--output", str(tmp_path / "a.png")]) == 2
    assert "no 'train/minutes' column" in capsys.readouterr().err
    timed = write_metrics(tmp_path / "timed.csv", minutes=True)
    assert plot_curves.main([str(timed), "--x", "minutes", "--output", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").is_file()


def test_a_csv_without_any_known_metric_is_an_error(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("epoch,step,something\n0,1,3.0\n")
    with pytest.raises(ValueError, match="none of the metrics"):
        plot_curves.plot(plot_curves.read_metrics(path), tmp_path / "x.png")
