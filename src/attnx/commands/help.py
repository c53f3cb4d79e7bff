"""How every command's `--help` is read from docstrings and shown: one parser setting and one help formatter
for the typed-function commands and the LightningCLI ones alike."""

from __future__ import annotations

import copy
import functools
import re
from typing import Any


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
    (two colons) ends in one colon ([plain_help][attnx.commands.help.plain_help]). An option whose value has
    a default is not called required: a component's `name` reads `(type: str, default: multihead)`, not
    `(required, type: str, default: multihead)`.
    """
    from argparse import SUPPRESS

    from jsonargparse import DefaultHelpFormatter

    class HelpFormatter(DefaultHelpFormatter):
        def _get_help_string(self, action: Any) -> str:
            if action.required and action.default not in (None, SUPPRESS):
                action = copy.copy(action)  # described as optional; the parser's own action stays required
                action.required = False
            return super()._get_help_string(action)

        def format_help(self) -> str:
            return plain_help(super().format_help())

    return HelpFormatter


# Lightning's and PyTorch's docstrings, which jsonargparse shows as option help, are reStructuredText, and
# neither jsonargparse nor docstring_parser renders it: its markup is rewritten here, by the syntax of reST
# (tests/commands/test_help.py pins that Lightning's Trainer still writes it;
# tests/docs/test_cli_reference.py that no help shows any).
REST_LITERAL = re.compile(r"``(.+?)``", flags=re.DOTALL)
SPHINX_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`~?([^`]+)`")
LITERAL_BLOCK_MARKER = re.compile(r"(?<=\S)::$", flags=re.MULTILINE)


def plain_help(text: str) -> str:
    """Help text with reST inline literals and Sphinx roles (such as `:class:`) as Markdown code, and no
    reST literal-block markers."""
    text = REST_LITERAL.sub(r"`\1`", text)
    text = SPHINX_ROLE.sub(r"`\1`", text)
    return LITERAL_BLOCK_MARKER.sub(":", text)
