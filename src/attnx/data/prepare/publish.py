"""Whose files are whose: what prepare owns in its output, its scratch directory, and moving a new corpus into
place.

Prepare writes every new file into a hidden scratch directory it creates inside the output
(`.attnx-prepare-XXXXXXXX`, marked as its own), moves them into place only when all are written, and lists them in
`meta.json` (`files`). It deletes only files listed there by an earlier run and its own scratch directories. It
refuses an output directory that holds anything else, or that holds one of the inputs, so it never deletes,
truncates or overwrites a file it did not write.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnx.data.corpus import ALIGNMENT, FORMAT_VERSION, META, SPM_MODEL
from attnx.data.errors import DataError
from attnx.data.prepare.interrupt import uninterrupted
from attnx.data.prepare.reports import is_report
from attnx.data.prepare.settings import TRAIN, Inputs
from attnx.files import make_scratch_directory, move_into_place, open_for_writing

SCRATCH_PREFIX = ".attnx-prepare-"
SCRATCH_MARK = "SCRATCH-OF-ATTNX-PREPARE"
"""The file that marks a scratch directory as prepare's own, so a run killed before removing it is cleaned up."""


def expected_files(meta: dict[str, Any]) -> list[str]:
    """The files of a complete corpus described by `meta` (without `meta.json` itself)."""
    files = [SPM_MODEL, Path(SPM_MODEL).with_suffix(".vocab").name]
    for name in meta["splits"]:
        for lang in (meta["src_lang"], meta["tgt_lang"]):
            files += [f"{name}.{lang}.bin", f"{name}.{lang}.idx.npy", f"{name}.{lang}.len.npy"]
            if name != TRAIN:
                files.append(f"{name}.{lang}")
        if meta["splits"][name].get("alignments"):
            files += [f"{name}{end}" for end in ALIGNMENT]
    return files


def owned_files(out: Path, meta: dict[str, Any] | None) -> set[str]:
    """Names in `out` that an earlier `attnx prepare` wrote: those `meta.json` lists (or, for a corpus of an
    attnx that did not list them, those its splits imply), `meta.json` itself and prepare's scratch directories."""
    names: set[str] = set()
    if meta is not None:
        names.add(META)
        if isinstance(meta.get("files"), list):
            names.update(f for f in meta["files"] if isinstance(f, str) and "/" not in f)
        elif isinstance(meta.get("splits"), dict) and {"src_lang", "tgt_lang"} <= meta.keys():
            names.update(expected_files(meta))
    if out.is_dir():
        for path in out.iterdir():
            if path.name.startswith(SCRATCH_PREFIX) and (path / SCRATCH_MARK).is_file():
                names.add(path.name)
    return names


def check_output(out: Path, inputs: Inputs, meta: dict[str, Any] | None) -> set[str]:
    """Refuse an output directory holding an input or a file prepare did not write; return what it did write."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--output {out} is a file, not a directory: pass a new directory as --output")
    root = out.resolve()
    for srcs, tgts in inputs.splits.values():
        for path in srcs + tgts:
            if path.resolve().is_relative_to(root):
                raise DataError(
                    f"--output {out} holds the input {path}: prepare writes there, so pass a directory apart from "
                    f"the raw text as --output (e.g. --output {out.name}-prepared beside it)"
                )
    if not out.is_dir():
        return set()
    owned = owned_files(out, meta)
    # a report of an earlier run (`--report OUT/report.md`) is prepare's too, and stays
    unknown = sorted(
        p.name + "/" * p.is_dir() for p in out.iterdir() if p.name not in owned and not is_report(p)
    )
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise DataError(
            f"--output {out} holds files attnx prepare did not write ({shown}); it never deletes or overwrites "
            "them: pass a new or empty directory as --output"
        )
    return owned


@contextlib.contextmanager
def scratch_directory(out: Path, owned: set[str]) -> Iterator[Path]:
    """A new scratch directory in `out` (created if need be), marked as prepare's, removed when the block ends;
    the scratch directories of a run killed before it could remove them go first. A block that fails leaves
    no directory it created: `out` (and the parents made for it) are removed again when they are empty."""
    created = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create --output {out}: {e.strerror or e}") from e
    # Ctrl-C and SIGTERM wait while a directory is half removed (its mark may go first, and the next run would
    # take it for the user's) and between creating the scratch directory and marking it as prepare's: each of
    # those ends in a state the next run understands
    work: Path | None = None
    done = False
    try:
        with uninterrupted():
            for name in owned:
                if name.startswith(SCRATCH_PREFIX):
                    shutil.rmtree(out / name, ignore_errors=True)
            work = make_scratch_directory(out, SCRATCH_PREFIX)
            with open_for_writing(work / SCRATCH_MARK, text=True) as f:
                f.write("attnx prepare writes here and moves its files into place when done\n")
        yield work
        done = True
    finally:
        if work is not None:
            with uninterrupted():
                shutil.rmtree(work, ignore_errors=True)
        for directory in created if not done else ():
            try:  # innermost first; one that holds anything stays, and so do its parents
                directory.rmdir()
            except OSError:
                break


def _write_meta(out: Path, work: Path, meta: dict[str, Any]) -> None:
    """Replace `out/meta.json` in one step (written in the scratch directory, then renamed)."""
    with open_for_writing(work / META, text=True) as f:
        f.write(json.dumps(meta, indent=2) + "\n")
    move_into_place(work / META, out / META)


def _publish(out: Path, work: Path, meta: dict[str, Any], owned: set[str], fresh: list[str]) -> None:
    """Move the new files into `out`, delete the earlier run's files this one no longer has, write the meta.

    While files move, `meta.json` says the corpus is incomplete and lists every file of both runs, so a run
    killed here is neither read as a corpus nor loses track of a file it wrote.
    """
    everything = sorted((owned - {META}) | set(meta["files"]))
    _write_meta(out, work, {"format_version": FORMAT_VERSION, "incomplete": True, "files": everything})
    for name in fresh:
        move_into_place(work / name, out / name)
    for name in owned - set(meta["files"]) - {META}:
        path = out / name
        if path.is_file() and not path.is_symlink() and not name.startswith(SCRATCH_PREFIX):
            path.unlink()
    _write_meta(out, work, meta)
