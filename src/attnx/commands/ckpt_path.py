"""`--ckpt_path` before Lightning reads it: `last` resolved to the newest `last.ckpt` of the config's runs, the
file checked in one line, and for `fit` the leftovers of checkpoint writes that were killed removed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import read_checkpoint
from attnx.files import remove_stale_temporaries
from attnx.training.resume import checkpoint_directories, last_checkpoint

LIGHTNING_KEYWORDS = ("best", "hpc", "registry")
"""`--ckpt_path` values Lightning resolves itself; `last` attnx resolves (Lightning's finds no
`ModelCheckpoint` here and would start from step 0)."""


def checked_checkpoint(subcommand: str, ckpt_path: Any, trainer: Any) -> Any:
    """`ckpt_path` resolved (`last`) and readable, before Lightning reads it; for `fit` also the
    leftovers of checkpoint writes that were killed are removed from this config's run directories."""
    if subcommand == "fit":
        directories = checkpoint_directories(trainer)
        if ckpt_path and ckpt_path not in ("last", *LIGHTNING_KEYWORDS):
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
            runs = [d for d in checkpoint_directories(trainer) if (d / "last.ckpt").is_file()]
            others = (
                f"the newest of this config's {len(runs)} runs; another: --ckpt_path "
                f"{Path(ckpt_path).parent.parent.parent / 'version_N' / 'checkpoints' / 'last.ckpt'}"
                if len(runs) > 1
                else "this config's only run"
            )
            print(f"attnx {subcommand}: --ckpt_path last is {ckpt_path} ({others})", file=sys.stderr)
    read_checkpoint(
        ckpt_path
    )  # one line for a missing, unreadable or foreign file, before Lightning's torch.load
    return ckpt_path
