"""Modules of src/attnx without their mirrored test file: `src/attnx/X/Y.py` is tested in `tests/X/test_Y.py`,
a top-level `src/attnx/Y.py` in `tests/test_Y.py`; `__init__.py` and `__main__.py` need none.

    python .ci/mirrored_tests.py        # prints each missing test file; exit status 1 if one is missing
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "attnx"
TESTS = ROOT / "tests"
EXEMPT = {"__init__.py", "__main__.py"}


def mirrored(module: Path) -> Path:
    """The test file of `module`, a path under src/attnx."""
    relative = module.relative_to(SOURCE)
    return TESTS / relative.parent / f"test_{relative.name}"


def missing() -> list[tuple[Path, Path]]:
    """`(module, test file)` of every module whose test file does not exist, in path order."""
    modules = sorted(p for p in SOURCE.rglob("*.py") if p.name not in EXEMPT)
    return [(m, mirrored(m)) for m in modules if not mirrored(m).is_file()]


def main() -> int:
    gaps = missing()
    for module, test in gaps:
        print(f"{test.relative_to(ROOT)}  (for {module.relative_to(ROOT)})")
    print(f"{len(gaps)} module(s) without their mirrored test file")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
