"""The one exception the data pipeline raises for bad input; commands print it without a traceback."""

from __future__ import annotations

from attnx.errors import AttnxError


class DataError(AttnxError, ValueError):
    """Input that cannot become a corpus: unreadable, misaligned, empty, or an impossible setting.

    The message names the file (and line, where there is one) and says what to do about it.
    """
