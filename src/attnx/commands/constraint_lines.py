"""Terminology constraints on the command line: `attnx translate --constraints FILE` (one JSON object or
tab-separated phrases per input line, [`phrases`][attnx.inference.phrases]) and `--constraint TEXT` (the same,
for every line), and the engine that can honour them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnx.errors import ConfigError
from attnx.inference.phrases import PhraseConstraints, parse_line

if TYPE_CHECKING:
    from attnx.inference.translator import Translator


class ConstraintLines:
    """Where each input line's constraints come from: a file read beside the input (`option` names it in
    errors), or one inline value for every line, or both refused together."""

    def __init__(self, file: str | None, inline: str | None, option: str = "--constraints") -> None:
        if file is not None and inline is not None:
            raise ConfigError(
                f"{option} gives each line its own constraints and --constraint one set for every line: give one"
            )
        self.file = file
        self.option = option
        self.inline = parse_line(inline, "--constraint") if inline is not None else None
        if inline is not None and not self.inline:
            raise ConfigError(
                '--constraint is blank: give phrases, e.g. --constraint \'{"include": ["..."]}\''
            )

    @property
    def given(self) -> bool:
        return self.file is not None or self.inline is not None

    def parse(self, lines: Sequence[str] | None, first: int, count: int) -> list[PhraseConstraints] | None:
        """The constraints of `count` input lines starting at line `first` (1-based): the file's `lines`, or the
        inline value repeated; None when none were given."""
        if self.inline is not None:
            return [self.inline] * count
        if lines is None:
            return None
        return [parse_line(text, self.where(first + i)) for i, text in enumerate(lines)]

    def where(self, line: int) -> str:
        """How errors name input line `line`'s constraints."""
        if self.file is None:
            return f"--constraint (input line {line})"
        return f"{self.option} {self.file} line {line}"


def phrase_engine(
    translator: Translator, model: str | Sequence[str], load: Callable[[Path], Translator], command: str
) -> Translator:
    """`translator`, or for a CTranslate2 model (which cannot search for phrases to include) attnx's own engine
    over the checkpoint the export was made from, when it lies beside the export, said in one line; else a
    one-line refusal."""
    from attnx.inference.ctranslate2 import CTranslate2Translator, read_metadata

    if not isinstance(translator, CTranslate2Translator):
        return translator
    directory = Path(model if isinstance(model, str) else model[0])
    name = (read_metadata(directory) or {}).get("source_checkpoint")
    checkpoint = directory.resolve().parent / name if isinstance(name, str) and name else None
    if checkpoint is None or not checkpoint.is_file():
        raise ConfigError(
            f"{directory} is a CTranslate2 model, which cannot decode with phrases to include (CTranslate2 has no "
            f"constrained beam search): give --model the checkpoint it was exported from"
            + (f" ({name})" if isinstance(name, str) and name else "")
        )
    print(
        f"{command}: {directory} is a CTranslate2 model, which cannot decode with phrases to include: decoding "
        f"with attnx's own engine from {checkpoint}, the checkpoint it was exported from",
        file=sys.stderr,
        flush=True,
    )
    return load(checkpoint)
