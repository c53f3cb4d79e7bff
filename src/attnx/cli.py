"""The `attnx` command: one table of subcommands, one parser (jsonargparse) for all of them.

`fit`, `validate`, `test` and `predict` are LightningCLI's (`attnx.commands.lightning`); every other
command is a typed function in `attnx.commands` whose signature is its schema and whose docstring is its
help, parsed the same way, so `--config`, `--print_config`, `ATTNX_<COMMAND>__<OPTION>` environment
defaults and error messages work alike everywhere.

Expected failures (a missing file, a bad option, a corrupt checkpoint, a diverged run, a full disk) print one
line on standard error and exit with the status the error carries ([attnx.errors][]): 2 (usage) or 1
(runtime); `--debug` (or `ATTNX_DEBUG=1`) shows the traceback instead.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from attnx.commands.usage import bare_flags, one_line, option_names, refused_command_line
from attnx.errors import AttnxError, expected_error

LIGHTNING_COMMANDS: dict[str, str] = {
    "fit": "train a model from a config (LightningCLI; e.g. attnx fit --config base)",
    "validate": "validation loss and BLEU of a checkpoint on a config's data (LightningCLI)",
    "test": "beam-search a config's test split with a checkpoint and score it with sacreBLEU (LightningCLI)",
    "predict": "beam-search a config's test split with a checkpoint and write the translations (LightningCLI)",
}

COMMANDS: dict[str, str] = {
    "download": "attnx.commands.data:download",
    "prepare": "attnx.commands.data:prepare",
    **dict.fromkeys(LIGHTNING_COMMANDS, "attnx.commands.lightning:main"),
    "average": "attnx.commands.models:average",
    "translate": "attnx.commands.translate:translate",
    "attention": "attnx.commands.translate:attention",
    "score": "attnx.commands.translate:score",
    "export": "attnx.commands.deploy:export",
    "serve": "attnx.commands.deploy:serve",
    "configs": "attnx.commands.models:configs",
    "plugins": "attnx.commands.models:plugins",
    "describe": "attnx.commands.describe:describe",
    "choices": "attnx.commands.choices:choices",
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


def run_function(name: str, argv: list[str]) -> int:
    """Parse `argv` against command `name`'s signature and run it.

    The `--search.*` options of a command whose function has an `own_search` (values → the model's own search
    settings, or None) change those settings, not SearchConfig's defaults: `--beam 2` on an export keeps the
    length penalty stored with it."""
    from jsonargparse import ArgumentError, ArgumentParser

    from attnx.commands.help import configure_parsing, help_formatter
    from attnx.commands.spellings import (
        alias_help,
        aliases,
        conflicting_values,
        list_options,
        several_values,
        with_aliases,
    )
    from attnx.commands.usage import config_file_action, repeated_options

    configure_parsing()
    function = command_function(name)
    doc = inspect.cleandoc(function.__doc__ or "")
    short = aliases(function)
    parser = ArgumentParser(
        prog=f"attnx {name}",
        description=doc.split("\n\nArgs:")[0] if doc else None,
        epilog=alias_help(short),
        default_env=True,
        env_prefix=f"ATTNX_{name.upper()}",
        exit_on_error=False,
        allow_abbrev=False,  # `--search.bem` is refused with "did you mean", never taken as a prefix
        formatter_class=help_formatter(),
    )
    config_file = "config" not in inspect.signature(function).parameters  # describe's --config: a model
    if config_file:
        parser.add_argument(
            "--config",
            action=config_file_action(tuple(name.removeprefix("--") for name in option_names(function))),
            help="a YAML file with values for these options",
        )
    conflicting_values(argv, short, list_options(function))
    argv = several_values(function, with_aliases(argv, short))
    argv = repeated_options(function, bare_flags(function, argv))
    positional = getattr(function, "positional_list", None)
    if positional:  # `attnx download a b --output x`: the names before the first option form one list
        count = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
        argv = [json.dumps(argv[:count]), *argv[count:]] if count else argv
    parser.add_function_arguments(function, as_group=False, as_positional=bool(positional))
    try:
        # a settings dataclass that refuses its values (e.g. --search.top_p 0) raises as it is instantiated
        parsed = parser.parse_args(argv)
        if (own_search := getattr(function, "own_search", None)) is not None:
            parsed = over_own_search(parser, parsed, argv, own_search)
        values = parser.instantiate(parsed).as_dict()
    except ArgumentError as err:
        if expected_error(err) is not None:  # a setting refused its value: `main` reports that error
            raise
        options = ["--config", "--print_config", "--help", *option_names(function), *short]
        raise refused_command_line(err, argv, options) from err
    if config_file:
        values.pop("config", None)
    result = function(**values)
    return int(result or 0)


def over_own_search(parser: Any, parsed: Any, argv: list[str], own_search: Callable[..., Any]) -> Any:
    """`parsed` (a namespace not yet instantiated) with its `search` settings made of those `argv` gives (on
    the command line, in a config file, in the environment) over the model's own, `own_search(values)`, where
    it has its own (an export: the settings stored with it; None: SearchConfig's defaults, as parsed). They
    are checked once layered: `--nbest 5` is right for an export stored with beam 5."""
    if parsed.get("search") is None or (own := own_search(parsed.as_dict())) is None:
        return parsed
    import dataclasses

    from jsonargparse import Namespace

    from attnx.inference.config import layered_search

    given = parser.parse_args(argv, defaults=False).get("search")
    layered = layered_search(own, given.as_dict() if given is not None else {})
    parsed["search"] = Namespace(**dataclasses.asdict(layered))
    return parsed


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
    status = run_command(sys.argv[1:] if argv is None else list(argv))
    if argv is None and status >= 128:
        # a process stopped by a signal, which it has said: a second Ctrl+C while the interpreter exits has
        # nothing left to stop, and would end it by SIGINT instead of this status (a traceback, at worst)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def run_command(argv: list[str]) -> int:
    """Run `attnx ARGV`; its exit status."""
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
            return command_function(name)([name, *rest])
        if name == "describe":  # fit's options, spelled as fit takes them
            from attnx.commands.spellings import component_names

            rest = component_names(rest)
        return run_function(name, rest)
    except Exception as err:
        shown = expected_error(err) or err  # the attnx error a library wrapped in its own, if any
        status = exit_status(shown)
        if status is None or debug:
            raise
        print(f"attnx {name}: error: {one_line(str(shown))}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print(f"attnx {name}: interrupted", file=sys.stderr)
        return 130


def exit_status(err: BaseException) -> int | None:
    """The exit status an [AttnxError][attnx.errors.AttnxError] carries (2 for usage, 1 for a runtime
    failure), 1 for what the system refused (a missing file, a full disk, a busy port: an `OSError`, which
    Python raises, not attnx), and None for a bug (traceback) and for a closed standard output (which `main`
    ends quietly)."""
    if isinstance(err, AttnxError):
        return err.exit_code
    if isinstance(err, OSError) and not isinstance(err, BrokenPipeError):
        return 1
    return None


if __name__ == "__main__":
    sys.exit(main())
