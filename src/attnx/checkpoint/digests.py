"""The SHA-256 of each file `attnx export` writes, recorded in the export's metadata and checked where attnx loads
the export: a changed or damaged file is one line naming it, not a model that decodes garbage (CTranslate2
loads whatever bytes its `model.bin` holds).

A checkpoint needs no such record: its zip archive holds a CRC-32 of every member
([`damaged_member`][attnx.checkpoint.format.damaged_member]).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any

from attnx.checkpoint.format import CheckpointError
from attnx.data.corpus import file_sha256

RECORD = "files_sha256"
"""The metadata key of the record: `{file name: SHA-256}`."""

log = logging.getLogger(__name__)
_UNVERIFIABLE: set[Path] = set()  # exports already said to have no record, once each per process


def file_digests(directory: Path, skip: Collection[str] = ()) -> dict[str, str]:
    """`{name: SHA-256}` of every file in `directory` but those named in `skip`, what an export records."""
    return {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name not in skip}


def check_digests(directory: Path, meta: dict[str, Any], metadata: str) -> None:
    """Refuse, in one line naming it, a file of the export `directory` that is missing or whose SHA-256 is not
    the one its metadata file (`metadata`, read into `meta`) records. An export of an attnx that kept no record
    loads, and is said once to be unverifiable."""
    recorded = meta.get(RECORD)
    if recorded is None:
        if directory.resolve() not in _UNVERIFIABLE:
            _UNVERIFIABLE.add(directory.resolve())
            log.warning(
                f"attnx: {directory} was exported before attnx recorded the SHA-256 of its files, so damage to "
                "them cannot be detected; export the checkpoint again to record them"
            )
        return
    again = "copy the export again, or export the checkpoint again"
    if not isinstance(recorded, dict) or not all(
        isinstance(k, str) and Path(k).name == k and isinstance(v, str) for k, v in recorded.items()
    ):
        raise CheckpointError(f"{directory / metadata} has a damaged {RECORD!r} entry: {again}")
    for name, digest in recorded.items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing from the export ({metadata} records it): {again}")
        if file_sha256(path) != digest:
            raise CheckpointError(
                f"{path} is damaged: its SHA-256 is not the one {metadata} records (changed on disk or in a "
                f"copy); {again}"
            )
