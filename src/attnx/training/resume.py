"""Where a run starts from: the newest `last.ckpt` of a config's runs (`--ckpt_path last`), the folder a
resumed run continues in, and the weights a new run starts from (`--init_from`).

[attnx.training.runs][] says what a run folder is; `attnx fit` ([attnx.commands.lightning_cli][]) calls these
before training begins.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import CheckpointError, check_tokenizer, config_difference, model_state, read_checkpoint
from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError
from attnx.model import architecture
from attnx.training.checkpointing import PeriodicCheckpoint
from attnx.training.module import TranslationTask
from attnx.training.runs import (
    Resumed,
    check_changes,
    config_changes,
    continued_version,
    logger_groups,
    model_changes,
    pin_versions,
    resumed_run,
    tensorboard_purge,
)


def _get(values: Any, key: str, default: Any = None) -> Any:
    return values.get(key, default) if hasattr(values, "get") else default


def checkpoint_directories(trainer: Any) -> list[Path]:
    """The directories where this config's runs keep their checkpoints, existing ones only: the
    `PeriodicCheckpoint` `dirpath` if the config sets one, else `checkpoints/` in every `version_N`
    of its loggers' `save_dir/name` (and of `default_root_dir`)."""
    callbacks = _get(trainer, "callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        if str(_get(callback, "class_path", "")).endswith(PeriodicCheckpoint.__name__):
            dirpath = _get(_get(callback, "init_args"), "dirpath")
            if dirpath:
                return [Path(dirpath)] if Path(dirpath).is_dir() else []
    root = Path(_get(trainer, "default_root_dir") or ".")
    parents = [root, root / "lightning_logs"]
    loggers = _get(trainer, "logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = _get(logger, "init_args")
        if _get(args, "save_dir") is not None:
            parents.append(Path(_get(args, "save_dir")) / str(_get(args, "name") or "lightning_logs"))
    found = [root / "checkpoints"]
    for parent in dict.fromkeys(parents):
        found += parent.glob("version_*/checkpoints")
    return [d for d in dict.fromkeys(found) if d.is_dir()]


def run_checkpoints(trainer: Any, keyword: str, filename: str, advice: str) -> list[Path]:
    """The `filename` of each of this config's runs, newest first, or a one-line error for `--ckpt_path
    keyword` naming where it looked, then `advice`."""
    directories = checkpoint_directories(trainer)
    found = [d / filename for d in directories if (d / filename).is_file()]
    if not found:
        where = ", ".join(str(d) for d in directories) or "no run directory of this config exists here"
        raise CheckpointError(
            f"--ckpt_path {keyword}: no {filename} in this config's runs ({where}); {advice}"
        )
    return sorted(found, key=lambda path: path.stat().st_mtime_ns, reverse=True)


def last_checkpoints(trainer: Any) -> list[Path]:
    """The `last.ckpt` of each of this config's runs, newest first, or a one-line error where there is none."""
    return run_checkpoints(
        trainer,
        "last",
        "last.ckpt",
        "pass the checkpoint's path, or leave --ckpt_path out to start a new run",
    )


def last_checkpoint(trainer: Any) -> Path:
    """`--ckpt_path last`: the newest `last.ckpt` of this config's runs that has not finished (a run stopped
    halfway, not a finished smoke test that came after it), else the newest; or a one-line error."""
    found = last_checkpoints(trainer)
    return next((path for path in found if finished_run(path) is None), found[0])


def finished_run(path: Path) -> str | None:
    """Why the run whose `last.ckpt` is `path` has finished (it reached the `max_steps` or `max_time` it ran
    with), or None: not finished, or not known (a checkpoint that does not record its config)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not readable here: the resume itself says why, in one line
        return None
    resumed = resumed_run(path, checkpoint)
    trainer = _get(resumed.config, "trainer") or {}
    max_steps = _get(trainer, "max_steps") or -1
    if max_steps > 0 and resumed.step >= max_steps:
        return f"finished at step {resumed.step} of max_steps {max_steps}"
    seconds = max_time_seconds(_get(trainer, "max_time"))
    if seconds and resumed.trained_seconds >= seconds:
        return f"finished its max_time at step {resumed.step}"
    return None


def max_time_seconds(max_time: Any) -> float | None:
    """`trainer.max_time` as a config records it (`"DD:HH:MM:SS"` or `{"hours": 1, ...}`) in seconds."""
    if isinstance(max_time, str) and max_time.count(":") == 3:
        days, hours, minutes, seconds = (float(part) for part in max_time.split(":"))
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
    if isinstance(max_time, dict):
        return timedelta(**{k: float(v) for k, v in max_time.items()}).total_seconds()
    return None


def continue_run(trainer: Any, resumed: Resumed | None, typed: dict[str, Any]) -> bool:
    """Choose the run folder of `attnx fit` and pin the loggers' versions to it: the resumed run's, or a new
    one. The options changed since the resumed checkpoint (`typed`: the whole config, as parsed) are applied,
    one line each, or refused ([ResumeRefused][attnx.training.runs.ResumeRefused]). Returns whether an existing
    run continues."""
    speak = rank_zero_only.rank == 0
    if resumed is None:
        pin_versions(trainer, None, None)
        return False
    if resumed.config is not None:
        changes = config_changes(resumed.config, typed)
    else:
        changes = model_changes(resumed.model, typed["model"])
    lines = check_changes(changes, resumed.checkpoint)
    version = continued_version(resumed, trainer)
    if speak:
        for line in lines:
            print(line, flush=True)
    if version is None:
        pin_versions(trainer, None, None)
        if speak and (groups := logger_groups(trainer)):
            places = dict.fromkeys(  # a folder --run_dir/--name chose has its version set, not numbered
                str(folder / run_version(args.get("version")))
                for folder, members in groups.items()
                for args in members
            )
            own = f"its own run's folder, {resumed.log_dir}," if resumed.log_dir else "its own run's folder"
            print(
                f"resume: {resumed.checkpoint} continues in a new run folder, {', '.join(places)}: {own} is not "
                "where this command logs",
                flush=True,
            )
        return False
    pin_versions(trainer, version, resumed.step)
    tensorboard_purge(trainer, resumed.step)
    return True


def run_version(version: Any) -> str:
    """A logger's `version` as the folder it names: `version_3` for 3, a chosen folder's name as it is."""
    if isinstance(version, str):
        return version
    return f"version_{version}" if version is not None else "version_N"


def check_init_from(path: str, transformer: dict[str, Any]) -> None:
    """`--init_from`: a readable checkpoint whose architecture is the config's, or one line."""
    theirs = read_checkpoint(path)["attnx"]["transformer"]
    ours = {
        k: v for k, v in transformer.items() if k != "vocab_size"
    }  # linked from the data: checked on load
    theirs_arch = {k: v for k, v in architecture(theirs).items() if k != "vocab_size"}
    if theirs_arch != architecture(ours):
        diff = config_difference(theirs_arch, architecture(ours), "checkpoint", "config")
        raise ConfigError(
            f"--init_from {path} holds another model than the config describes ({diff}); set the config's "
            "model.transformer to the checkpoint's"
        )


def load_initial_weights(task: TranslationTask, path: str, tokenizer: Tokenizer) -> None:
    """Copy a checkpoint's weights into the model about to train. The checkpoint must have been trained with the
    data's SentencePiece model, `tokenizer` ([`check_tokenizer`][attnx.checkpoint.format.check_tokenizer], the
    check of `--ckpt_path`): another model's ids would mean other pieces."""
    checkpoint = read_checkpoint(path)
    check_tokenizer(checkpoint, path, tokenizer)
    theirs, ours = checkpoint["attnx"]["transformer"]["vocab_size"], task.config.vocab_size
    if theirs != ours:
        raise ConfigError(
            f"--init_from {path} has a vocabulary of {theirs} pieces, the data {ours}: fine-tune on data prepared "
            "with the checkpoint's SentencePiece model"
        )
    task.model.load_state_dict(model_state(checkpoint))
    if rank_zero_only.rank == 0:
        print(
            f"init_from: the weights of {path} (step {checkpoint.get('global_step', '?')}); a new run, with a "
            "fresh optimizer, schedule and step count",
            flush=True,
        )
