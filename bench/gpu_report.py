"""How ``bench_gpu.py`` reports its rows: the Markdown tables it prints, and the JSON records it appends to
``--rows`` one line at a time, as each row is measured, so that a run cut short keeps every row before the
cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_training import TrainResult
from harness import markdown_table


class Rows:
    """Where the records go: every one kept for ``--json``, and appended to ``--rows`` as it is measured."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, kind: str, record: dict[str, Any]) -> dict[str, Any]:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"table": kind, **record}, default=str) + "\n")
        return record


def padding_table(padding: list[dict[str, Any]], where: str) -> str:
    header = ["max_tokens", "batches", "pairs/batch", "padding (both sides)", "padding (target)", "budget used",
              "batches w/o source padding"]  # fmt: skip
    rows = [[r["max_tokens"], r["batches"], f"{r['pairs_per_batch']:.0f}", f"{r['padding']:.1%}",
             f"{r['padding_target']:.1%}", f"{r['budget_used']:.1%}", f"{r['batches_without_source_padding']:.0%}"]
            for r in padding]  # fmt: skip
    return f"## Padding of token-budget batches (training split, one epoch)\n{where}\n\n{markdown_table(header, rows)}\n"


TRAIN_HEADER = ["device", "model", "precision", "max_tokens × acc", "variant", "tokens/s (src+tgt)", "tgt tokens/s",
                "ms/step", "MFU", "peak mem GiB", "padding", "loss first → last"]  # fmt: skip


def train_row(result: TrainResult, peak: float, device_name: str) -> list[str]:
    cells = [
        device_name,
        result.model,
        result.precision,
        f"{result.max_tokens} × {result.accumulate}",
        result.variant,
    ]
    if result.error:
        return cells + [result.error] + [""] * (len(TRAIN_HEADER) - len(cells) - 1)
    r, t = result.timed.rates(peak), result.timed
    memory = "n/a (CPU)" if result.peak_memory_gib is None else f"{result.peak_memory_gib:.1f}"
    losses = f"{t.losses[0]:.2f} → {t.losses[-1]:.2f}" if t.losses else ""
    if result.graphs_compiled_while_timed:
        cells[4] += f" ({result.graphs_compiled_while_timed} graphs compiled while timed)"
    if result.capture_seconds is not None:
        cells[4] += f" ({result.capture_seconds:.1f} s capturing its shapes first)"
    return cells + [f"{r['tokens_per_s']:,.0f}", f"{r['target_tokens_per_s']:,.0f}", f"{r['ms_per_step']:,.0f}",
                    f"{r['mfu']:.1%}", memory, f"{r['padding']:.1%}", losses]  # fmt: skip
