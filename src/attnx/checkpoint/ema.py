"""Which weights a checkpoint of a run with an exponential moving average (EMA) of its weights holds.

A run with `--ema.decay` ([`WeightEMA`][attnx.training.ema.WeightEMA]) writes the EMA weights as the
checkpoint's model weights (`state_dict`), so that averaging, export, serving and decoding take them like any
other weights, as Marian's `--exponential-smoothing` does with `model.npz`. What the run needs to resume lives
beside them under [`EMA_KEY`][attnx.checkpoint.ema.EMA_KEY]: the decay, the number of updates and the weights
the optimizer trains (`training`, by parameter name).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

EMA_KEY = "attnx_ema"
"""The checkpoint entry of a run with an EMA: `{"decay", "every", "start", "updates", "training"}`."""

_read: dict[tuple[int, ...], dict[str, Any]] = {}
"""What [`weights_line`][attnx.checkpoint.ema.weights_line] needs of each file this process has read whole, by the
file's identity (device, inode, size and times): the line is said without reading the file a second time."""


def _identity(path: str | Path) -> tuple[int, ...]:
    stat = os.stat(path)
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def note_read(path: str | Path, checkpoint: dict[str, Any]) -> None:
    """Keep what [`weights_line`][attnx.checkpoint.ema.weights_line] says of `checkpoint`, just read from
    `path` (by [`read_checkpoint`][attnx.checkpoint.format.read_checkpoint]), without its tensors."""
    state = ema_state(checkpoint)
    kept = {k: v for k, v in state.items() if k != "training"} if isinstance(state, dict) else state
    summary: dict[str, Any] = {} if kept is None else {EMA_KEY: kept}
    if "averaged_from" in checkpoint:
        summary["averaged_from"] = True
    _read[_identity(path)] = summary


def ema_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's EMA entry, or None when its weights are the trained ones."""
    return checkpoint.get(EMA_KEY)


def weights_line(checkpoint: dict[str, Any], path: str | Path, command: str) -> str | None:
    """One line for `command` saying that it uses the EMA weights of `path`, or None for ordinary weights."""
    state = ema_state(checkpoint)
    if state is None:
        return None
    averaged = " (averaged over checkpoints)" if "averaged_from" in checkpoint else ""
    return (
        f"attnx {command}: the EMA weights of {path}{averaged} (decay {state['decay']}, "
        f"{state['updates']} updates)"
    )


def without_training_weights(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`checkpoint` with its EMA entry's training weights left out (an averaged or exported model decodes with
    the EMA weights alone, and cannot resume)."""
    state = ema_state(checkpoint)
    if state is None:
        return checkpoint
    return {**checkpoint, EMA_KEY: {k: v for k, v in state.items() if k != "training"}}


def checkpoint_weights_line(paths: str | Path | list[str | Path], command: str) -> str | None:
    """[`weights_line`][attnx.checkpoint.ema.weights_line] of each checkpoint file among `paths` (an exported
    model's folder says nothing), one line; None where none holds EMA weights. A file this process has read
    whole is said from what was kept then ([`note_read`][attnx.checkpoint.ema.note_read]); others are mapped,
    not read; a file that fails to map (a pickle payload among them, which never runs: `weights_only`) says nothing here,
    the command's checkpoint reader refuses it in its own line
    ([`read_checkpoint`][attnx.checkpoint.format.read_checkpoint])."""
    lines = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        if not Path(path).is_file():
            continue
        known = _read.get(_identity(path))
        if known is not None:
            if line := weights_line(known, path, command):
                lines.append(line)
            continue
        import torch

        try:
            with warnings.catch_warnings():  # torch's notes on files the reader refuses anyway
                warnings.simplefilter("ignore")
                checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # not a checkpoint torch can map (fails in many ways): its reader will say why
            continue
        if isinstance(checkpoint, dict) and (line := weights_line(checkpoint, path, command)):
            lines.append(line)
    return "; ".join(lines) or None
