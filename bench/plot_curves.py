"""Training curves of one run as a PNG: loss, validation BLEU and learning rate from a CSVLogger metrics.csv.

    python bench/plot_curves.py runs/multi30k/version_0/metrics.csv --output docs/img/curves.png

Lightning's CSVLogger writes one row per logging call, with an empty cell for every metric not logged in that
call; each curve is drawn from the rows where its metric is present. Metrics logged both per step and per
epoch appear as ``NAME_step`` / ``NAME_epoch``; the per-step column is used. The x axis is the optimizer step,
or minutes of training with ``--x minutes`` when the run logged elapsed time (``--minutes_column``).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the non-interactive backend)

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("train/loss", "val/loss")),
    ("validation BLEU", ("val/bleu",)),
    ("learning rate", ("train/lr",)),
)
"""One panel per entry: its title and the metrics drawn in it."""


@dataclass
class Curve:
    name: str
    x: list[float]
    y: list[float]


def read_metrics(path: Path) -> list[dict[str, str]]:
    """Rows of a CSVLogger ``metrics.csv`` as dicts of strings (empty string: not logged in that row)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} has no rows; was the run logged with a CSVLogger?")
    return rows


def column(rows: list[dict[str, str]], metric: str) -> str | None:
    """The column holding ``metric``: its own name, else its per-step variant ``metric_step``."""
    for name in (metric, f"{metric}_step"):
        if name in rows[0]:
            return name
    return None


def curve(rows: list[dict[str, str]], metric: str, x_column: str, smooth: int = 1) -> Curve | None:
    """``metric`` over ``x_column``, rows where either is missing skipped; a trailing mean over ``smooth`` points."""
    name = column(rows, metric)
    if name is None:
        return None
    points = [
        (float(row[x_column]), float(row[name]))
        for row in rows
        if row.get(x_column, "") != "" and row.get(name, "") != ""
    ]
    points = [(x, y) for x, y in points if math.isfinite(y)]
    if not points:
        return None
    points.sort()
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    if smooth > 1:
        ys = [
            sum(ys[max(0, i - smooth + 1) : i + 1]) / (i - max(0, i - smooth + 1) + 1) for i in range(len(ys))
        ]
    return Curve(metric, xs, ys)


def plot(
    rows: list[dict[str, str]],
    output: Path,
    *,
    x: str = "step",
    minutes_column: str = "train/minutes",
    smooth: int = 1,
    title: str | None = None,
    dpi: int = 120,
) -> list[str]:
    """Draw every panel with at least one logged metric to ``output``; returns the metrics drawn."""
    x_column = "step" if x == "step" else column(rows, minutes_column)
    if x_column is None or x_column not in rows[0]:
        known = ", ".join(sorted(k for k in rows[0] if k))
        raise ValueError(f"no {minutes_column!r} column for --x minutes; the columns are: {known}")
    panels = []
    for panel_title, metrics in PANELS:
        curves = [
            c
            for m in metrics
            if (c := curve(rows, m, x_column, smooth if m.startswith("train/") and m != "train/lr" else 1))
        ]
        if curves:
            panels.append((panel_title, curves))
    if not panels:
        wanted = ", ".join(m for _, ms in PANELS for m in ms)
        raise ValueError(f"none of the metrics {wanted} is logged; the columns are: {', '.join(rows[0])}")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (panel_title, curves) in zip(axes[0], panels, strict=True):
        for c in curves:
            ax.plot(c.x, c.y, label=c.name, marker="o" if len(c.x) < 30 else None, markersize=3)
        ax.set_title(panel_title)
        ax.set_xlabel("optimizer step" if x == "step" else "minutes")
        ax.grid(alpha=0.3)
        if len(curves) > 1:
            ax.legend()
        if panel_title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
    return [c.name for _, curves in panels for c in curves]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/plot_curves.py",
        description="Render a Lightning CSVLogger metrics.csv (train/val loss, val BLEU, learning rate) to a PNG.",
    )
    parser.add_argument("metrics", type=Path, help="metrics.csv written by lightning's CSVLogger")
    parser.add_argument(
        "--output", type=Path, default=Path("curves.png"), help="PNG to write (default curves.png)"
    )
    parser.add_argument("--x", choices=("step", "minutes"), default="step", help="x axis (default step)")
    parser.add_argument(
        "--minutes_column",
        default="train/minutes",
        help="column of elapsed training minutes, for --x minutes (default train/minutes)",
    )
    parser.add_argument("--smooth", type=int, default=1, help="trailing mean over this many training points")
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--dpi", type=int, default=120, help="resolution (default 120)")
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        parser.error(f"{args.metrics} does not exist")
    try:
        drawn = plot(
            read_metrics(args.metrics),
            args.output,
            x=args.x,
            minutes_column=args.minutes_column,
            smooth=max(1, args.smooth),
            title=args.title,
            dpi=args.dpi,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({', '.join(drawn)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
