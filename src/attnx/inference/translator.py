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
`attnx export --format ctranslate2`). An engine searches and scores ids (`generate_ids`, `score_ids`), returning
[`Hypothesis`][attnx.inference.hypothesis.Hypothesis] objects; the text side — encoding, truncating what the
model cannot read, one result per input line, blank for blank, detokenizing every hypothesis — is written once
here:

```python
translator = attnx.load("averaged.ckpt", search=attnx.SearchConfig(beam=5, nbest=3))
for hyp in translator.generate(["A dog runs."])[0]:  # best first
    print(hyp.score, hyp.log_prob, hyp.text)
translator.score(["A dog runs."], ["Ein Hund rennt."])[0].log_prob  # forced scoring
```

A Translator batches its input by tokens, truncates inputs longer than the model accepts (with a warning),
returns one result per input in input order, and maps blank input to blank output. Nothing here needs
Lightning.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, Self

import torch

from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lexical import PhraseIds
from attnx.inference.mbr import check_memory
from attnx.inference.phrases import (
    PhraseConstraints,
    check_phrases,
    encode_phrases,
    read_constraint,
    unmet_lines,
    unmet_warnings,
)

__all__ = ["DEFAULT_MAX_TOKENS", "Hypothesis", "Translator", "encode_lines", "one_line", "truncate_ids"]

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


def truncate_ids(ids: Sequence[Sequence[int]], max_positions: int, what: str = "input") -> list[list[int]]:
    """Cut `what`s (inputs, targets, prefixes) a model of `max_positions` cannot read (the `</s>` or `<s>`
    takes one), with one warning."""
    limit = max_positions - 1
    too_long = [i + 1 for i, x in enumerate(ids) if len(x) > limit]
    if too_long:
        shown = ", ".join(map(str, too_long[:10])) + (" ..." if len(too_long) > 10 else "")
        log.warning(
            "%d %s(s) exceed the model's %d positions and were truncated to %d tokens: %s %s",
            len(too_long),
            what,
            max_positions,
            limit,
            what,
            shown,
        )
    return [list(x[:limit]) for x in ids]


def fitted_search(search: SearchConfig, max_positions: int) -> SearchConfig:
    """`search` capped to a model of `max_positions` target positions (the settings are checked by
    `SearchConfig`; a beam beside sampling is said in one line), or a usage error when its MBR table would not
    fit this machine's memory."""
    check_memory(search)
    if (unused := search.unused_beam()) is not None:
        log.warning("%s (sampling goes on without it)", unused)
    if search.max_positions is None or search.max_positions > max_positions:
        search = dataclasses.replace(search, max_positions=max_positions)
    return search


def blank(phrases: PhraseIds | None = None) -> list[Hypothesis]:
    """What a blank input line gives: one empty hypothesis, which lists every phrase it was to include as
    `unmet` (nothing is searched for a blank line)."""
    unmet = list(range(len(phrases.include))) if phrases is not None and phrases.include else None
    return [Hypothesis([], 0.0, 0.0, text="", unmet=unmet)]


def per_line(constraints: Iterable[Any], lines: int) -> list[Any]:
    """`constraints` (any iterable) as a list of one entry per line, or a usage error in one line."""
    if isinstance(constraints, (str, Mapping, PhraseConstraints)):
        raise ConfigError(
            f"constraints takes one entry (or None) per line, in a list: {lines} lines; wrap one line's: [value]"
        )
    try:
        given = list(constraints)
    except TypeError:
        raise ConfigError(
            f"constraints must be a list with one entry (or None) per line, got {type(constraints).__name__}"
        ) from None
    if len(given) != lines:
        raise ConfigError(f"{len(given)} constraints entries for {lines} lines: give one (or None) per line")
    return given


class Translator(Protocol):
    """A decoding engine behind attnx's calls: a model, its tokenizer and how to search.

    An engine provides `search`, `tokenizer`, `max_positions`, `device`, `generate_ids`, `score_ids`, `to`
    and `with_search`; `encode`, `truncate`, `decode`, `generate`, `score`, `translate` and `translate_ids`
    are the same for every engine and come with this protocol to classes that name it as a base.
    """

    search: SearchConfig
    """How to decode; `max_positions` is the model's own limit."""
    tokenizer: Tokenizer
    """The joint SentencePiece model the model was trained with."""
    max_positions: int
    """Positions the model accepts on each side."""

    @property
    def device(self) -> torch.device: ...

    def generate_ids(
        self,
        ids: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]] | None = None,
        progress: bool = False,
        scores: bool = True,
        constraints: Sequence[PhraseIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per input (source ids, no BOS/EOS, already truncated), `search.nbest` hypotheses best first, `text`
        left empty; `[]` in gives `[Hypothesis([], 0.0, 0.0)]`. `prefixes`: target ids each must start with.
        `constraints`: per input, target phrases its translations must and must not contain (None: none).
        `scores=False`: only the tokens are wanted, and an engine whose numbers cost an extra pass may skip it
        (CTranslate2: `score` is then its own search score, `log_prob` NaN)."""
        ...

    def score_ids(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
    ) -> list[Hypothesis]:
        """Forced scoring of `targets[i]` as the translation of `sources[i]` (ids, already truncated), `text` empty."""
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

    def truncate(self, ids: Sequence[Sequence[int]], what: str = "input") -> list[list[int]]:
        """Cut inputs the model cannot read (`max_positions` with the source `</s>`), with one warning."""
        return truncate_ids(ids, self.max_positions, what)

    def decode(self, ids: Sequence[int]) -> str:
        return one_line(self.tokenizer.decode(list(ids)))

    def translate_ids(self, ids: Sequence[Sequence[int]], progress: bool = False) -> list[list[int]]:
        """Best output ids for source ids (no BOS/EOS), one per input in input order; `[]` in gives `[]` out."""
        results = self.generate_ids(self.truncate(ids), progress=progress, scores=False)
        return [hyps[0].tokens for hyps in results]

    def generate(
        self,
        lines: Sequence[str],
        prefixes: Sequence[str] | None = None,
        progress: bool = False,
        scores: bool = True,
        constraints: Iterable[Any] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per line, `search.nbest` hypotheses best first (with sampling: `nbest` samples), `text` filled; a
        blank line gives one empty hypothesis. `prefixes`: per line, the start every translation of it must
        have (blank: none). `scores=False`: only the texts are wanted (see `generate_ids`). `constraints`: any
        iterable of one entry per line, terminology constraints ([`phrases`][attnx.inference.phrases]): a list
        of phrases the translation must contain, `{"include": [...], "exclude": [...], "ordered": false}`, a
        string read as a line of a constraints file (`"Hund"`, `"Hund\\tKatze"`, `'["Hund"]'`), or None; a
        hypothesis the maximum length ended before it met them, or a blank line's, lists them in `unmet`."""
        if isinstance(lines, str):
            raise TypeError("generate takes a list of lines; wrap a single sentence: generate([text])")
        prefix_ids = None
        if prefixes is not None:
            if isinstance(prefixes, str) or len(prefixes) != len(lines):
                raise ConfigError(f"give one prefix per line: {len(lines)} lines")
            prefix_ids = self.truncate(self.encode(prefixes), "prefix")
        sources = self.truncate(self.encode(lines))
        phrase_ids = None
        if constraints is not None:
            given = per_line(constraints, len(lines))
            where = [f"constraints of line {i + 1}" for i in range(len(lines))]
            items = [read_constraint(c, label) for c, label in zip(given, where, strict=True)]
            phrase_ids = encode_phrases(self.encode, items, where)
            check_phrases(phrase_ids, sources, prefix_ids, self.search, where)
        results = self.generate_ids(sources, prefix_ids, progress, scores, constraints=phrase_ids)
        unmet = unmet_lines(phrase_ids, [h[0].unmet if h else None for h in results], sources, self.search)
        for warning in unmet_warnings(unmet, self.search, "search."):  # Hypothesis.unmet names the phrases
            log.warning("%s", warning)
        for line, hyps in zip(lines, results, strict=True):
            for hyp in hyps:
                hyp.text = self.decode(hyp.tokens) if line.strip() else ""
        return results

    def score(self, sources: Sequence[str], targets: Sequence[str]) -> list[Hypothesis]:
        """Forced scoring: per pair, the model's log-probability of `targets[i]` as the translation of
        `sources[i]` (`log_prob`, `token_log_probs`, the `score` the search would rank it by, and the alignment
        when `search.alignment`). Every pair is scored, blank ones included (a blank target is `</s>` alone)."""
        if isinstance(sources, str) or isinstance(targets, str):
            raise TypeError("score takes lists of lines; wrap a single pair: score([source], [target])")
        if len(sources) != len(targets):
            raise ConfigError(
                f"{len(targets)} targets for {len(sources)} sources: give one target per source"
            )
        hyps = self.score_ids(
            self.truncate(self.encode(sources)), self.truncate(self.encode(targets), "target")
        )
        for hyp in hyps:
            hyp.text = self.decode(hyp.tokens)
        return hyps

    def translate(
        self, lines: Sequence[str] | str, progress: bool = False, constraints: Iterable[Any] | None = None
    ) -> list[str]:
        """Translations of `lines` (one segment each), same number and order; blank in gives blank out.
        `constraints`: per line, phrases to include and exclude (see `generate`)."""
        if isinstance(lines, str):
            raise TypeError("translate takes a list of lines; wrap a single sentence: translate([text])")
        results = self.generate(lines, progress=progress, scores=False, constraints=constraints)
        return [hyps[0].text for hyps in results]

    def __call__(self, lines: Sequence[str]) -> list[str]:
        return self.translate(lines)
