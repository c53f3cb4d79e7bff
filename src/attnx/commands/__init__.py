"""The commands behind `attnx <command>`: typed functions whose signatures are their options and whose
docstrings are their help. They import heavy libraries (torch, Lightning) only when they run, so `--help`
is quick; nothing in the library imports from here but the Lightning commands (`attnx.training.cli`), which
share these parsing and help settings.
"""

from __future__ import annotations

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
    text = re.sub(r"`(.+?)`", r"`\1`", text, flags=re.DOTALL)
    text = re.sub(r":(?:[a-z]+:)?[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)
