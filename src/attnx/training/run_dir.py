"""Where a run's files go: the folder `--run_dir DIR` (or `--name NAME`) chooses, else the config's loggers' next
`<save_dir>/<name>/version_N`; and where `validate`, `test` and `predict` of a checkpoint write: inside the run
the checkpoint lies in (`RUN/test/<checkpoint name>/`), or beside a checkpoint of no run (`m.ckpt` → `m.test/`).

Every logger of the config writes into that one folder (CSV and TensorBoard share it), and so do the
checkpoints (`checkpoints/`), `config.yaml` and `hparams.yaml`. [attnx.training.runs][] keeps a run in its
folder across restarts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from attnx.errors import ConfigError

OWN_FILES = ("config.yaml", "hparams.yaml", "metrics.csv")
"""What a run writes in its folder before its first step, besides TensorBoard's `events.out.tfevents.*`."""

CHECKPOINTS = "checkpoints"
"""The folder of a run's checkpoints, inside the run's folder."""

VERSION = re.compile(r"^version_(\d+)$")
"""The name of a run folder the loggers numbered."""


def run_files(folder: Path) -> list[Path]:
    """What of a run `folder` holds: its own files, TensorBoard events, `checkpoints/` (nothing else counts)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.name in (*OWN_FILES, CHECKPOINTS) or p.name.startswith("events.out.tfevents.")
    )


def checkpoint_run(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint lies in, `RUN/checkpoints/FILE` with RUN named `version_N` or holding a
    run's logs or configs; None for a checkpoint outside any run (a loose `m.ckpt`)."""
    folder = checkpoint.parent
    if folder.name != CHECKPOINTS:
        return None
    run = folder.parent
    logs = [p for p in run_files(run) if p.name != CHECKPOINTS]
    return run if VERSION.match(run.resolve().name) or logs else None


def logger_groups(trainer: Any) -> dict[Path, list[dict[str, Any]]]:
    """The `init_args` of the trainer config's loggers, grouped by their `save_dir/name` folder (an empty or
    null name is no folder, as Lightning reads it)."""
    loggers = trainer.get("logger") if hasattr(trainer, "get") else None
    loggers = loggers if isinstance(loggers, list) else [loggers]
    groups: dict[Path, list[dict[str, Any]]] = {}
    for logger in loggers:
        args = logger.get("init_args") if hasattr(logger, "get") else None
        if args is None or "save_dir" not in args:
            continue
        name = args.get("name", "lightning_logs") or ""
        groups.setdefault(Path(str(args["save_dir"])) / str(name), []).append(args)
    return groups


def place_loggers(trainer: Any, folder: Path) -> None:
    """Point every logger of the trainer config at `folder` itself (`save_dir` its parent, no name, `version` its
    name: no `version_N`), and `default_root_dir` too (where a config without loggers writes)."""
    parent = "" if folder.parent == Path(".") else str(folder.parent)  # `runs/x`, and `x` rather than `./x`
    for members in logger_groups(trainer).values():
        for args in members:
            args["save_dir"], args["name"], args["version"] = parent, "", folder.name
    trainer["default_root_dir"] = str(folder)


def chosen_folder(run_dir: str | None, name: str | None, trainer: Any) -> Path | None:
    """The folder `--run_dir DIR` or `--name NAME` (`<the loggers' save_dir>/NAME`) chooses, or None; one line
    for both given, an empty one, or a NAME that the loggers give no one save_dir to."""
    if run_dir is not None and name is not None:
        raise ConfigError(
            f"--run_dir {run_dir} and --name {name} both given: --name NAME is short for --run_dir "
            "<the loggers' save_dir>/NAME; pass one of them"
        )
    if run_dir is None and name is None:
        return None
    option, value = ("--run_dir", run_dir) if run_dir is not None else ("--name", name)
    if not str(value).strip() or Path(str(value)).name in (
        "",
        "..",
    ):  # `.`, `/`, `x/..`: no folder of its own
        raise ConfigError(f"{option} needs a folder of the run's own (e.g. runs/NAME), got {value!r}")
    if run_dir is not None:
        return Path(run_dir)
    save_dirs = list(
        dict.fromkeys(str(args["save_dir"]) for m in logger_groups(trainer).values() for args in m)
    )
    if len(save_dirs) != 1:
        where = f"write under {' and '.join(save_dirs)}" if save_dirs else "name no save_dir (trainer.logger)"
        raise ConfigError(
            f"--name {name}: the config's loggers {where}, so NAME names no one folder; pass --run_dir DIR"
        )
    return Path(save_dirs[0]) / str(name)


def refuse_taken(folder: Path, option: str, resumes_it: bool) -> None:
    """A folder that holds a run already is never written over: one line saying how to resume it or to choose
    another, unless this command resumes a checkpoint of that very run (`resumes_it`)."""
    found = run_files(folder)
    if found and not resumes_it:
        names = [f"{p.name}/" if p.is_dir() else p.name for p in found if not p.name.startswith("events.")]
        names += ["TensorBoard events"] * any(p.name.startswith("events.") for p in found)
        raise ConfigError(
            f"{option}: {folder} already holds a run ({', '.join(names)}); resume it with "
            f"--ckpt_path {folder / CHECKPOINTS / 'last.ckpt'}, or choose another folder"
        )


def has_loggers(trainer: Any) -> bool:
    """Whether the trainer config names its loggers (`trainer.logger`: a list of them), or logs none (`false`):
    then its run's folder can be placed; Lightning's default logger (`null`, `true`) numbers its own."""
    return bool(logger_groups(trainer)) or trainer.get("logger") is False


def evaluation_folder(checkpoint: Path, trainer: Any, subcommand: str) -> tuple[Path, Path | None]:
    """`validate`, `test` and `predict` of `checkpoint` log into the run it lies in,
    `RUN/<subcommand>/<checkpoint name>` (a test of `averaged.ckpt` and one of `last.ckpt` keep their
    translations apart), whatever the config's loggers are named; a checkpoint of no run into a folder beside
    it, `m.ckpt` → `m.test/`. Points the config's loggers there; returns that folder and the run (or None)."""
    run = checkpoint_run(checkpoint)
    if run is not None:
        folder = run / subcommand / checkpoint.stem
    else:
        folder = checkpoint.with_name(f"{checkpoint.stem}.{subcommand}")
    place_loggers(trainer, folder)
    return folder, run


def remove_unstarted(folder: Path) -> bool:
    """Remove a new run's folder that never trained, if it holds only what the run wrote before its first
    step (never anything else); returns whether it did."""
    if not folder.is_dir():
        return False
    entries = list(folder.iterdir())
    own = [
        p
        for p in entries
        if (p.is_file() and (p.name in OWN_FILES or p.name.startswith("events.out.tfevents.")))
        or (p.is_dir() and p.name == CHECKPOINTS and not any(p.iterdir()))
    ]
    if len(own) != len(entries):
        return False
    for path in own:
        path.rmdir() if path.is_dir() else path.unlink()
    folder.rmdir()
    return True
