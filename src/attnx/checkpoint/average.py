"""Checkpoint averaging (§6.1): the base model averages the last 5 checkpoints, the big model the last 20.

`attnx average --checkpoints '[a.ckpt, b.ckpt]' --output avg.ckpt` or `attnx average --dir RUN/checkpoints
--last 5 --output avg.ckpt`. The result is a decodable attnx checkpoint ([`load_model`][attnx.checkpoint.format.load_model]) and a valid
`--ckpt_path` for `attnx test`; it carries no optimizer state, so training cannot resume from it.
Needs neither Lightning nor a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnx.checkpoint.ema import without_training_weights
from attnx.checkpoint.format import CheckpointError, config_difference, read_checkpoint
from attnx.checkpoint.legacy import upgrade_checkpoint
from attnx.data.sentencepiece_proto import segmentation_digest
from attnx.model import architecture

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks", "attnx_lora")
"""Entries of a training checkpoint that describe one moment of training, not the averaged weights."""

_STEP = re.compile(r"step=(\d+)")


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The element-wise mean of the model weights in `paths`, as a checkpoint dict.

    All inputs must describe the same model (`checkpoint["attnx"]["transformer"]`) and hold the same weight
    names and shapes; otherwise [`CheckpointError`][attnx.checkpoint.format.CheckpointError] names the first file that differs. Floating-point
    weights are summed in float64 and stored in their own dtype; other tensors are taken from the last file.
    Checkpoints of an earlier attention layout are read in today's
    ([`upgrade_checkpoint`][attnx.checkpoint.legacy.upgrade_checkpoint]), so both average together.
    Everything else (metadata, hyperparameters, step) is the last file's, minus the training state
    ([`TRAINING_STATE`][attnx.checkpoint.average.TRAINING_STATE]) and the weights an EMA run trains
    ([`without_training_weights`][attnx.checkpoint.ema.without_training_weights]); `averaged_from` lists the
    inputs. An input whose weights hold NaN or an infinity is refused naming it and the tensor
    ([`read_checkpoint`][attnx.checkpoint.format.read_checkpoint]): the mean of finite weights is finite in
    their own dtype, so no average is written that is not.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    first_path, reference, last = paths[0], None, None
    for path in paths:
        checkpoint = read_checkpoint(path)
        upgrade_checkpoint(checkpoint)  # a run resumed across a change of layout saved both
        state = checkpoint["state_dict"]
        if reference is None:
            reference = checkpoint
            shapes = {k: (v.shape, v.dtype) for k, v in state.items()}
        else:
            if architecture(checkpoint["attnx"]["transformer"]) != architecture(
                reference["attnx"]["transformer"]
            ):
                raise CheckpointError(
                    f"cannot average {path}: its model config differs from that of {first_path} "
                    f"({config_difference(reference['attnx']['transformer'], checkpoint['attnx']['transformer'])}); "
                    "average only checkpoints of one training run"
                )
            if segmentation_digest(bytes(checkpoint["attnx"]["tokenizer"])) != segmentation_digest(
                bytes(reference["attnx"]["tokenizer"])
            ):  # the same model in other bytes (another training folder recorded) averages
                raise CheckpointError(
                    f"cannot average {path}: it was trained with another SentencePiece model than {first_path}; "
                    "average only checkpoints of one training run"
                )
            theirs = {k: (v.shape, v.dtype) for k, v in state.items()}
            if theirs != shapes:
                odd = sorted(set(theirs) ^ set(shapes)) or sorted(k for k in shapes if shapes[k] != theirs[k])
                raise CheckpointError(
                    f"cannot average {path}: its weights differ in names or shapes from those of {first_path} "
                    f"(first differences: {odd[:5]})"
                )
        for name, tensor in state.items():
            if tensor.is_floating_point():
                sums[name] = sums[name] + tensor.double() if name in sums else tensor.double()
        last = checkpoint
    n = len(paths)
    averaged = {
        name: (sums[name] / n).to(tensor.dtype) if name in sums else tensor
        for name, tensor in last["state_dict"].items()
    }
    result = {k: v for k, v in last.items() if k not in TRAINING_STATE and k != "state_dict"}
    result["state_dict"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    return without_training_weights(result)


def checkpoint_step(path: Path) -> int | None:
    """The training step written in a checkpoint's file name (`step=1234`), if any."""
    match = _STEP.search(path.name)
    return int(match.group(1)) if match else None


def stored_step(path: Path) -> int | None:
    """The optimizer step a checkpoint holds (`global_step`), read without loading its tensors; None if it
    records none."""
    step = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step")
    return int(step) if step is not None else None


def last_checkpoints(directory: str | Path, k: int) -> list[Path]:
    """The `k` newest checkpoints of a run in `directory` by training step, oldest first.

    They are the `*.ckpt` files whose name holds `step=N`, ordered by that step, and `last.ckpt` when it
    holds a later step than all of them (a run stopped between two scheduled saves writes `last.ckpt` alone);
    a `last.ckpt` that repeats a step checkpoint is not counted twice. `averaged.ckpt`, `best.ckpt` and the
    other files mix or repeat them and are skipped.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    found = sorted(
        (step, path) for path in directory.glob("*.ckpt") if (step := checkpoint_step(path)) is not None
    )
    last = directory / "last.ckpt"
    if last.is_file():
        step = stored_step(last)
        if step is not None and (not found or step > found[-1][0]):
            found.append((step, last))
    if not found:
        raise CheckpointError(f"no step checkpoints (*step=N*.ckpt) or last.ckpt in {directory}")
    return [path for _, path in found[-k:]]
