"""The commands behind `attnx <command>`: typed functions whose signatures are their options and whose
docstrings are their help. They import heavy libraries (torch, Lightning) only when they run, so `--help`
is quick. Nothing in the library imports from here but the Lightning commands (`attnx.training.cli`), which
share the parsing and help settings of [`attnx.commands.usage`][attnx.commands.usage].
"""

from __future__ import annotations

from attnx.commands.usage import configure_parsing, help_formatter

__all__ = ["configure_parsing", "help_formatter"]
