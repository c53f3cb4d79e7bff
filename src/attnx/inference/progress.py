"""Progress of a long decoding job on standard error (`attnx translate`, `attnx test`): lines done, lines/s and,
when the total is known, the ETA.

On a terminal one line is redrawn at most once a second; elsewhere (a log file, a batch job) a line is
written every [`LOG_EVERY`][attnx.inference.progress.LOG_EVERY] seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

LOG_EVERY = 60.0
"""Seconds between progress lines when standard error is not a terminal."""


def duration(seconds: float) -> str:
    """`1:02:03`, `2:03`."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Progress:
    """Counts lines done and reports them on `stream`.

    Args:
        command: Names the line (`attnx translate`).
        total: Lines in all, when known (a regular file); the ETA needs it.
        done: Lines an earlier run already finished (not counted in the speed).
        stream: Where to write (standard error).
        live: Redraw one line in place (a terminal) rather than append a line every `LOG_EVERY` seconds.
        enabled: Report at all (not while a person types the input, for instance).
        clock: Seconds, monotonic.
        unit: What is counted (`lines`, `sentences`).
    """

    def __init__(
        self,
        command: str,
        total: int | None,
        stream: TextIO,
        *,
        done: int = 0,
        live: bool,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "lines",
    ) -> None:
        self.unit = unit
        self.command = command
        self.total = total
        self.stream = stream
        self.live = live
        self.enabled = enabled
        self.clock = clock
        self.start_done = self.done = done
        self.started = self.shown = clock()
        self.drawn = False

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = (self.done - self.start_done) / elapsed
        text = f"{self.command}: {self.done:,}"
        if self.total is not None:
            text += f"/{self.total:,} {self.unit} ({100 * self.done / max(self.total, 1):.1f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.1f} {self.unit}/s"
        if self.total is not None and rate > 0:
            text += f", ETA {duration((self.total - self.done) / rate)}"
        return text

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = self.clock()
        if now - self.shown < (1.0 if self.live else LOG_EVERY):
            return
        self.shown = now
        self.show()

    def show(self) -> None:
        if self.live:
            self.stream.write("\r\033[K" + self.line())
            self.drawn = True
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the redrawn line (so that what follows starts on its own)."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False

    def finish(self) -> None:
        """The last count: one line on a log (how many, how fast), the redrawn one cleared on a terminal."""
        if self.enabled and not self.live:
            self.show()
        self.close()
