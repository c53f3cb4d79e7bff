"""Command-line plumbing shared by `attnx` (`attnx.cli`) and its LightningCLI commands
(`attnx.commands.lightning`): one-line messages, "did you mean" hints (for options and for the keys of
`--config` files), bare boolean flags, repeated list options, and the files and extras a command refuses.

Only the command layer imports this module; the library below it raises its own errors ([attnx.errors][]).
"""

from __future__ import annotations

import contextvars
import copy
import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnx.errors import UsageError


def one_line(message: str) -> str:
    """An error message folded onto one line (jsonargparse's nested messages span several, as lists)."""
    lines = []
    for line in str(message).strip().splitlines():
        line = line.strip()
        if line.startswith("-") and line[1:2].isspace():  # an item of a list, not an option
            line = line[1:].strip()
        if line:
            lines.append(line)
    text = ""
    for line in dict.fromkeys(lines):  # repeated lines once
        text += (" " if not text or text.endswith(":") else "; ") + line
    return " ".join(text.split())


NOT_FINITE = re.compile(r"(?:Given|Got) value: ([+-]?(?:nan|inf|infinity))$", re.IGNORECASE)
"""The end of jsonargparse's message for a number option given `nan` or `inf`, which it reads as text."""


def refused_command_line(err: Exception, argv: list[str], options: list[str]) -> UsageError:
    """The one line for a command line jsonargparse refused (`err`), with "did you mean --x?" for each option of
    `argv` that is not one of `options` but close to one.

    jsonargparse's message is kept when it names the unknown option (`unrecognized arguments: --outptu x`). A
    misspelt field of a settings group it names only by the field's bare name, inside its account of every
    type the group may have (`'bem'` for `--search.bem`): then the message is the option as it was typed,
    `unknown option --search.bem`. A number option given `nan` or `inf` is told that it takes finite numbers.
    """
    message = one_line(str(err))
    if found := NOT_FINITE.search(message):
        message += f" ({found.group(1)} is not a finite number: the option takes finite ones only)"
    unknown = unknown_options(argv, options)
    if unknown and not any(option in message for option in unknown):
        message = f"unknown option {unknown[0]}"
    hints = []
    for option in unknown:
        meant = close_option(option, options)
        if option in message and meant:
            hints.append(f"{option}: did you mean {meant}?")
    return UsageError(f"{message} ({'; '.join(hints)})" if hints else message)


def close_option(option: str, options: list[str]) -> str | None:
    """The option (or options) of `options` a misspelt `option` most likely meant: one spelt nearly alike
    (`--outptu` → `--output`), else the field of a settings group of that name, given without its group
    (`--max_len_b` → `--search.max_len_b`)."""
    close = difflib.get_close_matches(option, options, n=1, cutoff=0.75)
    if close:
        return close[0]
    key = close_key(option.removeprefix("--"), [name.removeprefix("--") for name in options])
    return None if key is None else " or ".join(f"--{name}" for name in key.split(" or "))


def given_options(argv: list[str]) -> list[str]:
    """The `--name` of each option in `argv`, once, without its `=value` or the `+` that appends to a list."""
    names = (arg.split("=", 1)[0].removesuffix("+") for arg in argv if arg.startswith("--"))
    return list(dict.fromkeys(names))


def unknown_options(argv: list[str], options: Iterable[str]) -> list[str]:
    """The options of `argv` that name neither one of `options` (`--search.beam`) nor a group of them
    (`--search`), nor a key inside the value of an option whose fields `options` does not list (the
    `--trainer.logger.init_args.save_dir` of `--trainer.logger`)."""
    keys = {option.removeprefix("--") for option in options}
    groups = parents(keys)
    unknown = []
    for option in given_options(argv):
        key = option.removeprefix("--")
        above = {key.rsplit(".", depth)[0] for depth in range(1, key.count(".") + 1)}
        if key in keys or key in groups or any(k in keys and k not in groups for k in above):
            continue
        unknown.append(option)
    return unknown


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


def unknown_keys(values: Any, options: Iterable[str]) -> list[str]:
    """The dotted paths in a config mapping that are neither an option in `options` (`model.lr_factor`) nor a
    group above one (`model`, `model.transformer`). The value of an option is looked into only where
    `options` names its fields (`search.beam` of an optional `search` group), not otherwise (a logger's
    `init_args`, a component's `args`)."""
    options = set(options)
    groups = parents(options)
    found: list[str] = []

    def walk(mapping: dict[Any, Any], prefix: str) -> None:
        for key, value in mapping.items():
            path = f"{prefix}{key}"
            if path in groups and isinstance(value, dict):
                walk(value, f"{path}.")
            elif path not in options and path not in groups:
                found.append(path)

    if isinstance(values, dict):
        walk(values, "")
    return found


def parents(keys: Iterable[str]) -> set[str]:
    """Every group above a dotted key: `model` and `model.transformer` for `model.transformer.d_model`."""
    return {key.rsplit(".", depth)[0] for key in keys for depth in range(1, key.count(".") + 1)}


def close_key(key: str, options: Iterable[str]) -> str | None:
    """The known key (or keys) a misspelt config key most likely meant: a close name beside it
    (`model.transformer.d_modle` → `model.transformer.d_model`), else the same or a close name in another
    section (`model.max_steps` → `trainer.max_steps`, `beem` → `search.beam`)."""
    options = set(options)
    parent, _, name = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in options | parents(options) if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.7)
    if close:
        return siblings[close[0]]
    names = {k.rpartition(".")[2] for k in options}
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if not close:
        return None
    meant = sorted(k for k in options if k.rpartition(".")[2] == close[0])
    return " or ".join(meant[:3])


def unknown_key_error(source: str, key: str, options: Iterable[str]) -> UsageError:
    """`my.yaml: unknown key trainr (did you mean trainer?)`: the file, the full dotted key and a hint."""
    close = close_key(key, options)
    hint = f" (did you mean {close}?)" if close else ""
    return UsageError(f"{source}: unknown key {key}{hint}")


@functools.cache
def config_file_action(fields: tuple[str, ...] = ()) -> type:
    """`--config FILE` (jsonargparse's `ActionConfigFile`) that checks the keys of each file as it reads it.

    A file that does not exist is said in the words of [attnx.configs.not_found][]. jsonargparse merges every
    config file unchecked and reports an unknown key once all are merged, without the file or a hint; here a key that names no option is a [UsageError][attnx.errors.UsageError]
    naming the file, its full dotted path and the option it most likely meant. The parser's own options are
    known to it; `fields` adds the fields of options it sees as one value (`search.beam` of an optional
    `search`). Only a key the parser itself refuses is reported: one it accepts (a linked
    `model.transformer.vocab_size`) is left to it, as are bad values.
    """
    from jsonargparse import ActionConfigFile

    class ConfigFile(ActionConfigFile):
        def __call__(self, parser: Any, cfg: Any, values: Any, option_string: str | None = None) -> None:
            check_config_keys(parser, values, fields)  # before jsonargparse reads a value of the file
            super().__call__(parser, cfg, values, option_string)

    return ConfigFile


def check_config_keys(parser: Any, value: str, fields: Iterable[str] = ()) -> None:
    """Raise a [UsageError][attnx.errors.UsageError] for a config file that does not exist, and for
    the first key of config file (or string) `value` that `parser` refuses as unknown."""
    import yaml

    from attnx.configs import not_found

    path = Path(value)
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8") if path.is_file() else value)
    except (OSError, ValueError, yaml.YAMLError):  # what jsonargparse read, it reads its own way
        return
    if not path.is_file() and not isinstance(values, dict):  # neither a file nor a config written inline
        raise UsageError(not_found(str(value)))
    defaults = parser.get_defaults()
    options = [key for key in defaults.keys() if key != "__path__"]  # noqa: SIM118 (a Namespace: nested keys)
    known = [*options, *fields]
    source = str(value) if path.is_file() else "--config"
    for key in unknown_keys(values, known):
        if refused(parser, defaults, options, key, values):
            raise unknown_key_error(source, key, known)


def refused(parser: Any, defaults: Any, options: list[str], key: str, values: dict[str, Any]) -> bool:
    """Whether `parser` refuses `key` of config `values`: as an unknown key (a `KeyError` of its own
    validation), or, for a key inside an option's value (`search.bem`), by refusing that value with the key
    and accepting it without."""
    owner = next((option for option in options if key.startswith(f"{option}.")), None)
    if owner is None:
        probe = defaults.clone()
        probe[key] = lookup(values, key)
        try:
            validate(parser, probe)
        except KeyError:
            return True
        except Exception:  # a bad value: jsonargparse says it in its own words
            return False
        return False
    given = copy.deepcopy(lookup(values, owner))
    inner, _, last = key.removeprefix(f"{owner}.").rpartition(".")
    without = copy.deepcopy(given)
    container = lookup(without, inner) if inner else without
    if not isinstance(container, dict):
        return False
    container.pop(last, None)
    return not accepts(parser, defaults, owner, given) and accepts(parser, defaults, owner, without)


def validate(parser: Any, config: Any) -> None:
    """jsonargparse's own check of `config`, as outside a parse: a config file is read in a lenient
    context that skips checking values, which a fresh `contextvars.Context` leaves behind."""
    contextvars.Context().run(parser.validate, config, skip_required=True)


def lookup(values: Any, key: str) -> Any:
    """The value at dotted `key` of nested mappings (None where there is none)."""
    for part in key.split("."):
        values = values.get(part) if isinstance(values, dict) else None
    return values


def accepts(parser: Any, defaults: Any, option: str, value: Any) -> bool:
    probe = defaults.clone()
    probe[option] = value
    try:
        validate(parser, probe)
    except Exception:  # any refusal: only the comparison with and without a key matters
        return False
    return True


def repeated_options(function: Callable[..., Any], argv: list[str]) -> list[str]:
    """An option whose type is a list, given several times, collects every value (`--config a --config b`
    is `[a, b]`, as jsonargparse's `--config+ b` appends), rather than keeping the last one."""
    from attnx.commands.spellings import list_options

    lists = list_options(function)
    given = [arg.split("=", 1)[0] for arg in argv]
    repeated = {option for option in lists if given.count(option) > 1}
    return [
        (arg.replace(option, f"{option}+", 1) if (option := arg.split("=", 1)[0]) in repeated else arg)
        for arg in argv
    ]


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


def refuse_to_replace(path: str | Path, force: bool, option: str = "--output") -> None:
    """A file already at `path` stays unless `force`: attnx cannot tell whether it wrote it (exit status 1)."""
    path = Path(path)
    if not force and (path.exists() or path.is_symlink()):
        raise FileExistsError(
            f"{option} {path} already exists and is left as it is; choose another {option}, or pass --force "
            "to replace it"
        )


EXTRAS = {"ct2": ("ctranslate2",), "hf": ("transformers", "safetensors"), "serve": ("litserve",)}
"""Each optional extra of attnx (`pip install "attnx[NAME]"`) and the modules it installs."""


def require_extra(extra: str, what: str) -> None:
    """A usage error (exit status 2, one line naming the extra to install) when `what` (e.g. `attnx export
    --format ctranslate2`) needs an optional extra that is not installed: never the ImportError's traceback."""
    import importlib

    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise UsageError(
                f'{what} needs {module}, which is not installed: pip install "attnx[{extra}]"'
            ) from None
