"""The `attnx` command: one table of subcommands, one parser (jsonargparse) for all of them.

`fit`, `validate`, `test` and `predict` are LightningCLI's (`attnx.training.cli`); every other
command is a typed function in `attnx.commands` whose signature is its schema and whose docstring is its
help, parsed the same way, so `--config`, `--print_config`, `ATTNX_<COMMAND>__<OPTION>` environment
defaults and error messages work alike everywhere.

Expected failures (a missing file, a bad option, a corrupt checkpoint, a diverged run, a full disk) print one
line on standard error and exit with 2 (usage) or 1 (runtime); `--debug` (or `ATTNX_DEBUG=1`) shows the
traceback instead.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from attnx.commands.usage import UsageError, bare_flags, one_line, option_names, suggest

LIGHTNING_COMMANDS: dict[str, str] = {
    "fit": "train a model from a config (LightningCLI; e.g. attnx fit --config base)",
    "validate": "validation loss and BLEU of a checkpoint on a config's data (LightningCLI)",
    "test": "beam-search a config's test split with a checkpoint and score it with sacreBLEU (LightningCLI)",
    "predict": "beam-search a config's test split with a checkpoint and write the translations (LightningCLI)",
}

COMMANDS: dict[str, str] = {
    "download": "attnx.commands.data:download",
    "prepare": "attnx.commands.data:prepare",
    **dict.fromkeys(LIGHTNING_COMMANDS, "attnx.training.cli:main"),
    "average": "attnx.commands.models:average",
    "translate": "attnx.commands.translate:translate",
    "attention": "attnx.commands.translate:attention",
    "score": "attnx.commands.translate:score",
    "export": "attnx.commands.deploy:export",
    "serve": "attnx.commands.deploy:serve",
    "configs": "attnx.commands.models:configs",
    "plugins": "attnx.commands.models:plugins",
    "describe": "attnx.commands.models:describe",
}
"""Command name → `module:function`; modules are imported only when their command runs."""


def command_function(name: str) -> Callable[..., Any]:
    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def summary(name: str) -> str:
    if name in LIGHTNING_COMMANDS:
        return LIGHTNING_COMMANDS[name]
    doc = command_function(name).__doc__ or ""
    return doc.strip().splitlines()[0].rstrip(".") if doc.strip() else ""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: attnx <command> [options]   (attnx <command> --help for a command's options)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {summary(name)}" for name in COMMANDS]
    lines += ["", "options: --version, --debug (show tracebacks; or ATTNX_DEBUG=1)"]
    return "\n".join(lines)


def debugging() -> bool:
    return os.environ.get("ATTNX_DEBUG", "") not in ("", "0")


def missing_config(message: str, argv: list[str]) -> str | None:
    """jsonargparse's error for a `--config` file that does not exist, in the words `attnx fit` uses."""
    from pathlib import Path

    from attnx.configs import not_found

    found = re.search(r"Parser key \"config\": File does not exist: '(.+?)'", message)
    if not found:
        return None
    given = [value for option, value in zip(argv, argv[1:], strict=False) if option == "--config"]
    given += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    name = next((value for value in given if Path(value).resolve() == Path(found.group(1))), found.group(1))
    return not_found(name)


def run_function(name: str, argv: list[str]) -> int:
    """Parse `argv` against command `name`'s signature and run it."""
    from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser

    from attnx.commands.usage import configure_parsing, help_formatter

    configure_parsing()
    function = command_function(name)
    doc = inspect.cleandoc(function.__doc__ or "")
    parser = ArgumentParser(
        prog=f"attnx {name}",
        description=doc.split("\n\nArgs:")[0] if doc else None,
        default_env=True,
        env_prefix=f"ATTNX_{name.upper()}",
        exit_on_error=False,
        formatter_class=help_formatter(),
    )
    config_file = "config" not in inspect.signature(function).parameters  # describe's --config: a model
    if config_file:
        parser.add_argument(
            "--config", action=ActionConfigFile, help="a YAML file with values for these options"
        )
    argv = bare_flags(function, argv)
    positional = getattr(function, "positional_list", None)
    if positional:  # `attnx download a b --output x`: the names before the first option form one list
        count = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
        argv = [json.dumps(argv[:count]), *argv[count:]] if count else argv
    parser.add_function_arguments(function, as_group=False, as_positional=bool(positional))
    try:
        config = parser.parse_args(argv)
    except ArgumentError as err:
        missing = missing_config(str(err), argv)
        if missing:
            raise UsageError(missing) from err
        options = ["--config", "--print_config", "--help", *option_names(function)]
        raise UsageError(suggest(one_line(str(err)), options)) from err
    try:
        values = parser.instantiate(config).as_dict()
    except ValueError as err:  # a settings dataclass refused its values (e.g. --search.top_p 0)
        raise UsageError(suggest(one_line(str(err)), option_names(function))) from err
    if config_file:
        values.pop("config", None)
    result = function(**values)
    return int(result or 0)


CLOSED_PIPE = 141
"""Exit status when the reader of standard output went away (`attnx ... | head`): 128 + SIGPIPE, what a
shell reports for `ls` or `git log` cut short the same way, so a pipeline with `set -o pipefail` sees
attnx as it sees them."""


def quiet_on_closed_pipe(run: Callable[..., int]) -> Callable[..., int]:
    """Exit with [CLOSED_PIPE][attnx.cli.CLOSED_PIPE] and no traceback when standard output is closed early.

    The recipe of Python's signal documentation: further writes (and the final flush) go to devnull.
    """

    @functools.wraps(run)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            status = run(*args, **kwargs)
            sys.stdout.flush()  # a pipe closed after the last write shows only here
            return status
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return CLOSED_PIPE

    return wrapper


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or debugging()
    if "--debug" in argv:
        argv.remove("--debug")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        from attnx import __version__

        print(f"attnx {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean `attnx {close[0]}`?" if close else ""
        print(f"attnx: error: unknown command {name!r}{hint} (`attnx --help` lists them)", file=sys.stderr)
        return 2
    try:
        if name in LIGHTNING_COMMANDS:
            from attnx.training.cli import main as lightning_main

            return lightning_main([name, *rest])
        return run_function(name, rest)
    except Exception as err:
        status = exit_status(err)
        if status is None or debug:
            raise
        print(f"attnx {name}: error: {one_line(str(err))}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print(f"attnx {name}: interrupted", file=sys.stderr)
        return 130


def exit_status(err: BaseException) -> int | None:
    """2 for a usage or config error, 1 for an expected runtime failure, None for a bug (traceback) and for
    a closed standard output (which `main` ends quietly)."""
    if isinstance(err, BrokenPipeError):
        return None
    from attnx.registry import ComponentArgumentError, DuplicateComponentError, UnknownComponentError

    usage_errors: tuple[type[BaseException], ...] = (
        UsageError,
        UnknownComponentError,
        DuplicateComponentError,
        ComponentArgumentError,
    )
    try:
        from jsonargparse import ArgumentError

        usage_errors += (ArgumentError,)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(err, usage_errors):
        return 2
    if (
        type(err) is ValueError
    ):  # what attnx raises for impossible settings (e.g. d_model not divisible by heads)
        return 2
    runtime: list[type[BaseException]] = [OSError]
    for module, names in {
        "attnx.data.errors": ["DataError"],
        "attnx.checkpoint": ["CheckpointError"],
        "attnx.training.module": ["NonFiniteLossError"],
        "attnx.export.common": ["ExportError"],
    }.items():
        if module in sys.modules:
            runtime += [getattr(sys.modules[module], n) for n in names]
    if isinstance(err, tuple(runtime)):
        return 1
    config_errors = [
        getattr(sys.modules[m], n)
        for m, n in (("attnx.training.cli", "ConfigError"), ("attnx.configs", "ConfigNotFound"))
        if m in sys.modules and hasattr(sys.modules[m], n)
    ]
    if config_errors and isinstance(err, tuple(config_errors)):
        return 2
    return None


if __name__ == "__main__":
    sys.exit(main())
