"""The other spellings a command line may use, rewritten to attnx's own before it is parsed: the short decoding
options a fairseq or Marian user types (`--beam 5` for `--search.beam 5`), the checkpoint under the name
another command gives it (`--ckpt_path` where a command says `--model`, and the other way round), and an
ensemble written `--model a.ckpt b.ckpt` or, as fairseq writes it, `--path a.ckpt:b.ckpt`, and a component
named alone (`--model.transformer.feedforward swiglu`, for `attnx fit` and `attnx describe`).

Each command's `--help` lists the short spellings it takes ([alias_help][attnx.commands.spellings.alias_help]).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnx.errors import UsageError

SEARCH_ALIASES: dict[str, str] = {
    "--beam": "search.beam",
    "--nbest": "search.nbest",
    "--lenpen": "search.alpha",
    "--alpha": "search.alpha",
    "--sampling": "search.sampling",
}
"""Short spelling → the field of a command's `search` settings it stands for (`--lenpen` is fairseq's name for
the length penalty's exponent, `--alpha` the GNMT paper's)."""

FLAGS = ("--sampling",)
"""Short spellings of a boolean: given alone, they mean true."""


def aliases(function: Callable[..., Any]) -> dict[str, str]:
    """The short spellings command `function` takes, each with the option it stands for: the decoding options
    where it has `search` settings, and `--ckpt_path` for its `--model` (or `--model` for its `--ckpt_path`)
    where the checkpoint is the one model it reads."""
    parameters = inspect.signature(function).parameters
    found = {alias: f"--{field}" for alias, field in SEARCH_ALIASES.items()} if "search" in parameters else {}
    if "model" in parameters and "ckpt_path" not in parameters:
        found["--ckpt_path"] = "--model"
    if "ckpt_path" in parameters and "model" not in parameters:
        found["--model"] = "--ckpt_path"
    return {alias: option for alias, option in found.items() if alias[2:] not in parameters}  # its own wins


def lightning_aliases() -> dict[str, str]:
    """The short decoding spellings of `attnx validate | test | predict`, whose search settings are
    `--evaluation.search.*`."""
    return {alias: f"--evaluation.{field}" for alias, field in SEARCH_ALIASES.items()}


def with_aliases(argv: list[str], table: dict[str, str]) -> list[str]:
    """`argv` with each short spelling of `table` replaced by the option it stands for (`--beam 5` and
    `--beam=5` → `--search.beam 5`; a bare `--sampling` → `--search.sampling=true`)."""
    out = []
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name not in table:
            out.append(arg)
            continue
        following = argv[i + 1] if i + 1 < len(argv) else "--"
        bare = not sep and following.lower() not in ("true", "false")
        out.append(f"{table[name]}=true" if name in FLAGS and bare else f"{table[name]}{sep}{value}")
    return out


REPEATABLE = ("--config", "-c")
"""Options a command line may repeat by convention: each `--config` file is read over the ones before it."""


def conflicting_values(argv: list[str], table: dict[str, str], lists: Iterable[str] = ()) -> None:
    """Refuse one option set twice to different values, under any of its spellings (`--beam 2 --search.beam 5`,
    `--nbest 2 --nbest 3`, `--sampling --search.sampling false`), in one line naming both: argparse would keep
    the last without a word.

    `table` maps each short spelling to the option it stands for ([aliases][attnx.commands.spellings.aliases]).
    Not a conflict: the same value twice, an option of `lists` (repeating it collects every value), one that
    appends (`--trainer.callbacks+=...`) and the keys under it, and `--config` ([REPEATABLE][attnx.commands.spellings.REPEATABLE]).
    """
    lists = set(lists)
    appended = {arg.split("=", 1)[0].removesuffix("+") for arg in argv if arg.split("=", 1)[0].endswith("+")}
    seen: dict[str, tuple[str, Any]] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg.partition("=")
        option = table.get(name, name)
        inside = any(option == group or option.startswith(f"{group}.") for group in appended)
        if name.endswith("+") or option in lists or name in REPEATABLE or inside:
            continue
        if not sep:
            following = argv[i + 1] if i + 1 < len(argv) else None
            value = following if following is not None and not following.startswith("--") else None
        typed = f"{name} {value}" if value is not None else name
        if option not in seen:
            seen[option] = (typed, value_of(value))
        elif seen[option][1] != value_of(value):
            raise UsageError(
                f"{seen[option][0]} and {typed} both set {option}: give it once (the last would win)"
            )


def value_of(value: str | None) -> Any:
    """A command-line value as YAML reads it (`5` and `5.0` alike, `True` and `true`); an option given bare
    (a flag) is true."""
    import yaml

    if value is None:
        return True
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def alias_help(table: dict[str, str]) -> str | None:
    """One paragraph for the end of `--help`: each short spelling and the option it stands for."""
    if not table:
        return None
    meant: dict[str, list[str]] = {}
    for alias, option in table.items():
        meant.setdefault(option, []).append(alias)
    pairs = [f"{' or '.join(names)} for {option}" for option, names in meant.items()]
    return "short spellings: " + ", ".join(pairs) + "."


def several_values(function: Callable[..., Any], argv: list[str]) -> list[str]:
    """A list option followed by several values (`--model a.ckpt b.ckpt`, `--train_repeat 2 1`) takes them
    all, as if it were given once for each (`--model+ a.ckpt --model+ b.ckpt`, jsonargparse's way to
    append)."""
    lists = list_options(function)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        end = i + 1
        while end < len(argv) and not argv[end].startswith("--"):
            end += 1
        if arg in lists and end - i > 2:  # the option and two values or more
            out += [part for value in argv[i + 1 : end] for part in (f"{arg}+", value)]
            i = end
            continue
        out.append(arg)
        i += 1
    return out


def model_like(name: str) -> bool:
    """Whether `name` can be one member of a fairseq-style `a:b` ensemble: a path that exists, or a checkpoint's
    name (`.ckpt`, `.pt`)."""
    return os.path.exists(name) or name.endswith((".ckpt", ".pt"))


def list_options(function: Callable[..., Any]) -> set[str]:
    """The `--name` of each option of `function` whose type is a list (or an optional list)."""
    return {
        f"--{name}"
        for name, kind in typing.get_type_hints(function).items()
        if any(typing.get_origin(t) is list for t in (kind, *typing.get_args(kind)))
    }


def ensemble_members(model: list[str] | str) -> list[str] | str:
    """fairseq's `a.ckpt:b.ckpt` as the ensemble `[a.ckpt, b.ckpt]`, also inside a list; a path that exists
    as it is stays one model, a ':' in its name and all, and so does one whose parts are not each a model
    (a file or folder that exists, or a name ending in `.ckpt` or `.pt`): a missing `co:lon/b.ckpt` is reported
    whole, not as a missing `co`."""
    names = [model] if isinstance(model, str) else model
    members = []
    for name in names:
        parts = [part for part in name.split(":") if part]
        if ":" in name and not os.path.exists(name) and all(map(model_like, parts)):
            members += parts
        else:
            members.append(name)
    if isinstance(model, str) and len(members) == 1:
        return members[0]
    return members


COMPONENT_KEYS = tuple(
    f"--model.transformer.{key}"
    for key in ("self_attention", "cross_attention", "feedforward", "positional", "norm")
)
"""The options that take a component: a name alone (`--model.transformer.feedforward swiglu`) means that
component with its default arguments."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def component_names(argv: list[str]) -> list[str]:
    """`--model.transformer.feedforward swiglu` → `--model.transformer.feedforward '{"name": "swiglu"}'`: a
    bare registered-component name where jsonargparse expects a mapping (or a file holding one); a value that is
    a file here, or already a mapping, is left as it is."""

    def spelled(value: str) -> str:
        if _NAME.match(value) and not Path(value).exists() and not value.endswith((".yaml", ".yml", ".json")):
            return json.dumps({"name": value})
        return value

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg in COMPONENT_KEYS and i + 1 < len(argv):
            argv[i + 1] = spelled(argv[i + 1])
        elif arg.partition("=")[0] in COMPONENT_KEYS and "=" in arg:
            key, _, value = arg.partition("=")
            argv[i] = f"{key}={spelled(value)}"
    return argv
