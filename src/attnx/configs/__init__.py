"""The configs shipped with attnx: the paper's base and big models, a one-machine Multi30k run, a tiny
smoke-test run and the Table 3 variations (override configs merged over ``base``).

The repository's ``configs/`` folder is this package; installed from a wheel they are found by name, so
``attnx fit --config base`` works outside a clone.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


class ConfigNotFound(ValueError):
    """A --config that is neither a file nor a packaged config name."""


def available() -> dict[str, str]:
    """Packaged config name → the first line of its leading comment."""
    found = {}
    for path in sorted(HERE.rglob("*.yaml")):
        first = next(
            (line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")), "#"
        )
        found[path.relative_to(HERE).with_suffix("").as_posix()] = first.lstrip("# ").strip()
    return found


def resolve(name_or_path: str | Path) -> Path:
    """A config file: an existing path as given, else a packaged config by name (``base``, ``table3/D_ls0``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = HERE / (path.as_posix().removesuffix(".yaml") + ".yaml")
    if packaged.is_file():
        return packaged
    raise ConfigNotFound(
        f"config {str(name_or_path)!r} is neither a file nor a packaged config; check the path, or use one of: "
        + ", ".join(available())
    )
