"""The checks every built-in component makes of the numbers it is built with: a value out of its range is one
[ConfigError][attnx.errors.ConfigError] naming the key, the value and the range, when the model is built,
never a traceback from torch at the first step nor a run that trains on a nonsense setting."""

from __future__ import annotations

import math
import numbers
from typing import Any

from attnx.errors import ConfigError


def is_integer(value: Any) -> bool:
    """Whether `value` is an integer (a Python or NumPy one), not a bool or a float such as 2.0."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (an integer or a float, NaN included), not a bool or a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(key: str, value: Any, least: int = 1, what: str = "") -> int:
    """`value`, an integer of at least `least`, or one line: `KEY must be an integer >= LEAST (WHAT), got V`."""
    if not is_integer(value) or value < least:
        hint = f" ({what})" if what else ""
        raise ConfigError(f"{key} must be an integer >= {least}{hint}, got {value!r}")
    return int(value)


def optional_integer(key: str, value: Any, least: int = 1, what: str = "") -> int | None:
    """[`integer`][attnx.components.values.integer], or None where `value` is None (the default)."""
    return None if value is None else integer(key, value, least, what)


def probability(key: str, value: Any) -> float:
    """A probability that is not certain (a dropout): a number in [0, 1), or one line naming `key`."""
    if not is_number(value) or not 0.0 <= value < 1.0:
        raise ConfigError(f"{key} must be in [0, 1), got {value!r}")
    return float(value)


def positive(key: str, value: Any, above: float = 0.0, what: str = "") -> float:
    """A finite number greater than `above`, or one line naming `key` (NaN and infinity are refused)."""
    if not is_number(value) or not (math.isfinite(value) and value > above):
        hint = f" ({what})" if what else ""
        raise ConfigError(f"{key} must be a finite number > {above:g}{hint}, got {value!r}")
    return float(value)


def flag(key: str, value: Any) -> bool:
    """`value`, a bool (true or false), or one line naming `key`: a string such as 'no' would count as true."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value
