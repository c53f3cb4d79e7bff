"""`--ckpt_path` before Lightning reads it: `last` resolved to the newest `last.ckpt` of the config's runs that
has not finished (else the newest), and `best` to the newest `best.ckpt` (`--best.metric`), each said in one line
with how to take another; the file checked in one line (for `fit`, also that it holds a training state to
resume), and for `fit` the leftovers of checkpoint writes that were killed removed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import read_checkpoint
from attnx.errors import ConfigError
from attnx.files import remove_stale_temporaries
from attnx.training.resume import (
    checkpoint_directories,
    finished_run,
    last_checkpoint,
    last_checkpoints,
    run_checkpoints,
)

LIGHTNING_KEYWORDS = ("hpc", "registry")
"""`--ckpt_path` values Lightning resolves itself; `last` and `best` attnx resolves (Lightning's look for a
`ModelCheckpoint`, which attnx runs do not have: `last` would start from step 0, `best` ended in an
AttributeError)."""

RUN_KEYWORDS = ("last", "best")
"""`--ckpt_path` values attnx resolves among the config's runs."""

BEST = "best.ckpt"
"""The file [BestCheckpoint][attnx.training.best.BestCheckpoint] keeps beside a run's checkpoints."""


def checked_checkpoint(subcommand: str, ckpt_path: Any, trainer: Any) -> Any:
    """`ckpt_path` resolved (`last`) and readable, before Lightning reads it; for `fit` also the
    leftovers of checkpoint writes that were killed are removed from this config's run directories."""
    if subcommand == "fit":
        directories = checkpoint_directories(trainer)
        if ckpt_path and ckpt_path not in (*RUN_KEYWORDS, *LIGHTNING_KEYWORDS):
            directories.append(Path(ckpt_path).parent)
        for directory in dict.fromkeys(directories):
            for path in remove_stale_temporaries(directory):
                print(
                    f"attnx {subcommand}: removed {path}, left by a checkpoint write that was killed",
                    file=sys.stderr,
                )
    if not ckpt_path or ckpt_path in LIGHTNING_KEYWORDS:
        return ckpt_path
    if ckpt_path == "last":
        ckpt_path = str(last_checkpoint(trainer))
        if rank_zero_only.rank == 0:  # every rank resolves it; one says so, and how to take another
            why = last_choice(trainer, Path(ckpt_path))
            print(f"attnx {subcommand}: --ckpt_path last is {ckpt_path} ({why})", file=sys.stderr)
    elif ckpt_path == "best":
        found = best_checkpoints(trainer)
        ckpt_path = str(found[0])
        if rank_zero_only.rank == 0:
            print(
                f"attnx {subcommand}: --ckpt_path best is {ckpt_path} ({best_choice(found)})", file=sys.stderr
            )
    checkpoint = read_checkpoint(ckpt_path)  # a missing, unreadable, damaged or foreign file: one line
    if subcommand == "fit" and "optimizer_states" not in checkpoint:
        what = "an averaged checkpoint" if "averaged_from" in checkpoint else "a checkpoint of weights only"
        raise ConfigError(
            f"--ckpt_path {ckpt_path} is {what}: it holds weights only, no optimizer state, schedule or step to "
            f"resume; use --init_from {ckpt_path} to fine-tune from it, or --ckpt_path last to resume the run"
        )
    return ckpt_path


def last_choice(trainer: Any, chosen: Path) -> str:
    """Why `--ckpt_path last` took `chosen`, and how to take another run's checkpoint."""
    found = last_checkpoints(trainer)
    if len(found) == 1:
        finished = finished_run(chosen)
        return f"this config's only run, {finished}" if finished else "this config's only run"
    newer = found[: found.index(chosen)]
    if (
        newer
    ):  # an older run stopped halfway, over newer ones that ended: there is nothing left to resume in those
        why = "; ".join(f"{path.parent.parent.name} {finished_run(path)}" for path in newer)
        run = "newer run" if len(newer) == 1 else f"{len(newer)} newer runs"
        text = f"{chosen.parent.parent.name}, which has not finished, over the {run} of this config, finished: {why}"
    else:
        text = f"the newest of this config's {len(found)} runs"
        if finished_run(chosen):
            text += ", all finished"
    other = chosen.parent.parent.parent / "version_N" / "checkpoints" / "last.ckpt"
    return f"{text}; another: --ckpt_path {other}"


def best_checkpoints(trainer: Any) -> list[Path]:
    """The `best.ckpt` of each of this config's runs, newest first, or a one-line error saying how to get one."""
    advice = (
        "a run keeps one when trained with --best.metric bleu (or loss, ppl). Pass a checkpoint's path, or "
        "--ckpt_path last"
    )
    return run_checkpoints(trainer, "best", BEST, advice)


def best_choice(found: list[Path]) -> str:
    """Which run's `best.ckpt` `--ckpt_path best` took (the newest, `found[0]`), and how to take another."""
    if len(found) == 1:
        return "this config's only run with one"
    other = found[0].parent.parent.parent / "version_N" / "checkpoints" / BEST
    return f"the newest of this config's {len(found)} runs' {BEST}; another: --ckpt_path {other}"
