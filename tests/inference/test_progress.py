"""Progress lines: lines done, lines/s, an ETA when the total is known; redrawn on a terminal, logged otherwise."""

from __future__ import annotations

import io

from attnx.inference.progress import LOG_EVERY, Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_line_every_interval_with_speed_and_eta():
    stream, clock = io.StringIO(), Clock()
    progress = Progress("attnx translate", 1000, stream, done=100, live=False, clock=clock)
    clock.now = 10
    progress.update(200)
    assert stream.getvalue() == ""  # not yet a minute
    clock.now = LOG_EVERY
    progress.update(700)
    assert stream.getvalue() == "attnx translate: 700/1,000 lines (70.0%), 10.0 lines/s, ETA 0:30\n"


def test_a_terminal_line_is_redrawn_and_cleared_and_an_unknown_total_has_no_eta():
    stream, clock = io.StringIO(), Clock()
    progress = Progress("attnx translate", None, stream, live=True, clock=clock)
    clock.now = 2
    progress.update(50)
    assert stream.getvalue() == "\r\033[Kattnx translate: 50 lines, 25.0 lines/s"
    progress.close()
    assert stream.getvalue().endswith("\r\033[K")
    quiet = Progress("attnx translate", None, stream, live=True, enabled=False, clock=clock)
    clock.now = 10
    quiet.update(10)
    assert stream.getvalue().count("lines/s") == 1


def test_durations_read_as_clock_times():
    assert (duration(59), duration(61), duration(3723)) == ("0:59", "1:01", "1:02:03")


def test_finish_logs_the_last_count_and_a_terminal_line_is_cleared():
    stream, clock = io.StringIO(), Clock()
    progress = Progress("attnx test", 50, stream, live=False, clock=clock, unit="sentences")
    clock.now = 5
    progress.update(50)
    progress.finish()
    assert stream.getvalue() == "attnx test: 50/50 sentences (100.0%), 10.0 sentences/s, ETA 0:00\n"
