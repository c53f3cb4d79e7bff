"""A run is a folder, across all its restarts.

`attnx fit` makes `runs/NAME/version_N` for a new run once it starts (or the folder `--run_dir`/`--name`
chooses, [attnx.training.run_dir][]); `--ckpt_path` resumes the run the checkpoint belongs to in that same
folder (NeMo's `resume_if_exists`): its loggers keep their version, the CSV and TensorBoard logs continue without
the steps after the checkpoint (the killed segment's, which the resumed run logs again), and the step
checkpoints keep accumulating under one `keep` rule, so `AverageCheckpoints` averages the last k of the whole
run.

A validation due at the very step where a stop signal saved is not run (stopping comes first, and Lightning's
loop does not go back to it on resume): the logs lack that one validation row.

Resuming from an older checkpoint than the run's newest abandons what came after it: its step checkpoints
are moved into `checkpoints/abandoned_after_step=N/` (never averaged) and said in one line.

Every segment records the config it ran with in its checkpoints; the next resume compares, applies what
may change in a run (dropout, label smoothing, the schedule, the optimizer's settings, the data, batch size,
max_steps/max_time, callbacks) with one line each (`resume: model.lr_factor 1.0 -> 0.5`), and refuses in one
line what would make another model (its architecture) or other random draws (`seed_everything`).
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import atomic_copy
from attnx.errors import ConfigError
from attnx.files import atomic_write
from attnx.model import TRAINING_ONLY
from attnx.training.run_dir import VERSION, checkpoint_run, logger_groups, remove_unstarted

STATE_KEY = "RunFolder"
"""The checkpoint's `callbacks` entry holding the run folder and the config each segment ran with."""

IGNORED = ("ckpt_path", "init_from", "config", "model.transformer.vocab_size", "run_dir", "name")
"""Config keys a resume never compares: the checkpoint itself, the config files' names (their values are
compared), the vocabulary size (linked from the data; a mismatch is refused when the weights load), and the
run's folder (`--run_dir`, `--name`: a resume continues in the checkpoint's)."""

FIXED = ("seed_everything",)
"""Keys outside the model that a run cannot change: the dropout masks and the batch order follow the seed."""

_STEP_FILE = re.compile(r"^step=(\d+)\.ckpt$")


class ResumeRefused(ConfigError):
    """A resume that would change what cannot change within a run; one line naming the option."""


@dataclass
class Resumed:
    """What a checkpoint says of the run it belongs to."""

    checkpoint: Path
    step: int
    log_dir: Path | None
    """The run folder its segment logged to (`runs/NAME/version_N`, or the `--run_dir` it was given), if
    known."""
    config: dict[str, Any] | None
    """The config its segment ran with (None for checkpoints written before attnx recorded it)."""
    model: dict[str, Any]
    """Its model hyperparameters."""
    trained_seconds: float = 0.0
    """The training time its run had used (Lightning's `Timer`, which counts `max_time`)."""


def resumed_run(path: str | Path, checkpoint: dict[str, Any]) -> Resumed:
    """Read a resumed checkpoint's step, run folder and config."""
    path = Path(path)
    state = (checkpoint.get("callbacks") or {}).get(STATE_KEY) or {}
    log_dir = Path(state["log_dir"]) if state.get("log_dir") else None
    if log_dir is None or not log_dir.is_dir():  # not recorded (an earlier attnx), or recorded from another
        log_dir = checkpoint_run(path) or log_dir  # working directory: the run the checkpoint lies in
    config = yaml.safe_load(state["config"]) if state.get("config") else None
    timer = (checkpoint.get("callbacks") or {}).get("Timer") or {}
    return Resumed(
        path,
        int(checkpoint.get("global_step", 0)),
        log_dir,
        config,
        checkpoint.get("hyper_parameters") or {},
        float((timer.get("time_elapsed") or {}).get("train", 0.0)),
    )


# ----------------------------------------------------------------------------------- the config's changes


def flatten(values: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}, "c": [{"d": 2}]}` → `{"a.b": 1, "c[0].d": 2}`."""
    if isinstance(values, dict):
        flat: dict[str, Any] = {}
        for key, value in values.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat or {prefix: {}}
    if isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
        flat = {}
        for i, value in enumerate(values):
            flat.update(flatten(value, f"{prefix}[{i}]"))
        return flat
    return {prefix: values}


def _ignored(key: str) -> bool:
    """Where the run logs is not how it trains (a run's own `config.yaml` records the folder its loggers were
    placed in, `--run_dir`): the folder a resume continues in is decided apart (`continued_version`)."""
    where = ("version", "purge_step", "save_dir", ".name")
    return (
        key in IGNORED
        or key == "trainer.default_root_dir"
        or (key.startswith("trainer.logger") and key.endswith(where))
    )


def config_changes(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """`(key, before, now)` for every config value that differs, in the order of `now`."""
    old, new = flatten(before), flatten(now)
    keys = list(new) + [k for k in old if k not in new]
    return [(k, old.get(k), new.get(k)) for k in keys if not _ignored(k) and old.get(k) != new.get(k)]


def changeable(key: str) -> bool:
    """Whether a run may change `key` when it resumes: all but its model's architecture and its seed."""
    if key in FIXED:
        return False
    if key.startswith("model.transformer."):
        return key.removeprefix("model.transformer.") in TRAINING_ONLY
    return True


def check_changes(changes: list[tuple[str, Any, Any]], checkpoint: Path) -> list[str]:
    """The `resume: KEY OLD -> NEW` lines of the changes a resume applies; the first one it cannot apply
    raises [ResumeRefused][attnx.training.runs.ResumeRefused]."""
    for key, old, new in changes:
        if not changeable(key):
            what = "the model's architecture" if key.startswith("model.") else "a run's random draws"
            raise ResumeRefused(
                f"--{key} {new!r} differs from {old!r} in {checkpoint}, and {what} cannot change when a run "
                f"resumes: pass --{key} {old!r} (or leave it out) to resume, or --init_from {checkpoint} "
                "instead of --ckpt_path to start a new run from its weights"
            )
    return [f"resume: {key} {old!r} -> {new!r}" for key, old, new in changes]


def model_changes(checkpoint_model: dict[str, Any], model: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Changes of the `model` section only, for a checkpoint that does not record its whole config."""
    checkpoint_model = {k: v for k, v in checkpoint_model.items() if not k.startswith("_")}  # Lightning's own
    return config_changes({"model": checkpoint_model}, {"model": model})


# -------------------------------------------------------------------------------------------- the folder


def continued_version(resumed: Resumed, trainer: Any) -> int | str | None:
    """The version of this config's loggers that the resumed checkpoint's run logged to, if it exists here: its
    `version_N`, or the folder the loggers were placed in (`--run_dir`) when it is the checkpoint's run."""
    if resumed.log_dir is None or not resumed.log_dir.is_dir():
        return None
    run = resumed.log_dir.resolve()
    placed = [args for members in logger_groups(trainer).values() for args in members]
    placed = [args for args in placed if isinstance(args.get("version"), str)]
    if placed:  # a folder chosen for this run: the checkpoint's run continues only there
        folder = Path(str(placed[0]["save_dir"])) / str(placed[0]["name"] or "") / placed[0]["version"]
        return placed[0]["version"] if folder.resolve() == run else None
    match = VERSION.match(resumed.log_dir.name)
    if match is None:
        return None
    parent = resumed.log_dir.parent.resolve()
    if any(folder.resolve() == parent for folder in logger_groups(trainer)):
        return int(match.group(1))
    return None


def pin_versions(trainer: Any, version: int | str | None, purge_step: int | None) -> None:
    """Give the loggers sharing a folder one version: `version`, or the next free one (a new run); for a
    continued run, TensorBoard hides the events from `purge_step` on (the steps the resumed run logs again)."""
    for folder, members in logger_groups(trainer).items():
        if version is None:
            if len(members) < 2 or any(args.get("version") is not None for args in members):
                continue
            new = CSVLogger(
                str(folder.parent), folder.name
            ).version  # the next free version_N; nothing is written
        for args in members:
            args["version"] = version if version is not None else new


def tensorboard_purge(trainer: Any, step: int) -> None:
    """`purge_step` for the TensorBoard loggers: events from `step` on, written by the segment that was
    stopped, are hidden (TensorBoard's own mechanism), so the resumed run's are the only ones at those steps."""
    loggers = trainer.get("logger") if hasattr(trainer, "get") else None
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if hasattr(logger, "get") and str(logger.get("class_path", "")).endswith("TensorBoardLogger"):
            logger["init_args"]["purge_step"] = step


def continue_metrics(logger: CSVLogger, step: int) -> int:
    """Keep the rows of `metrics.csv` before `step` (the resumed run logs the later ones again) and let
    Lightning's CSV writer append after them; returns how many rows were dropped.

    Lightning's writer deletes `metrics.csv` when it finds one in a non-empty folder, so the kept rows are first
    copied to `metrics.csv.resumed` and written back once the writer exists (a kill in between leaves that copy,
    which the next resume reads).
    """
    path = Path(logger.log_dir) / "metrics.csv"
    kept_copy = path.with_name("metrics.csv.resumed")
    source = path if path.is_file() else kept_copy
    if not source.is_file():
        return 0
    with open(source, newline="") as f:
        reader = csv.DictReader(f)
        keys, rows = list(reader.fieldnames or []), list(reader)
    kept = [row for row in rows if row.get("step", "").isdigit() and int(row["step"]) < step]
    _write_rows(kept_copy, keys, kept)
    path.unlink(missing_ok=True)
    writer = logger.experiment  # created now, with no metrics.csv to delete
    _write_rows(path, keys, kept)
    writer.metrics_keys = sorted(set(writer.metrics_keys) | set(keys))
    kept_copy.unlink()
    return len(rows) - len(kept)


def _write_rows(path: Path, keys: list[str], rows: list[dict[str, str]]) -> None:
    with atomic_write(path, what="log") as f:
        text = _csv_text(keys, rows)
        f.write(text.encode())


def _csv_text(keys: list[str], rows: list[dict[str, str]]) -> str:
    import io

    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def checkpoint_step(path: Path) -> int:
    """The optimizer step a checkpoint file was saved at (read without loading its tensors)."""
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step", -1))


def set_aside_later_checkpoints(directory: Path, step: int, resumed: Path) -> tuple[Path, list[str]] | None:
    """Move the step checkpoints after `step` (a branch this resume abandons) into
    `abandoned_after_step=STEP/`, with a `last.ckpt` among them; `last.ckpt` becomes the resumed checkpoint.
    Returns that folder and the moved names, or None when there was nothing after `step`."""
    later = sorted(
        (
            p
            for p in directory.glob("step=*.ckpt")
            if (m := _STEP_FILE.match(p.name)) and int(m.group(1)) > step
        ),
        key=lambda p: int(_STEP_FILE.match(p.name).group(1)),
    )
    last = directory / "last.ckpt"
    last_later = last.is_file() and last.resolve() != resumed.resolve() and checkpoint_step(last) > step
    if not later and not last_later:
        return None
    aside = directory / f"abandoned_after_step={step}"
    aside.mkdir(exist_ok=True)
    for path in later:
        os.replace(path, aside / path.name)
    if last_later:
        os.replace(last, aside / "last.ckpt")
        atomic_copy(resumed, last)
    return aside, [p.name for p in later]


class RunFolder(Callback):
    """Keeps one folder per run (added by `attnx fit`, and by `validate`, `test` and `predict`, which restore
    its entry of a checkpoint and do nothing else): records the run folder and the config in every
    checkpoint, continues a resumed run's logs, sets an abandoned branch's checkpoints aside, and removes the
    folder of a new run that stopped before its first training step."""

    def __init__(self, config: str, resumed: Resumed | None = None, continued: bool = False) -> None:
        self.config = config
        self.resumed = resumed
        self.continued = continued
        self._started = False
        self._log_dir: str | None = None

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def state_dict(self) -> dict[str, Any]:
        return {"log_dir": self._log_dir, "config": self.config}

    def before_fit(self, trainer: pl.Trainer) -> None:
        """Continue the resumed run's `metrics.csv`: before `Trainer.fit`, which opens the loggers' files first
        thing (Lightning's CSV writer would delete it)."""
        if self.continued and self.resumed is not None and rank_zero_only.rank == 0:
            for logger in trainer.loggers:
                if isinstance(logger, CSVLogger):
                    continue_metrics(logger, self.resumed.step)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._log_dir = trainer.log_dir

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Set an abandoned branch's checkpoints aside (once `PeriodicCheckpoint` knows its directory)."""
        if not self.continued or not trainer.is_global_zero or self.resumed is None:
            return
        step = self.resumed.step
        periodic = [c for c in trainer.callbacks if type(c).__name__ == "PeriodicCheckpoint"]
        directory = Path(periodic[0].dirpath) if periodic and periodic[0].dirpath else None
        if directory is not None and directory.is_dir():
            moved = set_aside_later_checkpoints(directory, step, self.resumed.checkpoint)
            if moved:
                aside, names = moved
                print(
                    f"resume: {self.resumed.checkpoint} is at step {step}, before this run's newest checkpoint; "
                    f"the later ones ({', '.join(names) or 'last.ckpt'}) are moved to {aside} and not averaged",
                    flush=True,
                )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = True
        if self.resumed is not None and trainer.is_global_zero:
            where = f"in {self._log_dir}" if self.continued else f"in a new run folder, {self._log_dir}"
            print(
                f"resumed at step {trainer.global_step} {where} (from {self.resumed.checkpoint})", flush=True
            )

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self._started or self.continued or self._log_dir is None or not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.finalize("failed")  # closes TensorBoard's file before it is removed
        remove_unstarted(Path(self._log_dir))
