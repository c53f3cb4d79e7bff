"""Terminology constraints as users write them: per input line, phrases the translation must contain
(`include`, in any order or, with `ordered`, in the given one) and phrases it must not (`exclude`).

One reader, [`read_constraint`][attnx.inference.phrases.read_constraint], serves every entry point: a line
of a constraints file (`attnx translate --constraints`, `--constraint`, `attnx test`), a value of the Python
API (`Translator.translate(lines, constraints=...)`) and an item of a server request. A line
([`parse_line`][attnx.inference.phrases.parse_line]) is JSON when it parses as one of these:

* an object, `{"include": ["Bestellnummer"], "exclude": ["Auftragsnummer"], "ordered": false}`;
* an array of phrases to include, `["Bestellnummer", "Lieferschein"]`;
* `null`: none;
* a string, `"Bestellnummer"`: one phrase to include.

Any other line is tab-separated phrases to include (fairseq's `--constraints` rows without the source), so a
line `1984` or `true` is that phrase; a line that starts with `{` or `[` and is not valid JSON is refused. A
blank line has none, and one byte-order mark (U+FEFF) before a line is dropped. Only `\\n` ends a line: a
U+2028 or any other Unicode line separator is part of the line (and, in a JSON string, of the phrase). The
API and the server take the same values decoded (a dict, a list, None), and a string is read as a line of the
file. Phrases are encoded with the model's SentencePiece model, as a sentence is, and searched by
[`lexical`][attnx.inference.lexical] and [`constraints`][attnx.inference.constraints]; what cannot work is
refused here in one line naming where it came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnx.data.batch import UNK_ID
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig, SearchSettingError
from attnx.inference.lengths import max_output_length
from attnx.inference.lexical import PhraseIds
from attnx.inference.terms import surface_contains

__all__ = [
    "PhraseConstraints",
    "banned_phrases",
    "check_phrases",
    "encode_phrases",
    "parse_line",
    "read_constraint",
    "repeats_run",
    "to_constraints",
    "unmet_lines",
    "unmet_reason",
    "unmet_warnings",
]

KEYS = ("include", "exclude", "ordered", "whole_words")

BOM = "\ufeff"
"""The byte-order mark some editors write before a file's first line; dropped once before a line."""


@dataclass(frozen=True)
class PhraseConstraints:
    """One input line's terminology constraints, as text."""

    include: tuple[str, ...] = ()
    """Phrases the translation must contain."""
    exclude: tuple[str, ...] = ()
    """Phrases the translation must not contain."""
    ordered: bool = False
    """The `include` phrases must appear in the given order."""
    whole_words: bool = True
    """The phrases count as whole words only (False: also inside longer words, e.g. compounds)."""

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)


def to_constraints(value: Any, where: str) -> PhraseConstraints:
    """`value`, decoded, as constraints: a [`PhraseConstraints`][attnx.inference.phrases.PhraseConstraints], an
    object with `include`/`exclude`/`ordered`, a list of phrases to include, one phrase to include (a string),
    or None (none); `where` names it in the one-line error a bad value gets."""
    if value is None:
        return PhraseConstraints()
    if isinstance(value, PhraseConstraints):
        return to_constraints(
            {k: list(v) if isinstance(v := getattr(value, k), tuple) else v for k in KEYS}, where
        )
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)):
        value = {"include": list(value)}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f'{where}: constraints must be an object like {{"include": ["..."], "exclude": ["..."]}}, a list '
            f"of phrases to include, one phrase or null, got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown constraint key {unknown[0]!r}: the keys are include, exclude, ordered, whole_words"
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
    flags = {key: value.get(key, key == "whole_words") for key in ("ordered", "whole_words")}
    for key, flag in flags.items():
        if not isinstance(flag, bool):
            raise ConfigError(f'{where}: "{key}" must be true or false, got {flag!r}')
    return PhraseConstraints(phrases["include"], phrases["exclude"], **flags)


def parse_line(line: str, where: str) -> PhraseConstraints:
    """One line of a constraints file: a JSON object, array, string or `null`, else tab-separated phrases to
    include; blank: none (the forms of the module docstring)."""
    text = line.removeprefix(BOM).strip("\r\n")
    if not text.strip():
        return PhraseConstraints()
    try:  # not strict: a control character inside a string is part of the phrase, as a line separator is
        value = json.loads(text, strict=False)
    except json.JSONDecodeError as err:
        start = text.lstrip()[:1]
        if start in ("{", "["):
            raise ConfigError(
                f"{where}: not a JSON {'object' if start == '{' else 'array'} ({err.msg} at column {err.colno}): "
                'write {"include": ["..."]}, ["...", "..."] or tab-separated phrases'
            ) from None
    else:
        if value is None or isinstance(value, (dict, list, str)):
            return to_constraints(value, where)
    return to_constraints(text.split("\t"), where)  # a number or true/false is a phrase, as any other text


def read_constraint(value: Any, where: str) -> PhraseConstraints:
    """One input line's constraints from any entry point: a string is read as a line of a constraints file
    ([`parse_line`][attnx.inference.phrases.parse_line]), any other value as decoded JSON
    ([`to_constraints`][attnx.inference.phrases.to_constraints])."""
    if isinstance(value, str):
        return parse_line(value, where)
    return to_constraints(value, where)


def encode_phrases(
    encode: Callable[[list[str]], list[list[int]]], items: Sequence[PhraseConstraints], where: Sequence[str]
) -> list[PhraseIds | None]:
    """Target ids of every phrase (encoded as sentences are, all in one call); None for lines without any. A
    phrase with characters the model has no piece for is refused in one line naming them: no output could
    contain it."""
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
            if UNK_ID in x:
                raise ConfigError(
                    f"{label}: the phrase {phrase!r} has characters the model cannot write "
                    f"({unwritable(encode, phrase)}): no translation can contain it; leave them out, or use a "
                    "model whose vocabulary has them"
                )
        for inc in c.include:
            for exc in c.exclude:
                if surface_contains(" ".join(inc.split()), " ".join(exc.split()), c.whole_words):
                    raise ConfigError(
                        f"{label}: the phrase to include {inc!r} contains the one to exclude {exc!r}: no output "
                        "can meet both"
                    )
        out.append(PhraseIds(include, exclude, c.ordered, whole_words=c.whole_words))
    return out


def unwritable(encode: Callable[[list[str]], list[list[int]]], phrase: str) -> str:
    """The characters of `phrase` the model writes as `<unk>`, named with their code points."""
    chars = sorted({ch for ch in phrase if not ch.isspace()})
    bad = [ch for ch, x in zip(chars, encode(chars), strict=True) if UNK_ID in x]
    return ", ".join(f"{ch!r} U+{ord(ch):04X}" for ch in bad) or "written as <unk>"


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
            raise SearchSettingError(
                f"{label}: {len(c.include)} phrases to include need a beam of at least {len(c.include) + 1} "
                f"(a slot for each number of phrases met), the beam is {search.beam}: raise ",
                "beam",
                f" to {len(c.include) + 1} or give fewer phrases",
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
        # phrases as whole words: encode_phrases compared their texts (an id run inside a compound's ids is no
        # word of it); matched anywhere, a run of ids inside another phrase's is text inside its text
        for inc in c.include if not c.whole_words else ():
            for exc in c.exclude:
                if contains(inc, exc):
                    raise ConfigError(
                        f"{label}: a phrase to include contains one to exclude: no output can meet both"
                    )


def repeats_run(phrases: PhraseIds, which: int, n: int) -> bool:
    """Whether phrase to include `which` of `phrases`, as its pieces spell it, holds a run of `n` pieces twice
    or shares one with another phrase of the line: what `no_repeat_ngram` `n` keeps from being written so."""
    grams = [[tuple(phrase[k : k + n]) for k in range(len(phrase) - n + 1)] for phrase in phrases.include]
    own = grams[which]
    others = {g for j, runs in enumerate(grams) if j != which for g in runs}
    return len(set(own)) < len(own) or any(g in others for g in own)


def unmet_reason(
    phrases: PhraseIds | None, unmet: Sequence[int] | None, source: Sequence[int], search: SearchConfig
) -> str | None:
    """Why a translation of `source` (its ids) left out its phrases to include `unmet`
    ([`Hypothesis.unmet`][attnx.inference.hypothesis.Hypothesis]): `blank` (a blank input is not
    searched), `no_repeat_ngram` (one of them repeats a run of `search.no_repeat_ngram` pieces,
    [`repeats_run`][attnx.inference.phrases.repeats_run]) or `length` (the maximum length ended the search
    first); None when nothing was left out."""
    if phrases is None or not unmet:
        return None
    if not source:
        return "blank"
    n = search.no_repeat_ngram
    if n and any(repeats_run(phrases, j, n) for j in unmet):
        return "no_repeat_ngram"
    return "length"


def unmet_lines(
    constraints: Sequence[PhraseIds | None] | None,
    unmet: Sequence[Sequence[int] | None],
    sources: Sequence[Sequence[int]],
    search: SearchConfig,
    first: int = 1,
) -> dict[str, list[int]]:
    """Per reason ([`unmet_reason`][attnx.inference.phrases.unmet_reason]), the numbers (counted from
    `first`) of the inputs whose best hypothesis left phrases to include out; `unmet` is each input's
    `hyps[0].unmet`, `sources` its ids."""
    found: dict[str, list[int]] = {}
    if constraints is None:
        return found
    for i, (c, missed, source) in enumerate(zip(constraints, unmet, sources, strict=True)):
        if reason := unmet_reason(c, missed, source, search):
            found.setdefault(reason, []).append(first + i)
    return found


def unmet_warnings(lines: Mapping[str, Sequence[int]], search: SearchConfig, options: str) -> list[str]:
    """One warning per reason of [`unmet_reason`][attnx.inference.phrases.unmet_reason] that `lines` (reason
    -> the line numbers it holds for) names, each naming the setting to change as `options` spells it
    (`--search.` for a command, `search.` for the Python API)."""
    n = search.no_repeat_ngram
    what = {
        "blank": "blank line(s) have phrases to include, which their blank translation leaves out",
        "no_repeat_ngram": f"translation(s) left out a phrase to include whose pieces repeat a run of {n} (in "
        f"the phrase or with another phrase of its line), which {options}no_repeat_ngram {n} forbids writing: "
        "lower it (0: off)",
        "length": "translation(s) reached the maximum output length before writing all their phrases to include "
        f"(raise {options}max_len_b)",
    }
    said = []
    for reason, text in what.items():
        if found := list(lines.get(reason) or []):
            shown = ", ".join(map(str, found[:10])) + (" ..." if len(found) > 10 else "")
            said.append(f"{len(found)} {text}: line {shown}")
    return said


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
