"""Modules of src/attnx over the house limit of 400 lines: a module that long holds more than one job.

python .ci/module_sizes.py          # prints each one with its length; exit status 1 if there is one
"""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "attnx"
LIMIT = 400


def too_long() -> list[tuple[Path, int]]:
    """`(module, lines)` of every module over `LIMIT` lines, in path order."""
    sizes = (
        (path, len(path.read_text(encoding="utf-8").splitlines())) for path in sorted(SOURCE.rglob("*.py"))
    )
    return [(path, n) for path, n in sizes if n > LIMIT]


def main() -> int:
    found = too_long()
    for path, n in found:
        print(f"{path.relative_to(SOURCE.parents[1])}: {n} lines (limit {LIMIT}): split it along its jobs")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
