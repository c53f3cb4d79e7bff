"""Which weights a checkpoint of a run with an exponential moving average (EMA) of its weights holds.

A run with `--ema.decay` ([`WeightEMA`][attnx.training.ema.WeightEMA]) writes the EMA weights as the
checkpoint's model weights (`state_dict`), so that averaging, export, serving and decoding take them like any
other weights, as Marian's `--exponential-smoothing` does with `model.npz`. What the run needs to resume lives
beside them under [`EMA_KEY`][attnx.checkpoint.ema.EMA_KEY]: the decay, the number of updates and the weights
the optimizer trains (`training`, by parameter name).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

EMA_KEY = "attnx_ema"
"""The checkpoint entry of a run with an EMA: `{"decay", "every", "start", "updates", "training"}`."""


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
    model's folder says nothing), one line; None where none holds EMA weights. Files are mapped, not read; a
    file that fails to map (a pickle payload among them, which never runs: `weights_only`) says nothing here,
    the command's checkpoint reader refuses it in its own line
    ([`read_checkpoint`][attnx.checkpoint.format.read_checkpoint])."""
    import torch

    lines = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        if not Path(path).is_file():
            continue
        try:
            with warnings.catch_warnings():  # torch's notes on files the reader refuses anyway
                warnings.simplefilter("ignore")
                checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # not a checkpoint torch can map (fails in many ways): its reader will say why
            continue
        if isinstance(checkpoint, dict) and (line := weights_line(checkpoint, path, command)):
            lines.append(line)
    return "; ".join(lines) or None
