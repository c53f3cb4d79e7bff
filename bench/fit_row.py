"""The row of an ``attnx fit`` run for ``bench/gpu_session.sh``'s results: appended to ROWS as one JSON line.

    python bench/fit_row.py NAME RUN_DIR LOG ROWS

From the run folder's ``metrics.csv``: the optimizer steps done (as far as logged), the validations, and the median of the
logged training rates (``train/tokens_per_s``, ``train/tgt_tokens_per_s``, ``train/mfu``: the callback's
sliding window, validation left out) over the second half of the logged steps, where the captured shapes and
the first kernels are behind; from the log: the lines ``captured steps: ...`` and ``fused kernels: ...`` as
``attnx fit`` printed them (what was captured, what replayed, what ran eagerly).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

RATES = ("train/tokens_per_s", "train/tgt_tokens_per_s", "train/mfu")


def fit_row(name: str, run: Path, log: Path) -> dict[str, Any]:
    rows: list[dict[str, str]] = []
    if (run / "metrics.csv").is_file():
        with open(run / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows if r.get("step")]
    record: dict[str, Any] = {
        "table": "fit",
        "name": name,
        "run": str(run),
        "steps": max(steps) + 1 if steps else 0,
        "validations": sum(1 for r in rows if r.get("val/loss")),
        "val_loss": [float(r["val/loss"]) for r in rows if r.get("val/loss")],
    }
    for key in RATES:
        logged = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
        later = [v for step, v in logged if step >= (logged[-1][0] // 2 if logged else 0)]
        record[key.removeprefix("train/")] = statistics.median(later) if later else None
    text = log.read_text(errors="replace") if log.is_file() else ""
    record["lines"] = [
        line for line in text.splitlines() if line.startswith(("captured steps", "fused kernels"))
    ]
    return record


def main(argv: list[str]) -> int:
    name, run, log, rows = argv
    record = fit_row(name, Path(run), Path(log))
    with open(rows, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
