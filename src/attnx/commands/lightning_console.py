"""What the console shows of a Lightning command: attnx's progress bar where Lightning would draw its own,
and none of Lightning's tips, adverts and hardware lines."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path
from typing import Any

from attnx.training.progress import TrainingProgressBar


def with_progress_bar(trainer: dict[str, Any]) -> list[Any] | None:
    """The trainer's callbacks with attnx's [TrainingProgressBar][attnx.training.progress.TrainingProgressBar]
    added where Lightning would draw its Rich bar; None to leave them (no bar, one chosen, or no Rich)."""
    from lightning.pytorch.callbacks import ProgressBar

    callbacks = trainer.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if trainer.get("enable_progress_bar") is False or any(isinstance(c, ProgressBar) for c in callbacks):
        return None
    if importlib.util.find_spec("rich") is None:  # Lightning draws its tqdm bar, labelled "Epoch N"
        return None
    return [*callbacks, TrainingProgressBar()]


def quiet_third_parties() -> None:
    """Keep Lightning's tips, adverts and hardware lines off the console; real warnings stay."""
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
        "lightning.fabric.utilities.seed",
        "lightning.pytorch.trainer.connectors.signal_connector",  # "Received SIGTERM": attnx says what it does
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (
        "LightningCLI's args parameter is intended",  # attnx passes its own argv on
        ".*does not have many workers.*",  # token-budget batches are gathered in the main process by design
        ".*is not resumable.*",  # the DataModule restores its sampler itself
        ".*Consider setting `persistent_workers=True`.*",
        ".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*configure_optimizers` will be overridden by.*",  # --optimizer: attnx says what runs instead
        ".*Previous log files in this directory will be deleted.*",  # a resumed run's: attnx keeps them
    ):
        warnings.filterwarnings("ignore", message=message)


ATTNX_SOURCES = str(Path(__file__).resolve().parent.parent)
"""The folder of the attnx package: warnings raised from a file under it are attnx's own."""


def one_line_warnings() -> None:
    """attnx's own warnings as one line, ``UserWarning: message``, without the file, line and source line that
    Python prints for a warning (they point into attnx, not at anything the user wrote); others keep that form."""
    default = warnings.formatwarning
    if getattr(default, "attnx", False):
        return

    def formatwarning(message, category, filename, lineno, line=None) -> str:
        if str(filename).startswith(ATTNX_SOURCES):
            return f"{category.__name__}: {message}\n"
        return default(message, category, filename, lineno, line)

    formatwarning.attnx = True
    warnings.formatwarning = formatwarning
