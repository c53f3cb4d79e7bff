"""Terminology constraints as users write them: per input line, phrases the translation must contain
(`include`, in any order or, with `ordered`, in the given one) and phrases it must not (`exclude`).

One line of a constraints file (`attnx translate --constraints`, `attnx test`) is either a JSON object,
`{"include": ["Bestellnummer"], "exclude": ["Auftragsnummer"], "ordered": false}`, or tab-separated phrases
to include (fairseq's `--constraints` rows without the source); a blank line has none. The Python API and
the server take the same object (or a list of phrases to include). Phrases are encoded with the model's
SentencePiece model, as a sentence is, and searched by [`lexical`][attnx.inference.lexical] and
[`constraints`][attnx.inference.constraints]; what cannot work is refused here in one line naming where
it came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.lengths import max_output_length
from attnx.inference.lexical import PhraseIds

__all__ = [
    "PhraseConstraints",
    "banned_phrases",
    "check_phrases",
    "encode_phrases",
    "parse_line",
    "to_constraints",
]

KEYS = ("include", "exclude", "ordered")


@dataclass(frozen=True)
class PhraseConstraints:
    """One input line's terminology constraints, as text."""

    include: tuple[str, ...] = ()
    """Phrases the translation must contain."""
    exclude: tuple[str, ...] = ()
    """Phrases the translation must not contain."""
    ordered: bool = False
    """The `include` phrases must appear in the given order."""

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)


def to_constraints(value: Any, where: str) -> PhraseConstraints:
    """`value` as constraints: a [`PhraseConstraints`][attnx.inference.phrases.PhraseConstraints], an object
    with `include`/`exclude`/`ordered`, a list of phrases to include, or None (none); `where` names it in
    the one-line error a bad value gets."""
    if value is None:
        return PhraseConstraints()
    if isinstance(value, PhraseConstraints):
        return to_constraints(
            {k: list(getattr(value, k)) if k != "ordered" else value.ordered for k in KEYS}, where
        )
    if isinstance(value, (list, tuple)):
        value = {"include": list(value)}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f'{where}: constraints must be an object like {{"include": ["..."], "exclude": ["..."]}} or a list '
            f"of phrases to include, got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown constraint key {unknown[0]!r}: the keys are include, exclude, ordered"
        )
    phrases = {}
    for key in ("include", "exclude"):
        items = value.get(key, [])
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
            raise ConfigError(f'{where}: "{key}" must be a list of phrases (strings), got {items!r}')
        for x in items:
            if not x.strip():
                raise ConfigError(f'{where}: an empty phrase in "{key}": give its words, or leave it out')
        phrases[key] = tuple(x.strip() for x in items)
    ordered = value.get("ordered", False)
    if not isinstance(ordered, bool):
        raise ConfigError(f'{where}: "ordered" must be true or false, got {ordered!r}')
    return PhraseConstraints(phrases["include"], phrases["exclude"], ordered)


def parse_line(line: str, where: str) -> PhraseConstraints:
    """One line of a constraints file: a JSON object, or tab-separated phrases to include; blank: none."""
    text = line.strip("\r\n")
    if not text.strip():
        return PhraseConstraints()
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f'{where}: not a JSON object ({err.msg} at column {err.colno}): write {{"include": ["..."]}} '
                "or tab-separated phrases"
            ) from None
        return to_constraints(value, where)
    return to_constraints(text.split("\t"), where)


def encode_phrases(
    encode: Callable[[list[str]], list[list[int]]], items: Sequence[PhraseConstraints], where: Sequence[str]
) -> list[PhraseIds | None]:
    """Target ids of every phrase (encoded as sentences are, all in one call); None for lines without any."""
    texts = [p for c in items for p in (*c.include, *c.exclude)]
    ids = iter(encode(texts) if texts else [])
    out: list[PhraseIds | None] = []
    for c, label in zip(items, where, strict=True):
        if not c:
            out.append(None)
            continue
        include = [next(ids) for _ in c.include]
        exclude = [next(ids) for _ in c.exclude]
        for phrase, x in zip((*c.include, *c.exclude), (*include, *exclude), strict=True):
            if not x:
                raise ConfigError(
                    f"{label}: the phrase {phrase!r} has no target pieces: give its words, or leave it out"
                )
        out.append(PhraseIds(include, exclude, c.ordered))
    return out


def contains(phrase: Sequence[int], part: Sequence[int]) -> bool:
    """Whether `part` occurs in `phrase` as consecutive ids."""
    n = len(part)
    return any(list(phrase[i : i + n]) == list(part) for i in range(len(phrase) - n + 1))


def check_phrases(
    constraints: Sequence[PhraseIds | None],
    sources: Sequence[Sequence[int]],
    prefixes: Sequence[Sequence[int]] | None,
    search: SearchConfig,
    where: Sequence[str] | None = None,
) -> None:
    """Refuse, in one line naming the input (`where`, default `input N`), constraints no search can meet:
    phrases to include beside sampling, more of them than the beam holds, more target pieces than the
    input's maximum output length, or a phrase to include that holds one to exclude."""
    labels = where if where is not None else [f"input {i + 1}" for i in range(len(constraints))]
    for i, c in enumerate(constraints):
        if c is None or not c.include or not sources[i]:  # a blank input is not searched
            continue
        label = labels[i]
        if search.samples:
            raise ConfigError(
                f"{label}: phrases to include need beam search: leave out --search.sampling (or MBR over "
                "samples); phrases to exclude work with sampling"
            )
        if len(c.include) >= search.beam:
            raise ConfigError(
                f"{label}: {len(c.include)} phrases to include need a beam of at least {len(c.include) + 1} "
                f"(a slot for each number of phrases met), the beam is {search.beam}: raise --search.beam to "
                f"{len(c.include) + 1} or give fewer phrases"
            )
        prefix = len(prefixes[i]) if prefixes is not None else 0
        need = prefix + sum(map(len, c.include))
        limit = max_output_length(
            len(sources[i]) + 1, search.max_len_a, search.max_len_b, search.max_positions
        )
        if need > limit:
            raise ConfigError(
                f"{label}: the phrases to include{' and the prefix' if prefix else ''} take {need} target pieces, "
                f"more than the {limit} this input may have (search.max_len_a * input length + search.max_len_b, "
                "within the model's positions): shorten them or raise --search.max_len_b"
            )
        for inc in c.include:
            for exc in c.exclude:
                if contains(inc, exc):
                    raise ConfigError(
                        f"{label}: a phrase to include contains one to exclude: no output can meet both"
                    )


def banned_phrases(
    ids: Sequence[Sequence[int]],
    prefixes: Sequence[Sequence[int]] | None,
    constraints: Sequence[PhraseIds | None] | None,
    engine: str,
    spell: Callable[[int], Any] = int,
) -> list[tuple[tuple[Any, ...], ...]]:
    """Per input of `ids`, its phrases to exclude (each token as `spell` writes it), for an `engine` that can
    ban phrases but not search for them: phrases to include, and prefixes or constraints that are not one
    per input, are refused in one line."""
    n = len(ids)
    if prefixes is not None and len(prefixes) != n:
        raise ConfigError(f"{len(prefixes)} prefixes for {n} inputs: give one per input")
    if constraints is None:
        return [()] * n
    if len(constraints) != n:
        raise ConfigError(f"{len(constraints)} constraints for {n} inputs: give one per input")
    if any(c is not None and c.include for c in constraints):
        raise ConfigError(
            f"{engine} cannot decode with phrases to include: decode the checkpoint (*.ckpt) it was made from"
        )
    return [tuple(tuple(map(spell, p)) for p in c.exclude) if c is not None else () for c in constraints]
