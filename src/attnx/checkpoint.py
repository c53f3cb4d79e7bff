"""Checkpoint format shared by training, averaging and decoding.

A checkpoint is a Lightning checkpoint (a dict) that also carries everything needed to decode without the
training config: ``checkpoint["attnx"] = {"format_version", "transformer", "tokenizer"}``, where
``transformer`` is [`TransformerConfig.to_dict`][attnx.model.builders.TransformerConfig.to_dict]
(component *names* and numbers, never classes) and ``tokenizer`` is the serialized SentencePiece model.
Model weights live in ``checkpoint["state_dict"]`` under the ``model.`` prefix. Everything loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnx.data.tokenizer import Tokenizer
from attnx.model import Transformer, TransformerConfig, build_transformer

FORMAT_VERSION = 1
STATE_PREFIX = "model."


class CheckpointError(ValueError):
    """A file is not a usable attnx checkpoint; the message says which file and why."""


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    config: TransformerConfig
    checkpoint: dict[str, Any]


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """``torch.load`` with ``weights_only=True``, turning every failure into a
    [`CheckpointError`][attnx.checkpoint.CheckpointError]."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
            "it is truncated, corrupt, or not a torch file. Use another checkpoint (e.g. an earlier one "
            "from the same run directory)."
        ) from err
    if not isinstance(checkpoint, dict) or "attnx" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"checkpoint {path} is not an attnx checkpoint (no 'attnx' metadata); it was written by another "
            "program. attnx reads checkpoints written by `attnx fit` or `attnx average`."
        )
    meta = checkpoint["attnx"]
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has attnx format {meta.get('format_version')!r}; this attnx reads {FORMAT_VERSION}"
        )
    return checkpoint


def model_state(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The Transformer's own state dict (``model.`` prefix removed)."""
    n = len(STATE_PREFIX)
    return {k[n:]: v for k, v in checkpoint["state_dict"].items() if k.startswith(STATE_PREFIX)}


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the model and tokenizer a checkpoint describes, in eval mode, for decoding."""
    checkpoint = read_checkpoint(path)
    meta = checkpoint["attnx"]
    config = TransformerConfig.from_dict(meta["transformer"])
    model = build_transformer(config)
    try:
        model.load_state_dict(model_state(checkpoint))
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {path}: weights do not fit its own model config: {err}") from err
    tokenizer = Tokenizer.from_bytes(bytes(meta["tokenizer"]))
    return LoadedModel(model.to(device).eval(), tokenizer, config, checkpoint)


def config_difference(a: dict[str, Any], b: dict[str, Any], a_name: str = "", b_name: str = "") -> str:
    """``key: A vs B`` for every key whose value differs between two model configs, e.g. ``d_ff: 64 vs 128``."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    a_name, b_name = (f"{a_name} " if a_name else ""), (f"{b_name} " if b_name else "")
    return ", ".join(f"{k}: {a_name}{a.get(k)!r} vs {b_name}{b.get(k)!r}" for k in keys)


def make_metadata(config: TransformerConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "transformer": config.to_dict(),
        "tokenizer": tokenizer.to_bytes(),
    }


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write ``obj`` with ``torch.save`` to a temporary file beside ``path``, then rename it into place.

    A crash mid-write leaves the previous file intact, never a truncated one. A failed write (a full disk,
    a lost mount) raises [CheckpointError][attnx.checkpoint.CheckpointError] naming the file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise CheckpointError(f"cannot write checkpoint {path}: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise CheckpointError(
                f"cannot write checkpoint {path}: {err.strerror or err}; the previous file is kept. Free disk "
                "space (or save elsewhere) and resume from the last whole checkpoint"
            ) from err
        raise
