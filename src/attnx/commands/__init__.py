"""The commands behind ``attnx <command>``: typed functions whose signatures are their options and whose
docstrings are their help. They import heavy libraries (torch, Lightning) only when they run, so ``--help``
is quick; nothing in the library imports from here.
"""

from __future__ import annotations

import functools


@functools.cache
def configure_parsing() -> None:
    """Read option help from Google-style docstrings and from dataclass attribute docstrings."""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
