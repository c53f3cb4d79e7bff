"""Does one command repeat on this machine? Runs it several times, one run beside a process that keeps a core
busy, and compares what each run printed: standard output (translations, batch plans) and the lines of standard
error that say what `auto` chose (`precision: ...`, `decoding in ...`).

    python bench/bench_repeat.py --runs 3 --busy 2 -- attnx translate --model m.ckpt --input test.en
    python bench/bench_repeat.py --fresh -- attnx translate --model export-ct2 --input test.en

`--fresh` starts from an empty file of kept choices (`ATTNX_CHOICES`, in a temporary folder), as a machine that
has measured nothing yet; without it the user's own file is used. The first run should be quiet: a probe beside
a busy process keeps nothing. Prints the CPU model, each run's choice lines and whether everything matched; exit
status 1 where a run differed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from attnx.inference.precision import cpu_model

CHOICE_PREFIXES = ("precision:", "decoding in ", "batches:")
"""Lines that say what a command chose to run in."""


@dataclass(frozen=True)
class Run:
    """What one run printed."""

    busy: bool
    seconds: float
    stdout_sha256: str
    choices: tuple[str, ...]
    returncode: int


def choice_lines(text: str) -> tuple[str, ...]:
    """The lines of `text` that say a choice, with where it was kept left out (it is the same file)."""
    lines = [line for line in text.splitlines() if line.startswith(CHOICE_PREFIXES)]
    return tuple(
        line.split("; measured ")[0].split("; kept in ")[0].split("; its probe ")[0] for line in lines
    )


def run_once(command: list[str], busy: bool, env: dict[str, str]) -> Run:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    return Run(
        busy,
        seconds,
        hashlib.sha256(done.stdout.encode()).hexdigest()[:16],
        choice_lines(done.stdout + "\n" + done.stderr),
        done.returncode,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="times to run the command (default 3)")
    parser.add_argument(
        "--busy", type=int, default=2, help="the run (1-based) beside a busy process; 0: none"
    )
    parser.add_argument("--fresh", action="store_true", help="start from an empty file of kept choices")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("give the command to repeat after --")
    if args.runs < 2:
        parser.error("--runs must be at least 2 to compare runs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    env.pop("ATTNX_INHERITED_CHOICES", None)
    with tempfile.TemporaryDirectory() as folder:
        if args.fresh:
            env["ATTNX_CHOICES"] = str(Path(folder) / "choices.json")
        runs = [run_once(args.command, i + 1 == args.busy, env) for i in range(args.runs)]
    print(f"{cpu_model()}, {os.cpu_count()} CPUs: {' '.join(args.command)}")
    for i, run in enumerate(runs, 1):
        beside = "beside a busy process" if run.busy else "quiet"
        print(
            f"run {i} ({beside}): exit {run.returncode}, {run.seconds:.1f} s, stdout sha256 {run.stdout_sha256}"
        )
        for line in run.choices:
            print(f"  {line}")
    same = all(
        (r.stdout_sha256, r.choices, r.returncode) == (runs[0].stdout_sha256, runs[0].choices, 0)
        for r in runs
    )
    print("every run printed the same output and choices" if same else "the runs differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
