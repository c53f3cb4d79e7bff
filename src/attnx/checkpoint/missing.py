"""What to say when a checkpoint that a run should hold is not there.

`attnx fit` writes `averaged.ckpt` only when a run ends (its averaging callback): a run stopped on the way has
`last.ckpt` and its step checkpoints, but no `averaged.ckpt`. A missing file named so, or one inside a run's
`checkpoints` folder, is answered with what that folder holds and how to get the file asked for.
"""

from __future__ import annotations

from pathlib import Path

AVERAGED = "averaged.ckpt"
"""The file name `attnx fit` gives the average of a run's last checkpoints."""

RUN_AVERAGED = f"runs/NAME/version_N/checkpoints/{AVERAGED}"
"""Where a run keeps its `averaged.ckpt`, as a pattern (`--run_dir DIR`: `DIR/checkpoints/averaged.ckpt`)."""

SHOWN = 4
"""Checkpoints named in the message at most (the newest)."""


def folder_not_checkpoint(path: Path) -> str:
    """The one line for a folder given where a checkpoint file is expected: the `.ckpt` files it holds (or its
    runs' `checkpoints/` folders hold), newest first."""
    found = sorted(
        [
            *path.glob("*.ckpt"),
            *path.glob("checkpoints/*.ckpt"),
            *path.glob("*/checkpoints/*.ckpt"),  # runs/NAME, a --run_dir of runs/
            *path.glob("*/version_*/checkpoints/*.ckpt"),  # runs/
        ],
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    message = f"checkpoint {path} is a folder: pass a checkpoint file (.ckpt, written by attnx fit or attnx average)"
    if not found:
        return f"{message}; this folder holds none"
    names = ", ".join(str(p) for p in found[:SHOWN]) + (
        f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    )
    return f"{message}, e.g. {names}"


def missing_checkpoint(path: str | Path, newest: Path | None = None) -> str:
    """The one line for checkpoint `path`, which does not exist (or is a folder): for an `averaged.ckpt` or a file of a run's
    `checkpoints` folder, also what the folder holds and the command that makes an averaged checkpoint. `newest`:
    the newest file of that name among the runs of the command's config (where it has one), named instead for a
    path outside any run's `checkpoints` folder."""
    path = Path(path)
    if path.is_dir():
        return folder_not_checkpoint(path)
    message = f"checkpoint {path} does not exist"
    folder = path.parent
    in_run = folder.name == "checkpoints"
    if newest is not None and not in_run:
        return f"{message}; the newest run of this config has {newest}"
    if path.name != AVERAGED and not in_run:
        return message
    written = f"attnx fit writes {path if in_run else RUN_AVERAGED} when a run ends"
    if not folder.is_dir():
        return f"{message}, nor does the folder {folder}" + ("" if in_run else f" ({written})")
    found = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not found:
        if not in_run:
            return f"{message}; {folder} holds no checkpoint ({written})"
        return f"{message}; {folder} holds no checkpoint (a run writes them every few minutes of training)"
    names = ", ".join(p.name for p in found[:SHOWN]) + (
        f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    )
    steps = [p for p in found if p.name not in ("last.ckpt", AVERAGED)]
    average = f"attnx average --dir {folder} --last 5 --output {folder / AVERAGED}"
    if path.name == AVERAGED:
        made = f"{written}; for a run that was stopped, " + (
            f"make it with `{average}`" if steps else "there are no step checkpoints to average"
        )
        last = folder / "last.ckpt"
        use = f", or use {last}" if last.is_file() else ""
        return f"{message}; {folder} holds {names}: {made}{use}"
    return f"{message}; {folder} holds {names}: use one of those" + (
        f", or average the newest with `{average}`" if steps else ""
    )
