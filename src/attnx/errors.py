"""The failures attnx expects, each with the exit status the `attnx` command ends with.

An [AttnxError][attnx.errors.AttnxError] is a failure the user can act on: the command prints its message as
one line (`attnx COMMAND: error: ...`) and exits with its `exit_code`; any other exception is a bug in attnx
and shows its traceback. Each part of attnx raises its own subclass where the failure happens
([CheckpointError][attnx.checkpoint.CheckpointError], [DataError][attnx.data.errors.DataError],
[ConfigError][attnx.errors.ConfigError] for a setting that cannot work, ...), so the command reads the exit
status from the error instead of guessing it from where the error came from. This module imports nothing of
attnx: every module may import it.
"""

from __future__ import annotations

__all__ = ["AttnxError", "ConfigError", "UsageError", "expected_error"]


class AttnxError(Exception):
    """A failure attnx explains in its message: bad data, a checkpoint it cannot read, a diverging run.

    `attnx` prints the message as one line and exits with `exit_code` (1, a runtime failure).
    """

    exit_code: int = 1


class UsageError(AttnxError):
    """A command line, config or setting that cannot work as given: exit status 2."""

    exit_code = 2


class ConfigError(UsageError, ValueError):
    """A setting, or a combination of settings, that cannot work, whether it came from a config file, the
    command line or a Python call: the message names the setting and what it may be (exit status 2).

    Also a `ValueError`, as Python code expects of an argument with a bad value. A plugin's component that
    refuses its settings raises it too, to be reported in one line like attnx's own.
    """


def expected_error(err: BaseException) -> AttnxError | None:
    """The [AttnxError][attnx.errors.AttnxError] that `err` is, or that it was raised from (`raise ... from`):
    a library that calls attnx code may wrap the attnx error in its own (jsonargparse reports a settings
    class that refused its values inside its account of every type it tried). None for anything else."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, AttnxError):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None
