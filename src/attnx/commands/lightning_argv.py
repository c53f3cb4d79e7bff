"""The command line of `attnx fit | validate | test | predict` around LightningCLI: before it parses, a
packaged config's name becomes its path and a checkpoint's model joins the options of a decoding command;
after an interruption, the command line that resumes the run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from attnx.checkpoint import read_checkpoint
from attnx.commands.ckpt_path import LIGHTNING_KEYWORDS, RUN_KEYWORDS


def resolve_configs(argv: list[str]) -> list[str]:
    """`--config NAME` → the packaged config's path, when NAME is not a file here."""
    from attnx.configs import resolve

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            argv[i + 1] = str(resolve(argv[i + 1]))
        elif arg.startswith("--config="):
            argv[i] = "--config=" + str(resolve(arg.split("=", 1)[1]))
    return argv


def model_from_checkpoint(ckpt_path: str) -> dict[str, Any]:
    """The `model.transformer` values of a checkpoint (its vocabulary size is linked from the data)."""
    transformer = dict(read_checkpoint(ckpt_path)["attnx"]["transformer"])
    transformer.pop("vocab_size")  # a mismatch with the data is reported when the weights load
    return transformer


def checkpoint_override(argv: list[str]) -> list[str]:
    """For validate/test/predict with `--ckpt_path`: the model comes from the checkpoint (it must fit the
    weights), so its `model.transformer` values are appended to the command line, after the config.

    Decoding settings, output file and data stay those of the config and the command line.
    """
    ckpt = None
    for i, arg in enumerate(argv):
        if arg == "--ckpt_path" and i + 1 < len(argv):
            ckpt = argv[i + 1]
        elif arg.startswith("--ckpt_path="):
            ckpt = arg.split("=", 1)[1]
    # a missing file is left for the command to name, with the config's runs (attnx.commands.ckpt_path)
    if not ckpt or ckpt in ("null", *RUN_KEYWORDS, *LIGHTNING_KEYWORDS) or not Path(ckpt).is_file():
        return argv
    return [*argv, "--model.transformer", json.dumps(model_from_checkpoint(ckpt))]


def resume_command(argv: list[str], checkpoint: Path) -> str:
    """The command line that resumes an interrupted `attnx fit` from `checkpoint` (without the `--init_from` that
    started the run: the checkpoint holds its weights now)."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--ckpt_path", "--init_from"):
            skip = True
        elif not arg.startswith(("--ckpt_path=", "--init_from=")):
            args.append(arg)
    try:
        checkpoint = checkpoint.resolve().relative_to(Path.cwd())
    except ValueError:
        checkpoint = checkpoint.resolve()
    return shlex.join(["attnx", *args, "--ckpt_path", str(checkpoint)])
