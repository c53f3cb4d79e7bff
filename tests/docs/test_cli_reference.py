"""docs/cli.md is the live ``--help`` of every ``attnx`` command, so the page cannot drift from the CLI.

Regenerate it after changing a command's options:

    python -m tests.docs.test_cli_reference

The help texts are captured in one fresh interpreter (commands in table order, 80 columns), so what
LightningCLI lists as "known subclasses" does not depend on what the test session has imported.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from attnx.cli import COMMANDS, summary
from tests.conftest import REPO

PAGE = REPO / "docs" / "cli.md"
COLUMNS = "80"  # a code block shows 80 columns whole in a 1280-pixel window
COLLAPSE_AFTER = 60  # lines: longer help texts are folded so the page stays readable

CAPTURE = """
import contextlib, io, json, sys
from attnx.cli import COMMANDS, main
texts = {}
for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(argv)
        except SystemExit:
            pass
    texts[" ".join(argv[:-1])] = out.getvalue()
json.dump(texts, sys.stdout)
"""

INTRO = """\
# CLI reference

Every `attnx` command with its `--help`, exactly as the installed version prints it (80 columns wide).
This page is generated: `tests/docs/test_cli_reference.py` fails when it differs from the live help, and
`python -m tests.docs.test_cli_reference` rewrites it.

Every command is parsed the same way (jsonargparse): `--config FILE` takes the options from a YAML file,
`--print_config` prints them, and `ATTNX_<COMMAND>_<OPTION>` environment variables set defaults.
`fit`, `validate`, `test` and `predict` are LightningCLI subcommands: every key of a config can also be given
on the command line (`--trainer.max_steps 1000`, `--model.transformer.dropout 0.3`), several `--config` files
are merged in order, and `--config NAME` takes a packaged config (`attnx configs` lists them). See
[Configs](configs.md). Options are spelt out whole: an abbreviation is refused with the option it may mean
(`--trainer.max_step: did you mean --trainer.max_steps?`), and one option given twice with different values,
under any of its spellings, is refused naming both (`--beam 2 and --search.beam 5 both set --search.beam: give
it once`); a list option given twice collects both values, and each `--config` is read over the ones before. A
failure prints one line and exits with 2 (usage, config) or 1 (data, checkpoint,
diverged run); `--debug` shows the traceback. Output cut short by a closed pipe (`attnx configs | head -1`)
ends quietly with status 141 (128 + SIGPIPE), as a shell reports for `ls` or `git log` cut short.
"""


def live_help() -> dict[str, str]:
    env = os.environ | {"COLUMNS": COLUMNS, "LINES": "50"}
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE], env=env, capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


SPHINX_ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|obj|paramref|ref):`~?([^`]+)`")


def fence(text: str) -> str:
    """A help text as a code block; Sphinx roles in Lightning's own docstrings show as the bare name."""
    return "```text\n" + SPHINX_ROLE.sub(r"\1", text.rstrip()) + "\n```\n"


def render(texts: dict[str, str]) -> str:
    parts = [INTRO, "\n## attnx\n\n", fence(texts[""])]
    for name in COMMANDS:
        text, line = texts[name], summary(name)
        parts.append(f"\n## attnx {name}\n\n{line[0].upper() + line[1:]}.\n\n")
        if text.count("\n") > COLLAPSE_AFTER:
            parts.append(f'??? note "attnx {name} --help ({text.count(chr(10))} lines)"\n\n')
            parts.append(textwrap.indent(fence(text), "    "))
        else:
            parts.append(fence(text))
    return "".join(parts)


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return live_help()


def test_every_command_prints_help(texts):
    for name in COMMANDS:
        assert texts[name].startswith("usage:"), f"attnx {name} --help:\n{texts[name][-2000:]}"


def test_cli_page_is_the_live_help(texts):
    expected = render(texts)
    assert PAGE.read_text(encoding="utf-8") == expected, (
        f"{PAGE.relative_to(REPO)} differs from the live --help; run `python -m tests.docs.test_cli_reference`"
    )


REST_LEFTOVER = re.compile(
    r"``|\S::$|:(?:func|class|meth|data|mod|attr|obj|paramref|ref|exc):`", re.MULTILINE
)
"""reST that a terminal shows raw: an inline literal, a literal-block marker, a Sphinx role."""


def test_no_restructuredtext_in_any_help(texts):
    for name, text in texts.items():
        found = [m.group(0) for m in REST_LEFTOVER.finditer(text)]
        assert not found, f"attnx {name} --help shows reST: {found[:5]}"


def option_help(text: str) -> dict[str, str]:
    """`--option` → its help text, from an argparse help page."""
    helps: dict[str, str] = {}
    option = None
    for line in text.splitlines():
        entry = re.match(r"^  (?:ARG:\s+)?(--[\w.]+)(?: [A-Z_{},.\[\]|]+)*(?:\s{2,}(.*))?$", line)
        if entry:
            option = entry.group(1)
            helps[option] = entry.group(2) or ""
        elif option and line.startswith("  ENV:"):  # the option's environment variable
            continue
        elif option and line.startswith(" " * 24):
            helps[option] = (helps[option] + " " + line.strip()).strip()
        else:
            option = None
    return helps


def test_every_option_of_every_command_has_a_description(texts):
    fit = option_help(texts["fit"])
    assert {"--model.transformer.d_model", "--evaluation.search.beam", "--model.loss.name"} <= set(fit)
    for name, text in texts.items():
        for option, help_text in option_help(text).items():
            assert help_text and not help_text.startswith("("), (
                f"attnx {name} --help: {option} has no description"
            )


def test_a_component_name_with_a_default_is_not_called_required(texts):
    names = {k: v for k, v in option_help(texts["fit"]).items() if k.endswith(".name")}
    assert len(names) == 6  # five model components and the loss
    for option, help_text in names.items():
        assert "required" not in help_text and "default: " in help_text, f"{option}: {help_text}"


if __name__ == "__main__":
    PAGE.write_text(render(live_help()), encoding="utf-8")
    print(f"wrote {PAGE}")
