"""Choices measured once per machine and kept: what `auto` settles by timing (the precision `attnx fit` trains
in on a CPU with AVX512-BF16 but no AMX, the precision a checkpoint decodes in, the CTranslate2 compute type of
an export) is measured the first time, written to a small JSON file and read back by every later command, so
the same command on the same machine trains the same batches in the same precision and gives the same
translations.

A choice is kept by what decides it: the machine (CPU model and flags, the threads PyTorch uses, the GPU), the
library versions, the model's shape, and the kind of choice. A probe taken while other processes kept the CPUs
busy ([`BUSY_CORES`][attnx.choices.BUSY_CORES] or more of them) is not trusted: that command takes the safe
default (fp32, the export's own CTranslate2 type), says so, and keeps nothing. Processes a command starts (DDP ranks, server workers) inherit what it chose through the environment
([`INHERITED`][attnx.choices.INHERITED]), so they never measure apart.

The file is `$ATTNX_CHOICES`, else `$XDG_CACHE_HOME/attnx/choices.json`, else `~/.cache/attnx/choices.json`;
`ATTNX_CHOICES=off` keeps nothing (every command measures again). `attnx choices` lists it, `attnx choices
--clear` empties it; an explicit option (`--trainer.precision`, `--precision`) is never replaced by it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from attnx.files import WriteError, atomic_write

__all__ = [
    "BUSY_CORES",
    "INHERITED",
    "Kept",
    "Remembered",
    "busy_cores",
    "choices_path",
    "clear_choices",
    "cpuinfo_field",
    "kept_choices",
    "machine_key",
    "remember",
]

BUSY_CORES = 0.3
"""Cores' worth of CPU time other processes may take while a probe runs before it counts as taken beside them
(and is not kept): a quiet machine's daemons use a few hundredths of a core."""
INHERITED = "ATTNX_INHERITED_CHOICES"
"""The environment variable that carries a command's choices to the processes it starts."""
OFF = ("off", "none", "0", "")

T = TypeVar("T")


def choices_path() -> Path | None:
    """The file choices are kept in, or None where `ATTNX_CHOICES` turns keeping off."""
    given = os.environ.get("ATTNX_CHOICES")
    if given is not None:
        return None if given.strip().lower() in OFF else Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attnx" / "choices.json"


def cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The value of the first `name` line of `cpuinfo` (Linux's `/proc/cpuinfo`: `flags`, `model name`), or
    None where there is none or the file cannot be read."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(name):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def machine_key(*parts: object) -> str:
    """What makes one machine kind for a choice: the CPU's model and flags, the threads PyTorch uses, the
    versions of attnx and PyTorch, and `parts` (the kind of choice, the device, the model's shape, other
    libraries' versions); a short digest, so that a key names no path."""
    import torch

    try:
        attnx_version = importlib.metadata.version("attnx")
    except importlib.metadata.PackageNotFoundError:
        attnx_version = "unknown"
    flags = " ".join(sorted((cpuinfo_field("flags") or "").split()))
    described = [
        cpuinfo_field("model name") or "",
        flags,
        torch.get_num_threads(),
        attnx_version,
        torch.__version__,
    ]
    text = json.dumps([str(p) for p in [*described, *parts]])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _read(path: Path) -> dict[str, Any]:
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        print(
            f"attnx: kept choices in {path} cannot be read ({err}); measuring again "
            "(attnx choices --clear replaces the file)",
            file=sys.stderr,
            flush=True,
        )
        return {}
    return values if isinstance(values, dict) else {}


def kept_choices(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The choices kept in `path` (default: [`choices_path`][attnx.choices.choices_path]), by key."""
    path = path or choices_path()
    if path is None:
        return {}
    return {k: v for k, v in _read(path).items() if isinstance(v, dict) and "value" in v}


def clear_choices(path: Path | None = None) -> int:
    """Empty the kept choices (the file stays, empty); returns how many there were."""
    path = path or choices_path()
    if path is None or not path.is_file():
        return 0
    count = len(kept_choices(path))
    _write(path, {})
    return count


def _write(path: Path, values: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, what="kept choices") as f:
        f.write((json.dumps(values, indent=2, sort_keys=True) + "\n").encode())


def _own_and_total_jiffies() -> tuple[int, int] | None:
    """CPU time this process and the whole machine have used, in clock ticks (Linux), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as f:
            own = f.read().rpartition(")")[2].split()
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy
    total = sum(fields[:8]) - fields[3] - fields[4]
    return int(own[11]) + int(own[12]), total  # utime + stime of all this process's threads


def busy_cores(measure: Callable[[], T]) -> tuple[T, float]:
    """`measure()` and how many cores' worth of CPU time other processes took while it ran (0.0 where it
    cannot be read)."""
    before, start = _own_and_total_jiffies(), time.perf_counter()
    result = measure()
    after, seconds = _own_and_total_jiffies(), time.perf_counter() - start
    if before is None or after is None or seconds <= 0:
        return result, 0.0
    others = (after[1] - before[1]) - (after[0] - before[0])
    return result, max(0.0, others / os.sysconf("SC_CLK_TCK") / seconds)


@dataclass(frozen=True)
class Kept:
    """How a measurement was settled, for the line that says the choice made from it."""

    how: str  # "kept", "measured", "busy", "inherited", "unkept"
    when: str = ""
    busy: float = 0.0
    path: str = ""

    def note(self) -> str:
        """The words that follow a choice's reason: how it was settled and how to settle it again."""
        if self.how == "kept":
            return f"measured {self.when}, kept in {self.path}; attnx choices --clear measures again"
        if self.how == "measured":
            return f"kept in {self.path} for later commands"
        if self.how == "busy":
            return (
                f"its probe ran beside other processes ({self.busy:.1f} cores busy) and is not trusted: this "
                "command takes the safe default and keeps nothing (run it once on a quiet machine, or choose "
                "explicitly)"
            )
        if self.how == "inherited":
            return "as the command that started this process measured"
        return "not kept (ATTNX_CHOICES is off, or its file cannot be written)"


def _inherited() -> dict[str, Any]:
    try:
        values = json.loads(os.environ.get(INHERITED, "{}"))
    except json.JSONDecodeError:
        return {}
    return values if isinstance(values, dict) else {}


def _pass_on(key: str, entry: dict[str, Any]) -> None:
    values = _inherited()
    values[key] = entry
    os.environ[INHERITED] = json.dumps(values, sort_keys=True)


def remember(
    key: str, measure: Callable[[], Any], describe: str, path: Path | None = None
) -> tuple[Any, Kept]:
    """The measurement kept under `key`, else `measure()`'s (a JSON value), kept unless it was taken beside
    busy processes; `describe` says in the file what it is (e.g. `bf16 over fp32 decoding speed, cpu`).
    Processes this one starts take the same value."""
    if key in (inherited := _inherited()) and isinstance(inherited[key], dict):
        return inherited[key].get("value"), Kept("inherited")
    path = path if path is not None else choices_path()
    if path is not None and isinstance(entry := kept_choices(path).get(key), dict):
        _pass_on(key, entry)
        return entry["value"], Kept("kept", str(entry.get("measured", "")), path=str(path))
    value, busy = busy_cores(measure)
    entry = {
        "value": value,
        "what": describe,
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "busy_cores": round(busy, 2),
    }
    _pass_on(key, entry)
    if busy >= BUSY_CORES:
        return value, Kept("busy", busy=busy)
    if path is None:
        return value, Kept("unkept")
    values = _read(path)
    values[key] = entry
    try:
        _write(path, values)
    except (OSError, WriteError) as err:
        print(f"attnx: measurement not kept: {err}", file=sys.stderr, flush=True)
        return value, Kept("unkept")
    return value, Kept("measured", path=str(path))


class Remembered(Generic[T]):
    """A measurement that is taken once per machine kind: calling it returns the kept value or measures it
    ([`remember`][attnx.choices.remember]); [`noted`][attnx.choices.Remembered.noted] adds how it was
    settled to a reason.

    Args:
        key: What the value is kept under ([`machine_key`][attnx.choices.machine_key]).
        measure: Takes the measurement (a JSON value).
        describe: What the file says it is.
    """

    def __init__(self, key: str, measure: Callable[[], T], describe: str) -> None:
        self.key, self.measure, self.describe = key, measure, describe
        self.kept: Kept | None = None

    def __call__(self) -> T:
        value, self.kept = remember(self.key, self.measure, self.describe)
        return value

    @property
    def busy(self) -> bool:
        """Whether the last call measured beside busy processes: its value is not to be trusted."""
        return self.kept is not None and self.kept.how == "busy"

    def noted(self, reason: str) -> str:
        """`reason`, followed by how the value was settled where this was called."""
        return reason if self.kept is None else f"{reason}; {self.kept.note()}"
