"""bench/bench_repeat.py runs a command several times, one beside a busy process, and says whether every run
printed the same output and the same choices."""

from __future__ import annotations

import sys

from tests.conftest import bench_script

bench_repeat = bench_script("bench_repeat")


def test_runs_that_print_alike_repeat(capsys) -> None:
    code = (
        "import sys; print('Ein Hund.'); print('decoding in 32-true: CPU has no bf16 units', file=sys.stderr)"
    )
    assert bench_repeat.main(["--runs", "2", "--busy", "2", "--", sys.executable, "-c", code]) == 0
    out = capsys.readouterr().out
    assert (
        "run 2 (beside a busy process): exit 0" in out
        and "  decoding in 32-true: CPU has no bf16 units" in out
    )
    assert "every run printed the same output and choices" in out


def test_a_run_that_prints_otherwise_is_caught(capsys) -> None:
    code = "import random; print(random.random())"
    assert bench_repeat.main(["--runs", "2", "--busy", "0", "--fresh", "--", sys.executable, "-c", code]) == 1
    assert "the runs differ" in capsys.readouterr().out


def test_where_the_choice_was_kept_is_not_compared() -> None:
    first = "decoding in int8: the fastest here by a probe (float32 0.8x its speed); kept in /a/b for later commands"
    later = "decoding in int8: the fastest here by a probe (float32 0.8x its speed); measured 2026-12-02, kept in /a/b"
    assert bench_repeat.choice_lines(first) == bench_repeat.choice_lines(later)
