"""Checkpoint averaging (§6.1): the base model averages the last 5 checkpoints, the big model the last 20.

``attnx average a.ckpt b.ckpt ... --output avg.ckpt`` or ``attnx average --dir RUN/checkpoints --last 5
--output avg.ckpt``. The result is a decodable attnx checkpoint (``attnx.checkpoint.load_model``) and a valid
``--ckpt_path`` for ``attnx test``; it carries no optimizer state, so training cannot resume from it.
Needs neither Lightning nor a GPU.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnx.checkpoint import CheckpointError, atomic_save, read_checkpoint

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks")
"""Entries of a training checkpoint that describe one moment of training, not the averaged weights."""

_STEP = re.compile(r"step=(\d+)")


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The element-wise mean of the model weights in ``paths``, as a checkpoint dict.

    All inputs must describe the same model (``checkpoint["attnx"]["transformer"]``) and hold the same weight
    names and shapes; otherwise :class:`CheckpointError` names the first file that differs. Floating-point
    weights are summed in float64 and stored in their own dtype; other tensors are taken from the last file.
    Everything else (metadata, hyperparameters, step) is the last file's, minus the training state
    (:data:`TRAINING_STATE`); ``averaged_from`` lists the inputs.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    first_path, reference, last = paths[0], None, None
    for path in paths:
        checkpoint = read_checkpoint(path)
        state = checkpoint["state_dict"]
        if reference is None:
            reference = checkpoint
            shapes = {k: (v.shape, v.dtype) for k, v in state.items()}
        else:
            if checkpoint["attnx"]["transformer"] != reference["attnx"]["transformer"]:
                raise CheckpointError(
                    f"cannot average {path}: its model config differs from that of {first_path} "
                    f"({config_difference(reference['attnx']['transformer'], checkpoint['attnx']['transformer'])}); "
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
    return result


def config_difference(a: dict[str, Any], b: dict[str, Any], a_name: str = "", b_name: str = "") -> str:
    """``key: A vs B`` for every key whose value differs between two model configs, e.g. ``d_ff: 64 vs 128``."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    a_name, b_name = (f"{a_name} " if a_name else ""), (f"{b_name} " if b_name else "")
    return ", ".join(f"{k}: {a_name}{a.get(k)!r} vs {b_name}{b.get(k)!r}" for k in keys)


def checkpoint_step(path: Path) -> int | None:
    """The training step written in a checkpoint's file name (``step=1234``), if any."""
    match = _STEP.search(path.name)
    return int(match.group(1)) if match else None


def last_checkpoints(directory: str | Path, k: int) -> list[Path]:
    """The ``k`` newest step checkpoints in ``directory``, oldest first.

    Step checkpoints are the ``*.ckpt`` files whose name holds ``step=N`` (``last.ckpt`` and
    ``averaged.ckpt`` repeat or mix them and are skipped); they are ordered by that step.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    found = sorted(
        (step, path) for path in directory.glob("*.ckpt") if (step := checkpoint_step(path)) is not None
    )
    if not found:
        raise CheckpointError(f"no step checkpoints (*step=N*.ckpt) in {directory}")
    return [path for _, path in found[-k:]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attnx average",
        description="Average the weights of several checkpoints of one run into one decodable checkpoint "
        "(§6.1: the last 5 for the base model, the last 20 for the big one).",
    )
    parser.add_argument("checkpoints", nargs="*", type=Path, help="checkpoint files to average")
    parser.add_argument("--dir", type=Path, help="take the newest checkpoints from this directory instead")
    parser.add_argument("--last", type=int, default=5, help="with --dir: how many of the newest (default 5)")
    parser.add_argument("--output", type=Path, required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    if bool(args.checkpoints) == bool(args.dir):
        parser.error("give either checkpoint files or --dir (with --last k), not both and not neither")
    if args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    try:
        paths = last_checkpoints(args.dir, args.last) if args.dir else args.checkpoints
        if args.dir and len(paths) < args.last:
            print(
                f"attnx average: only {len(paths)} step checkpoints in {args.dir}; averaging those",
                file=sys.stderr,
            )
        averaged = average_checkpoints(paths)
    except CheckpointError as err:
        print(f"attnx average: {err}", file=sys.stderr)
        return 2
    atomic_save(averaged, args.output)
    print(f"averaged {len(paths)} checkpoints into {args.output}:")
    for path in paths:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
