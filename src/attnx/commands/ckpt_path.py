"""`--ckpt_path` before Lightning reads it: `last` resolved to the newest `last.ckpt` of the config's runs that
has not finished (else the newest), and `best` to the newest `best.ckpt` (`--best.metric`), each said in one line
with how to take another (with `--run_dir`/`--name`: that run's); the file checked in one line (a missing one
named with the newest run's file of that name; for `fit`, also that it holds a training state to resume), and
for `fit` the leftovers of checkpoint writes that were killed removed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import CheckpointError, read_checkpoint
from attnx.checkpoint.missing import AVERAGED, RUN_AVERAGED, missing_checkpoint
from attnx.errors import ConfigError
from attnx.files import remove_stale_temporaries
from attnx.training.resume import (
    checkpoint_directories,
    finished_run,
    last_checkpoint,
    last_checkpoints,
    run_checkpoints,
)
from attnx.training.run_dir import CHECKPOINTS, logger_groups

LIGHTNING_KEYWORDS = ("hpc", "registry")
"""`--ckpt_path` values Lightning resolves itself; `last` and `best` attnx resolves (Lightning's look for a
`ModelCheckpoint`, which attnx runs do not have: `last` would start from step 0, `best` ended in an
AttributeError)."""

RUN_KEYWORDS = ("last", "best")
"""`--ckpt_path` values attnx resolves among the config's runs."""

BEST = "best.ckpt"
"""The file [BestCheckpoint][attnx.training.best.BestCheckpoint] keeps beside a run's checkpoints."""


def checked_checkpoint(subcommand: str, ckpt_path: Any, trainer: Any, run_dir: Path | None = None) -> Any:
    """`ckpt_path` resolved (`last`, `best`: in `run_dir`'s checkpoints where the command chose the run's folder)
    and readable, before Lightning reads it; for `fit` also the leftovers of checkpoint writes that were killed
    are removed from this config's run directories."""
    if subcommand == "fit":
        directories = checkpoint_directories(trainer)
        if run_dir is not None:
            directories.append(run_dir / CHECKPOINTS)
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
    if run_dir is not None and ckpt_path in RUN_KEYWORDS:
        found = run_checkpoint(run_dir, ckpt_path)
        if rank_zero_only.rank == 0:
            print(
                f"attnx {subcommand}: --ckpt_path {ckpt_path} is {found} (the run in {run_dir})",
                file=sys.stderr,
            )
        ckpt_path = str(found)
    elif ckpt_path == "last":
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
    if not Path(ckpt_path).exists():  # named with this config's newest file of that name, where it has one
        raise CheckpointError(missing_checkpoint(ckpt_path, newest_run_file(trainer, Path(ckpt_path).name)))
    checkpoint = read_checkpoint(ckpt_path)  # an unreadable, damaged or foreign file: one line
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


def run_checkpoint(run_dir: Path, keyword: str) -> Path:
    """`--ckpt_path last` (or `best`) of the run in `run_dir` (`--run_dir`, `--name`), or a one-line error."""
    filename = "last.ckpt" if keyword == "last" else BEST
    path = run_dir / CHECKPOINTS / filename
    if path.is_file():
        return path
    advice = (
        "leave --ckpt_path out to start a run there"
        if keyword == "last"
        else "a run keeps one when trained with --best.metric bleu (or loss, ppl); pass a checkpoint's path"
    )
    raise CheckpointError(f"--ckpt_path {keyword}: {run_dir} holds no {CHECKPOINTS}/{filename}; {advice}")


def newest_run_file(trainer: Any, filename: str) -> Path | None:
    """The newest `filename` (`averaged.ckpt`, ...) among the checkpoints of this config's runs, if any."""
    found = [d / filename for d in checkpoint_directories(trainer) if (d / filename).is_file()]
    return max(found, key=lambda path: path.stat().st_mtime_ns) if found else None


def averaged_example(trainer: Any, run_dir: Path | None) -> str:
    """The `averaged.ckpt` a hint names: the run's (`--run_dir`), the newest of this config's runs, or the
    pattern of this config's run folders."""
    if run_dir is not None:
        return str(run_dir / CHECKPOINTS / AVERAGED)
    newest = newest_run_file(trainer, AVERAGED)
    if newest is not None:
        return f"{newest}, the newest run of this config"
    folders = list(logger_groups(trainer))
    return str(folders[0] / "version_N" / CHECKPOINTS / AVERAGED) if folders else RUN_AVERAGED
