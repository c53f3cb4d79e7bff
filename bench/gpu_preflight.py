"""``bash bench/gpu_session.sh --check``: what the GPU machine will lack, said on this machine before any device
time is spent, with the command that fixes each piece and the paths to carry.

The GPU machine (one H200) has Python 3.12 with torch, Lightning, sentencepiece, sacrebleu, torchmetrics,
pluggy and transformers, and no network. It lacks what attnx needs beyond them (``WHEELS``: installed by the
session from ``.gpu/wheels``), the prepared news corpus the benchmarks train on (``data/news``) and the
Multi30k files the GPU tests prepare their corpus from (``data/raw/multi30k``). The working tree is copied there;
paths git ignores (``data/`` is) arrive only when carried, 64 MiB in all.

    python bench/gpu_preflight.py [--root .]   # exit 0: ready; 1: something is missing (each piece said)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

WHEELS = ("jsonargparse", "docstring-parser", "typeshed-client", "py3langid", "sacremoses")
"""The packages attnx needs that the GPU machine lacks (jsonargparse with its `signatures` extra)."""

DEVICE_PYTHON = (3, 12)
WHEEL_DIR = Path(".gpu") / "wheels"
NEWS = Path("data") / "news"
MULTI30K = Path("data") / "raw" / "multi30k"
MULTI30K_FILES = [
    f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")
]
"""What the GPU tests' corpus is prepared from (tests/conftest.py)."""
NEWS_SPLITS = ("train", "valid", "newstest2014")
CARRY_LIMIT = 64 * 2**20


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installs_on_device(wheel: Path) -> bool:
    """Whether a wheel's tags fit CPython 3.12 on x86-64 Linux: pure Python, or built for cp312 / abi3."""
    parts = wheel.name[: -len(".whl")].split("-")
    if len(parts) < 5:
        return False
    python, abi, platform = parts[-3:]
    tag = f"{DEVICE_PYTHON[0]}{DEVICE_PYTHON[1]}"
    pythons = python.split(".")
    fits_python = "py3" in pythons or f"py{tag}" in pythons or f"cp{tag}" in pythons
    fits_abi = abi in ("none", "abi3", f"cp{tag}")
    fits_platform = platform == "any" or ("linux" in platform and "x86_64" in platform)
    return fits_python and fits_abi and fits_platform


def missing_wheels(root: Path) -> list[str]:
    have = {
        normalized(w.name.split("-")[0]) for w in (root / WHEEL_DIR).glob("*.whl") if installs_on_device(w)
    }
    return [name for name in WHEELS if normalized(name) not in have]


def pinned(name: str) -> str:
    """``name==version`` as installed here (what attnx is tested with), else the name alone."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def news_problem(root: Path) -> str | None:
    meta = root / NEWS / "meta.json"
    if not meta.is_file():
        return f"{NEWS} is not a prepared corpus (no meta.json)"
    import json

    splits = json.loads(meta.read_text()).get("splits", {})
    absent = [s for s in NEWS_SPLITS if s not in splits]
    return f"{NEWS} has no {', '.join(absent)} split" if absent else None


def ignored(root: Path, path: Path) -> bool:
    """Whether git ignores `path` in the tree at `root` (then it reaches the device only when carried)."""
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(path)], capture_output=True)
    return done.returncode == 0


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def check(root: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """The missing pieces, each `(what, the command that fixes it)`, and the paths to carry."""
    problems: list[tuple[str, str]] = []
    wheels = missing_wheels(root)
    for name in wheels:
        problems.append((f"wheel: {name} for Python 3.12 in {WHEEL_DIR}/", ""))
    if wheels:
        problems[-1] = (
            problems[-1][0],
            f"python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
            f"--platform manylinux2014_x86_64 -d {WHEEL_DIR} {' '.join(pinned(n) for n in wheels)}",
        )
    news = news_problem(root)
    if news:
        problems.append((f"data: {news}", f"python bench/gpu_data.py --out {NEWS}"))
    absent = [name for name in MULTI30K_FILES if not (root / MULTI30K / name).is_file()]
    if absent:
        problems.append(
            (
                f"data: {MULTI30K}/ lacks {', '.join(absent)} (the GPU tests' corpus)",
                f"mkdir -p {MULTI30K.parent} && cp -r raw/multi30k {MULTI30K}  # attnx download multi30k --output raw",
            )
        )
    if (root / "gpu_results").exists():
        problems.append(
            (
                "environment: gpu_results/ exists here and would travel; the session refuses to write over it",
                "mv gpu_results gpu_results.earlier",
            )  # fmt: skip
        )
    carry = [str(p) for p in (NEWS, MULTI30K, WHEEL_DIR) if ignored(root, p)]
    total = sum(size(root / p) for p in carry)
    if total > CARRY_LIMIT:
        problems.append(
            (
                f"environment: the paths to carry hold {total / 2**20:.0f} MiB, over the 64 MiB a run carries",
                "",
            )
        )
    return problems, carry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="the working tree copied to the device")
    args = parser.parse_args(argv)
    problems, carry = check(args.root)
    for what, fix in problems:
        print(f"missing: {what}")
        if fix:
            print(f"  fix:   {fix}")
    listed = ", ".join(f'"{p}"' for p in carry)
    print(f"carry: [{listed}]" if carry else "carry: nothing (every path needed travels with the tree)")
    if problems:
        print(
            f"not ready: {len(problems)} piece{'s' * (len(problems) != 1)} missing (the device has no network)"
        )
        return 1
    print("ready: run `bash bench/gpu_session.sh` on the device with the paths above carried")
    return 0


if __name__ == "__main__":
    sys.exit(main())
