"""Whether an earlier corpus can be reused: fingerprints of the inputs and settings, checks of the files it left.

A re-run with the same input files (path and SHA-256 of their bytes) and settings reuses the directory; a changed
input or setting rebuilds it (and retrains SentencePiece only if its own inputs or settings changed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnx.data.corpus import FORMAT_VERSION, META, SPM_MODEL, checksums
from attnx.data.errors import DataError
from attnx.data.prepare.publish import expected_files
from attnx.data.prepare.settings import TRAIN, Inputs, Settings


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes: reuse is decided on content, never on size and modification time."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from e


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def fingerprints(inputs: Inputs, settings: Settings, spm_model: Path | None = None) -> tuple[str, str]:
    """(whole corpus, SentencePiece model): digests of the input files' paths and contents and of the settings
    that shape each; with a brought `spm_model`, of its content instead of what would train one."""
    stats = {
        name: [[[str(p.resolve()), file_digest(p)] for p in side] for side in sides]
        for name, sides in inputs.splits.items()
    }
    if spm_model is not None:
        brought = {"spm_model": file_digest(spm_model)}
        spm_fp = _digest({"format": FORMAT_VERSION, **brought})
    else:
        brought = {}  # a corpus prepared before --spm_model existed keeps its fingerprint
        spm_fp = _digest({"format": FORMAT_VERSION, "train": stats[TRAIN], **settings.spm_part()})
    if inputs.alignments:  # a corpus prepared without alignments keeps its fingerprint
        brought["alignments"] = {
            name: [[str(p.resolve()), file_digest(p)] for p in files]
            for name, files in inputs.alignments.items()
        }
    named = {"train_names": inputs.train_names} if inputs.train_names else {}  # unnamed: as before names
    corpus_fp = _digest(
        {"format": FORMAT_VERSION, "inputs": stats, "settings": asdict(settings), **brought, **named}
    )
    return corpus_fp, spm_fp


def read_meta(out: Path) -> dict[str, Any] | None:
    """`out/meta.json` when it is one attnx wrote (a JSON object with a format version), else None."""
    try:
        meta = json.loads((out / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "format_version" in meta else None


def corpus_reusable(out: Path, old: dict[str, Any], fingerprint: str) -> bool:
    """Whether `out` holds the complete corpus with this `fingerprint`, each file as it was prepared; when only
    its files changed since, it says so (the corpus is prepared again)."""
    if old.get("fingerprint") != fingerprint or old.get("incomplete") or not complete(out, old):
        return False
    why = damage(out, old)
    if why is not None:
        print(f"{why}: preparing the corpus again")
    return why is None


def model_reusable(out: Path, old: dict[str, Any] | None, fingerprint: str) -> bool:
    """Whether `out` holds the SentencePiece model with this `fingerprint` (of its training text and settings),
    unchanged since it was trained."""
    return (
        old is not None
        and old.get("spm_fingerprint") == fingerprint
        and not old.get("incomplete")
        and (out / SPM_MODEL).is_file()
        and damage(out, old, [SPM_MODEL, Path(SPM_MODEL).with_suffix(".vocab").name]) is None
    )


def damage(out: Path, meta: dict[str, Any], names: list[str] | None = None) -> str | None:
    """Why the files `names` (default: all) of the corpus in `out` cannot be reused, or None when each has the
    size and SHA-256 `meta` records. A corpus prepared before checksums were kept cannot be checked, so it is
    not reused either: preparing it again records them."""
    recorded = meta.get("checksums")
    if not isinstance(recorded, dict):
        return f"{out} was prepared before attnx recorded checksums"
    for name in list(recorded) if names is None else names:
        path = out / name
        entry = recorded.get(name)
        if not isinstance(entry, dict) or not path.is_file() or path.stat().st_size != entry.get("bytes"):
            return f"{path} changed after it was prepared"
    sums = checksums(out, list(recorded) if names is None else names)
    changed = next((name for name, entry in sums.items() if entry != recorded[name]), None)
    return None if changed is None else f"{out / changed} changed after it was prepared"


def complete(out: Path, meta: dict[str, Any]) -> bool:
    """Whether every file of the corpus `meta` describes is in `out`."""
    return all((out / f).is_file() for f in meta.get("files") or expected_files(meta))
