"""The one way to translate: the [`Translator`][attnx.inference.translator.Translator] protocol, which every
decoding engine implements and [`attnx.load`][attnx.inference.load.load] returns.

Every command that decodes — `attnx translate`, `attnx attention`, `attnx test`/`predict`, validation
BLEU during `attnx fit`, the HTTP server — and the Python API go through a Translator:

```python
import attnx

translator = attnx.load("averaged.ckpt")
translator.translate(["A dog runs."])
```

Two engines implement it: [`EagerTranslator`][attnx.inference.eager.EagerTranslator] (the model in PyTorch, for
a checkpoint) and [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator] (a directory of
`attnx export --format ctranslate2`). An engine decodes ids (`translate_ids`); the text side — encoding,
truncating what the model cannot read, one output line per input line, blank for blank — is written once here.
A Translator batches its input by tokens, truncates inputs longer than the model accepts (with a warning),
returns one output per input in input order, and maps blank input to blank output. Nothing here needs
Lightning.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Protocol, Self

import torch

from attnx.data.tokenizer import Tokenizer
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig

__all__ = ["DEFAULT_MAX_TOKENS", "Translator", "encode_lines", "one_line", "truncate_ids"]

log = logging.getLogger(__name__)


def one_line(text: str) -> str:
    """Keep a translation on one output line whatever the detokenizer produced."""
    return text.replace("\r", " ").replace("\n", " ").strip()


def encode_lines(tokenizer: Tokenizer, lines: Sequence[str]) -> list[list[int]]:
    """Source ids of `lines` (stripped; blank lines give `[]`)."""
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    ids: list[list[int]] = [[] for _ in texts]
    for i, x in zip(todo, tokenizer.encode_batch([texts[i] for i in todo]) if todo else [], strict=True):
        ids[i] = x
    return ids


def truncate_ids(ids: Sequence[Sequence[int]], max_positions: int) -> list[list[int]]:
    """Cut inputs a model of `max_positions` cannot read (the source `</s>` takes one), with one warning."""
    limit = max_positions - 1
    too_long = [i + 1 for i, x in enumerate(ids) if len(x) > limit]
    if too_long:
        shown = ", ".join(map(str, too_long[:10])) + (" ..." if len(too_long) > 10 else "")
        log.warning(
            "%d input(s) exceed the model's %d positions and were truncated to %d tokens: input %s",
            len(too_long),
            max_positions,
            limit,
            shown,
        )
    return [list(x[:limit]) for x in ids]


def fitted_search(search: SearchConfig, max_positions: int) -> SearchConfig:
    """`search` checked (beam ≥ 1) and capped to a model of `max_positions` target positions."""
    if search.beam < 1:
        raise ValueError(f"search.beam must be at least 1, got {search.beam}")
    if search.max_positions is None or search.max_positions > max_positions:
        search = dataclasses.replace(search, max_positions=max_positions)
    return search


class Translator(Protocol):
    """A decoding engine behind attnx's calls: a model, its tokenizer and how to search.

    An engine provides `search`, `tokenizer`, `max_positions`, `device`, `translate_ids`, `to` and
    `with_search`; `encode`, `truncate`, `decode` and `translate` are the same for every engine and
    come with this protocol to classes that name it as a base.
    """

    search: SearchConfig
    """How to decode; `max_positions` is the model's own limit."""
    tokenizer: Tokenizer
    """The joint SentencePiece model the model was trained with."""
    max_positions: int
    """Positions the model accepts on each side."""

    @property
    def device(self) -> torch.device: ...

    def translate_ids(self, ids: Sequence[Sequence[int]], progress: bool = False) -> list[list[int]]:
        """Output ids for source ids (no BOS/EOS), one per input in input order; `[]` in gives `[]` out."""
        ...

    def to(self, device: str | torch.device) -> Self:
        """Decode on `device` from now on and return this translator."""
        ...

    def with_search(self, **changes: Any) -> Self:
        """A translator sharing this one's model, with some search settings changed (e.g. `beam=1`)."""
        ...

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids of `lines` (stripped; blank lines give `[]`)."""
        return encode_lines(self.tokenizer, lines)

    def truncate(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Cut inputs the model cannot read (`max_positions` with the source `</s>`), with one warning."""
        return truncate_ids(ids, self.max_positions)

    def decode(self, ids: Sequence[int]) -> str:
        return one_line(self.tokenizer.decode(list(ids)))

    def translate(self, lines: Sequence[str] | str, progress: bool = False) -> list[str]:
        """Translations of `lines` (one segment each), same number and order; blank in gives blank out."""
        if isinstance(lines, str):
            raise TypeError("translate takes a list of lines; wrap a single sentence: translate([text])")
        outputs = self.translate_ids(self.encode(lines), progress=progress)
        return [self.decode(x) if line.strip() else "" for line, x in zip(lines, outputs, strict=True)]

    def __call__(self, lines: Sequence[str]) -> list[str]:
        return self.translate(lines)
