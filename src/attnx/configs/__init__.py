"""The configs shipped with attnx: the paper's base and big models, a one-machine Multi30k run, a tiny
smoke-test run and the Table 3 variations (override configs merged over `base`).

The repository's `configs/` folder is this package. The files are read through `importlib.resources`, so
they are found by name from a clone and from an installed wheel alike.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from attnx.errors import ConfigError

__all__ = ["ConfigNotFound", "available", "not_found", "resolve"]

SUFFIX = ".yaml"

# Packaged files reached through a zip import are copied to temporary files that live as long as the process.
_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)


class ConfigNotFound(ConfigError):
    """Raised by [resolve][attnx.configs.resolve] for a name that is neither a file nor a packaged config."""


def _packaged() -> dict[str, Traversable]:
    """Packaged config name (`base`, `table3/A_heads1`) -> its file, top-level configs first."""

    def walk(folder: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                yield from walk(entry, f"{prefix}{entry.name}/")
            elif entry.is_file() and entry.name.endswith(SUFFIX):
                yield prefix + entry.name.removesuffix(SUFFIX), entry

    def order(item: tuple[str, Traversable]) -> tuple:
        name = item[0]  # top-level first, then numbers in names by value: A_heads4 before A_heads16
        return name.count("/"), [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

    return dict(sorted(walk(resources.files(__name__), ""), key=order))


def _summary(text: str) -> str:
    """The first comment line of a YAML file, without its `#`; empty when the file has none."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and stripped.lstrip("#").strip():
            return stripped.lstrip("#").strip()
    return ""


def available() -> dict[str, str]:
    """Every packaged config: its name (`base`, `big`, `multi30k_cpu`, `tiny`, `table3/A_heads1`,
    ...), the one [resolve][attnx.configs.resolve] accepts, mapped to a one-line summary (the file's first
    comment line). The paper's and the one-machine configs come first, then the Table 3
    variations.
    """
    return {name: _summary(entry.read_text(encoding="utf-8")) for name, entry in _packaged().items()}


def _as_path(entry: Traversable) -> Path:
    if isinstance(entry, Path):
        return entry
    return _extracted.enter_context(resources.as_file(entry))


def resolve(name_or_path: str | os.PathLike[str]) -> Path:
    """The config file that `name_or_path` names.

    An existing file wins, so a local `base.yaml` is used over the packaged one. Otherwise it is looked up
    among the packaged configs by name, with or without `.yaml` (`big`, `table3/C_layers2.yaml`).

    Raises:
        ConfigNotFound: it is neither an existing file nor a packaged name; the message lists the packaged
            names.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    packaged = _packaged()
    name = str(name_or_path).strip().replace(os.sep, "/").removesuffix(SUFFIX)
    if name in packaged:
        return _as_path(packaged[name])
    hint = ""
    for prefix in ("./configs/", "configs/", "src/attnx/configs/"):
        if name.startswith(prefix) and name.removeprefix(prefix) in packaged:
            hint = f" (the packaged one is named {name.removeprefix(prefix)!r})"
            break
    raise ConfigNotFound(not_found(str(name_or_path), packaged, hint))


def not_found(name: str, packaged: Iterable[str] = (), hint: str = "") -> str:
    """How every command words a `--config` that names no file: with the packaged names for the commands
    that take one (`fit`, `describe`, ...), without them for a command's own option file (`translate`, ...)."""
    if not packaged:
        return f"config {name!r} not found: no such file; check the path"
    return (
        f"config {name!r} not found: no such file, and no packaged config of that name{hint}; "
        f"check the path, or use a packaged name: {', '.join(packaged)}"
    )
