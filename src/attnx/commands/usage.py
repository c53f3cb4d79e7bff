"""Command-line plumbing shared by `attnx` (`attnx.cli`) and its LightningCLI commands
(`attnx.training.cli`): the usage error, one-line messages, "did you mean" hints, bare boolean flags, and
how option help is parsed and shown.

Only the command layer imports this module; the library below it raises its own errors.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """A command line or config that cannot work as given (exit status 2)."""


def one_line(message: str) -> str:
    """An error message folded onto one line (jsonargparse's nested messages span several)."""
    lines = [re.sub(r"^\s*-\s+", "", line).strip() for line in str(message).strip().splitlines()]
    lines = [line for line in lines if line]
    text = ""
    for line in dict.fromkeys(lines):  # repeated lines once
        text += (" " if not text or text.endswith(":") else "; ") + line
    return re.sub(r"\s+", " ", text).strip()


def suggest(message: str, options: list[str]) -> str:
    """Add "did you mean --x?" to an unrecognized-option message when an option is close.

    A field unknown to a settings group comes back from jsonargparse as `Parser key "search": ... Option
    'bem' is not accepted`: that message is replaced by `unknown option --search.bem`.
    """
    nested = re.search(r'Parser key "([\w.]+)".*?Option \'(\w+)\' is not accepted', message)
    if nested:
        message = f"unknown option --{nested.group(1)}.{nested.group(2)}"
    # A settings group that refused its values (e.g. SearchConfig's own checks) inside an optional type:
    # jsonargparse wraps the one line the group wrote in every subtype it tried; keep that line.
    refused = re.search(
        r"Does not validate against any of the Union subtypes.*?Errors: (.*?); Expected a ", message
    )
    if refused:
        message = refused.group(1)
    unknown = re.findall(r"(--[\w.\-]+)", message)
    hints = []
    for option in unknown:
        if option in options:
            continue
        close = difflib.get_close_matches(option.split("=")[0], options, n=1, cutoff=0.75)
        if close:
            hints.append(f"{option}: did you mean {close[0]}?")
    return f"{message} ({'; '.join(hints)})" if hints else message


def option_names(target: Any, prefix: str = "") -> list[str]:
    """`--prefix.name` for every parameter of a callable or field of a dataclass, and the same for the fields
    of each dataclass-typed one (also when it is optional): what a misspelt option is compared with."""
    import dataclasses
    import typing

    try:
        hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations of a third-party signature: names only
        hints = {}
    if dataclasses.is_dataclass(target):
        params = [field.name for field in dataclasses.fields(target)]
    else:
        params = [p for p in inspect.signature(target).parameters if p not in ("self", "args", "kwargs")]
    names = []
    for name in params:
        key = f"{prefix}.{name}" if prefix else name
        names.append(f"--{key}")
        kind = hints.get(name)
        for candidate in (kind, *typing.get_args(kind)):
            if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
                names += option_names(candidate, key)
    return names


def bare_flags(function: Callable[..., Any], argv: list[str]) -> list[str]:
    """`--link` alone means `--link=true` for a bool option (jsonargparse wants a value)."""
    import typing

    flags = {f"--{name}" for name, kind in typing.get_type_hints(function).items() if kind is bool}
    out = []
    for i, arg in enumerate(argv):
        following = argv[i + 1] if i + 1 < len(argv) else "--"
        if arg in flags and following.startswith("-") and following.lower() not in ("true", "false"):
            arg += "=true"
        out.append(arg)
    return out


@functools.cache
def configure_parsing() -> None:
    """Read option help from Google-style docstrings and from dataclass attribute docstrings."""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)


@functools.cache
def help_formatter() -> type:
    """jsonargparse's help formatter, made to read as plain text for every command, Lightning's included.

    reST inline literals in double backticks and Sphinx roles (Lightning's and PyTorch's docstrings use
    them) read as Markdown code in single backticks, and a paragraph ending in a reST literal-block marker
    (two colons) ends in one colon. An option whose
    value has a default is not called required: a component's `name` reads `(type: str, default:
    multihead)`, not `(required, type: str, default: multihead)`.
    """
    from argparse import SUPPRESS

    from jsonargparse import DefaultHelpFormatter

    class HelpFormatter(DefaultHelpFormatter):
        def _get_help_string(self, action: Any) -> str:
            text = super()._get_help_string(action)
            if action.required and action.default not in (None, SUPPRESS):
                text = text.replace("(required, ", "(", 1)
            return text

        def format_help(self) -> str:
            return plain_help(super().format_help())

    return HelpFormatter


def plain_help(text: str) -> str:
    """Help text with reST inline literals and Sphinx roles (such as `:class:`) as Markdown code, and no
    reST literal-block markers."""
    text = re.sub(r"``(.+?)``", r"`\1`", text, flags=re.DOTALL)
    text = re.sub(r":(?:[a-z]+:)?[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)


def refuse_to_replace(path: str | Path, force: bool, option: str = "--output") -> None:
    """A file already at `path` stays unless `force`: attnx cannot tell whether it wrote it (exit status 1)."""
    path = Path(path)
    if not force and (path.exists() or path.is_symlink()):
        raise FileExistsError(
            f"{option} {path} already exists and is left as it is; choose another {option}, or pass --force "
            "to replace it"
        )
