"""Checkpoint format shared by training, averaging and decoding.

A checkpoint is a Lightning checkpoint (a dict) that also carries everything needed to decode without the
training config: `checkpoint["attnx"] = {"format_version", "transformer", "tokenizer", "tokenizer_sha256"}`,
where `transformer` is [`TransformerConfig.to_dict`][attnx.model.builders.TransformerConfig.to_dict]
(component *names* and numbers, never classes), `tokenizer` is the serialized SentencePiece model and
`tokenizer_sha256` its SHA-256 (what `sha256sum spm.model` prints; checkpoints written before it was recorded
are checked against the hash of the bytes they carry).
Model weights live in `checkpoint["state_dict"]` under the `model.` prefix. Everything loads with
`torch.load(weights_only=True)`, once the CRC-32 of every member of the file's zip archive matches
([`damaged_member`][attnx.checkpoint.format.damaged_member]). Reading a checkpoint never imports Lightning, not
even for the dicts of hyperparameters Lightning may have pickled into it
([`LIGHTNING_DICTS`][attnx.checkpoint.format.LIGHTNING_DICTS]).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from attnx import files
from attnx.checkpoint.ema import note_read
from attnx.checkpoint.finite import non_finite_weight
from attnx.checkpoint.missing import missing_checkpoint
from attnx.data.sentencepiece_proto import segmentation_difference, segmentation_digest
from attnx.data.tokenizer import Tokenizer, sha256_hex
from attnx.errors import AttnxError
from attnx.model import Transformer, TransformerConfig, build_transformer

FORMAT_VERSION = 1
STATE_PREFIX = "model."
CRC_CHUNK = 1 << 24
"""Bytes read at a time when checking a member's CRC-32: no member is held in memory whole."""


LIGHTNING_DICTS = (
    "lightning.fabric.utilities.data.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict",
    "lightning_fabric.utilities.data.AttributeDict",
    "pytorch_lightning.utilities.parsing.AttributeDict",
)
"""The dict classes of Lightning (its `AttributeDict` of hyperparameters, under each of its package names) a
checkpoint may hold: read back as plain dicts by name, so that decoding never imports Lightning. No other class
is let in."""


class _PlainDict:
    """What the unpickler builds for a [`LIGHTNING_DICTS`][attnx.checkpoint.format.LIGHTNING_DICTS] class: a
    plain dict, which the pickle's items then fill."""

    def __new__(cls, *args: Any) -> dict[str, Any]:  # type: ignore[misc]
        return {}


_LIGHTNING_AS_PLAIN = [(_PlainDict, name) for name in LIGHTNING_DICTS]


class CheckpointError(AttnxError, ValueError):
    """A file is not a usable attnx checkpoint; the message says which file and why."""


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    config: TransformerConfig
    checkpoint: dict[str, Any]


_whole: set[tuple[int, ...]] = set()  # files whose CRCs matched, by identity: each command checks a file once
_finite: set[tuple[int, ...]] = set()  # files whose weights are all finite, by identity


def _identity(path: Path) -> tuple[int, ...]:
    """What changes when a file is replaced or written to: its device, inode, size and times."""
    stat = os.stat(path)
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def damaged_member(path: str | Path) -> str | None:
    """The name of the first member of the zip archive at `path` whose bytes do not match the CRC-32 recorded
    for them (or whose header is unreadable), or None when every member matches.

    `torch.save` records the CRC-32 of every member (the pickled structure, each tensor's bytes) and
    `torch.load` never checks them: a bit flipped on disk or in a copy loads as weights that translate garbage.
    Every member is read once, in chunks of [`CRC_CHUNK`][attnx.checkpoint.format.CRC_CHUNK] bytes; checkpoints
    of every attnx version carry these CRCs. A file that matched is remembered (by its identity, size and times),
    so the several reads of one command check it once. Raises `zipfile.BadZipFile` or `OSError` when the archive
    cannot be opened at all (a truncated file) or holds a compressed member (not what `torch.save` writes).
    """
    path = Path(path)
    identity = _identity(path)
    if identity in _whole:
        return None
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:  # inflating a crafted member could go on for hours
                raise zipfile.BadZipFile(f"member {info.filename} is compressed, which torch.save never does")
            try:
                with archive.open(info) as member:  # reading a member to its end compares its CRC-32
                    while member.read(CRC_CHUNK):
                        pass
            except (zipfile.BadZipFile, zlib.error, EOFError):
                return info.filename
    _whole.add(identity)
    return None


def foreign_zip(path: Path) -> str | None:
    """What zip archive `path` is when torch.save did not write it (`an empty zip archive`, `a zip archive of
    3 files, none of them data.pkl`), or None: it holds a `data.pkl`, or cannot be listed (read on, where
    the reading says why)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    if any(name == "data.pkl" or name.endswith("/data.pkl") for name in names):
        return None
    return (
        "an empty zip archive"
        if not names
        else f"a zip archive of {len(names)} file(s), none of them data.pkl"
    )


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """`torch.load` with `weights_only=True`, turning every failure into a
    [`CheckpointError`][attnx.checkpoint.format.CheckpointError] of one line naming the file. With `mmap`, the
    tensors are mapped from the file rather than read (what decoding does: the optimizer's state a training
    checkpoint carries is then never copied into memory).

    The one loader of every command. A file that is not a zip archive (what `torch.save` writes) is refused
    before anything is unpickled, and so is one whose bytes do not match the CRC-32 its archive records for
    them ([`damaged_member`][attnx.checkpoint.format.damaged_member]: a bit flip would load as a model that
    translates garbage); a pickle payload inside one never runs (`weights_only`), and torch's advice to load
    it with `weights_only=False` is never passed on. A checkpoint whose weights hold NaN or an infinity is
    refused naming the tensor ([`non_finite_weight`][attnx.checkpoint.finite.non_finite_weight]).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(missing_checkpoint(path))
    truncated = (
        f"checkpoint {path} cannot be read: it is truncated or corrupt. Use another checkpoint (e.g. an earlier "
        "one from the same run directory)."
    )
    try:
        with open(path, "rb") as f:
            zip_header = f.read(4) == b"PK\x03\x04"
        whole_zip = zipfile.is_zipfile(path)
    except OSError as err:
        raise CheckpointError(f"checkpoint {path} cannot be read: {err.strerror or err}") from err
    if not whole_zip:
        if zip_header:  # a zip archive whose end is missing: an interrupted copy or download
            raise CheckpointError(truncated)
        raise CheckpointError(
            f"{path} is not a checkpoint: it is not a zip archive as torch.save writes (random, text or "
            "legacy-pickle content). attnx reads checkpoints written by `attnx fit` or `attnx average`."
        )
    foreign = foreign_zip(path)
    if foreign is not None:
        raise CheckpointError(
            f"{path} is not a checkpoint: it is {foreign}, where torch.save writes a zip archive holding "
            "data.pkl. attnx reads checkpoints written by `attnx fit` or `attnx average`."
        )
    try:
        damaged = damaged_member(path)
    except (OSError, zipfile.BadZipFile) as err:
        raise CheckpointError(truncated) from err
    if damaged is not None:
        raise CheckpointError(
            f"checkpoint {path} is damaged: the bytes of its member {damaged} do not match the CRC-32 recorded for "
            "them (changed on disk or in a copy). Use another checkpoint (e.g. an earlier one from the same run "
            "directory), or copy it again from where it was written."
        )
    try:
        with warnings.catch_warnings():  # torch's notes about pickle protocols concern files we refuse anyway
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(_LIGHTNING_AS_PLAIN):
                checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"checkpoint {path} holds Python objects other than tensors and plain values, which attnx never "
            "loads (no code in a checkpoint is run); it was not written by attnx. Use a checkpoint written by "
            "`attnx fit` or `attnx average`."
        ) from err
    except Exception as err:  # a truncated or corrupt archive fails in many ways, none of them a bug here
        raise CheckpointError(truncated) from err
    if not isinstance(checkpoint, dict) or "attnx" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"checkpoint {path} is not an attnx checkpoint (no 'attnx' metadata); it was written by another "
            "program. attnx reads checkpoints written by `attnx fit` or `attnx average`."
        )
    meta = checkpoint["attnx"]
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise CheckpointError(
            f"checkpoint {path} has attnx format {version!r}; this attnx reads {FORMAT_VERSION}"
        )
    recorded = meta.get("tokenizer_sha256")
    if recorded is not None and recorded != tokenizer_sha256(checkpoint):
        raise CheckpointError(
            f"checkpoint {path} is damaged: the SentencePiece model it carries does not match the SHA-256 "
            "recorded with it. Use another checkpoint (e.g. an earlier one from the same run directory)."
        )
    identity = _identity(path)
    if identity not in _finite and isinstance(checkpoint["state_dict"], dict):
        weight = non_finite_weight(checkpoint["state_dict"])
        if weight is not None:
            raise CheckpointError(
                f"checkpoint {path} holds weights that are not finite numbers: {weight}. The run had diverged "
                "when it was saved, or the file was changed; use another checkpoint (e.g. an earlier one from the "
                "same run directory)"
            )
        _finite.add(identity)
    note_read(path, checkpoint)
    return checkpoint


def tokenizer_sha256(checkpoint: dict[str, Any]) -> str:
    """SHA-256 of the SentencePiece model a checkpoint carries (the hash of its bytes, for every checkpoint)."""
    return sha256_hex(bytes(checkpoint["attnx"]["tokenizer"]))


def check_tokenizer(checkpoint: dict[str, Any], path: str | Path | None, tokenizer: Tokenizer) -> None:
    """Refuse, in one line naming both files, to pair a checkpoint with another SentencePiece model than the
    one it was trained with (`attnx fit --ckpt_path` and `--init_from`, `attnx test` on a config's data): its
    ids would silently mean other pieces.

    What is compared is what decides the segmentation (pieces, scores, types, normalization:
    [`segmentation_digest`][attnx.data.sentencepiece_proto.segmentation_digest]), not the files' bytes: the
    same corpus prepared in another folder or on another machine, whose model recorded another training
    folder (as `attnx prepare` did before it kept paths out of the model), is the same tokenizer. The refusal
    says how the corpus is prepared with the checkpoint's own model."""
    carried = bytes(checkpoint["attnx"]["tokenizer"])
    if segmentation_digest(carried) == tokenizer.segmentation:
        return
    where = tokenizer.path or "the data's SentencePiece model"
    if path is None:  # a checkpoint handed over in Python: its model is checkpoint["attnx"]["tokenizer"]
        extract = "(the bytes of checkpoint['attnx']['tokenizer']) with attnx prepare --spm_model"
    else:
        saved = Path(path).with_suffix(".spm.model").name
        extract = (
            f"written by python -c \"from attnx.checkpoint import read_checkpoint as r; open('{saved}', 'wb')"
            f".write(r('{path}')['attnx']['tokenizer'])\", then attnx prepare ... --spm_model {saved}"
        )
    raise CheckpointError(
        f"checkpoint {path or '(given)'} was trained with another SentencePiece model than {where} "
        f"({segmentation_difference(carried, tokenizer.to_bytes())}): use the corpus it was trained on (its "
        f"data_dir), or prepare this text again with the checkpoint's own model, {extract}"
    )


def model_state(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The Transformer's own state dict (`model.` prefix removed)."""
    n = len(STATE_PREFIX)
    return {k[n:]: v for k, v in checkpoint["state_dict"].items() if k.startswith(STATE_PREFIX)}


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the model and tokenizer a checkpoint describes, in eval mode, for decoding (its tensors mapped
    from the file, the model's weights copied out of them)."""
    checkpoint = read_checkpoint(path, mmap=True)
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
    """`key: A vs B` for every key whose value differs between two model configs, e.g. `d_ff: 64 vs 128`."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    a_name, b_name = (f"{a_name} " if a_name else ""), (f"{b_name} " if b_name else "")
    return ", ".join(f"{k}: {a_name}{a.get(k)!r} vs {b_name}{b.get(k)!r}" for k in keys)


def make_metadata(config: TransformerConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "transformer": config.to_dict(),
        "tokenizer": tokenizer.to_bytes(),
        "tokenizer_sha256": tokenizer.sha256,
    }


def save_model(
    path: str | Path, model: torch.nn.Module, config: TransformerConfig, tokenizer: Tokenizer
) -> None:
    """Write a decodable checkpoint: the model's weights and attnx's metadata, no training state.

    What [`load_model`][attnx.checkpoint.format.load_model] (so `attnx translate`, `attnx export`) reads; a model
    built or trained outside Lightning (a test, a benchmark, a conversion) is saved this way.
    """
    state = {STATE_PREFIX + k: v for k, v in model.state_dict().items()}
    atomic_save({"state_dict": state, "attnx": make_metadata(config, tokenizer)}, path)


RESUME = "resume from the last whole checkpoint"
"""What a failed checkpoint write tells the user to do once there is disk space again."""


@contextlib.contextmanager
def atomic_write(path: str | Path, needed: int = 0) -> Iterator[BinaryIO]:
    """[`attnx.files.atomic_write`][attnx.files.atomic_write] of a checkpoint: a failed write raises
    [`CheckpointError`][attnx.checkpoint.format.CheckpointError] naming the file (and on a full disk the free space and
    the `needed` bytes), which says to resume from the last whole checkpoint."""
    try:
        with files.atomic_write(path, needed, what="checkpoint", then=RESUME) as f:
            yield f
    except files.WriteError as err:
        raise CheckpointError(str(err)) from err


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in a nested dict/list: about what `torch.save(obj)` writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    return 0


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write `obj` with `torch.save` through [`atomic_write`][attnx.checkpoint.format.atomic_write]."""
    with atomic_write(path, needed=tensor_bytes(obj)) as f:
        torch.save(obj, f)


def atomic_copy(source: str | Path, target: str | Path) -> None:
    """Copy `source` to `target` through [`atomic_write`][attnx.checkpoint.format.atomic_write]."""
    with open(source, "rb") as src, atomic_write(target, needed=os.fstat(src.fileno()).st_size) as f:
        shutil.copyfileobj(src, f, 1 << 20)
