"""Terminology phrases matched on the text the pieces spell, not on one segmentation of it.

The output is read as the string its pieces spell (`▁` a space). A phrase is *met* where that string contains
it, by default as a whole word: the character before it and the one after it are a word boundary (the start or
the end of the output, a space, punctuation or a symbol, or a letter of a script written without spaces: Han,
kana, Thai, ...). `(Hund)`, `„Hund“` and `Hund.` meet `Hund`; `Hundeleine` does not (with `whole_words` off it
does, e.g. for compounds). However the model spells it (`▁Hund`, `▁H und`, `▁( H und`), the phrase is seen.

Each phrase is compiled, once per model and phrase, into an automaton over the pieces: its states are how many
of the phrase's characters the output ends with (KMP over characters, a start allowed only at a word boundary),
and a piece moves it by spelling its characters. Only the pieces that can spell part of the phrase move it
anywhere but back to the start (a few hundred at most, [`candidates`][attnx.inference.terms.Vocabulary]); every
other piece is one rule. [`TermTables`][attnx.inference.term_tables.TermTables] holds a batch's automata as tensors for
the search ([`lexical`][attnx.inference.lexical], [`constraints`][attnx.inference.constraints]).

States: 0 no phrase may start next (mid-word), 1 one may, `k + 1` the output ends with the phrase's first `k`
characters; `L + 1` (all of them) waits for a word boundary, which counts the phrase (an *event*).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from attnx.data.batch import EOS_ID

if TYPE_CHECKING:
    from attnx.data.tokenizer import Tokenizer

__all__ = [
    "MID",
    "START",
    "Term",
    "Vocabulary",
    "compile_term",
    "is_free",
    "normalized",
    "surface_contains",
    "vocabulary",
]

MID, START = 0, 1
"""The two states of an output that ends with none of the phrase: a phrase may not (MID) or may (START) begin
with the next character."""

OPAQUE = "\x00"
"""What a piece that is not text (`<unk>`, a byte) spells: a character no phrase holds."""

NO_SPACES = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x3040, 0x30FF), (0x3400, 0x4DBF))
NO_SPACES += ((0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FFFF))
"""Scripts written without spaces between words (Thai, Lao, Myanmar, Khmer, kana, Han): each letter is a word
of its own for matching."""


@lru_cache(maxsize=65536)
def is_free(ch: str | None) -> bool:
    """Whether a phrase may begin after, or end before, `ch` whatever the other side is: the start or end of
    the output (None), `▁`, a space, punctuation, a symbol, or a letter of a script without spaces."""
    if ch is None or ch == "▁" or ch.isspace():
        return True
    if unicodedata.category(ch)[0] in "PSZ":
        return True
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in NO_SPACES)


def boundary(before: str | None, after: str | None) -> bool:
    return is_free(before) or is_free(after)


def surface_contains(text: str, phrase: str, whole_words: bool = True) -> int:
    """How many times detokenized `text` contains `phrase` (as whole words by default): what a reader sees."""
    count, start = 0, text.find(phrase)
    while start >= 0:
        end = start + len(phrase)
        before = text[start - 1] if start else None
        after = text[end] if end < len(text) else None
        if not whole_words or (boundary(before, phrase[0]) and boundary(phrase[-1], after)):
            count += 1
        start = text.find(phrase, start + 1)
    return count


class Vocabulary:
    """What each piece of a model spells, indexed to find the pieces that can spell part of a phrase.

    `pieces[i]`: the characters piece `i` spells (`▁` for a space; [`OPAQUE`][attnx.inference.terms.OPAQUE]
    for a byte, "" for `<unk>`, which the detokenizer drops, and for `<pad>`, `<s>`, `</s>`)."""

    def __init__(self, pieces: Sequence[str], by_ids: bool = False) -> None:
        self.pieces = list(pieces)
        self.by_ids = by_ids
        """Whether the pieces are ids standing for themselves (no text, no word boundaries)."""
        self._terms: dict[tuple[str, bool], Term] = {}
        self.ids = {p: i for i, p in enumerate(self.pieces) if p and p != OPAQUE}
        self.suffixes: dict[str, list[int]] = {}
        self.prefixes: dict[str, list[int]] = {}
        for p, i in self.ids.items():
            for j in range(1, len(p)):
                self.suffixes.setdefault(p[j:], []).append(i)
                self.prefixes.setdefault(p[:j], []).append(i)
        self.chars = {c for p in self.ids for c in p}
        self.longest = max((len(p) for p in self.ids), default=0)
        starts = [bool(p) and is_free(p[0]) for p in self.pieces]
        ends = [bool(p) and is_free(p[-1]) for p in self.pieces]
        empty = [not p for p in self.pieces]  # spells nothing: leaves every automaton as it is
        if len(self.pieces) > EOS_ID:
            starts[EOS_ID] = ends[EOS_ID] = True  # the end of the output is a boundary
            empty[EOS_ID] = False
        self.empty = torch.tensor(empty, dtype=torch.bool)
        self.starts_free = torch.tensor(starts, dtype=torch.bool)
        self.ends_free = torch.tensor(ends, dtype=torch.bool)
        # after an opening bracket or low quote („ ‚) a word follows without a space; after a quote that opens
        # in one language and closes in another (" ' “ ” ‘ ’ « »), "-" or "/" either way
        last = [p[-1] if p and p != OPAQUE else "" for p in self.pieces]
        self.opens = torch.tensor([bool(c) and unicodedata.category(c) == "Ps" for c in last])
        self.joins = torch.tensor(
            [bool(c) and (c in "\"'-/" or unicodedata.category(c) in ("Pi", "Pf")) for c in last]
        )

    @classmethod
    def of_ids(cls, size: int) -> Vocabulary:
        """A vocabulary whose pieces spell one letter each (no boundaries): phrases of ids match as id
        sequences, for decoders without a SentencePiece model."""
        return cls([chr(0xF0000 + i) for i in range(size)], by_ids=True)

    def term(self, text: str, whole_words: bool) -> Term:
        """Phrase `text` compiled for this vocabulary (once; [`compile_term`][attnx.inference.terms.compile_term])."""
        key = (text, whole_words)
        if key not in self._terms:
            if len(self._terms) >= 4096:
                self._terms.clear()
            self._terms[key] = compile_term(self, text, whole_words)
        return self._terms[key]

    def spell(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids)

    def candidates(self, p: str, whole_words: bool) -> list[int]:
        """The pieces that can move phrase `p`'s automaton anywhere but to its default (module docstring)."""
        found: set[int] = set()
        n = len(p)
        for i in range(n):  # (1) inside the phrase
            for j in range(i + 1, min(n, i + self.longest) + 1):
                if p[i:j] in self.ids:
                    found.add(self.ids[p[i:j]])
        for j in range(1, n + 1):  # (2) ending with the phrase's start, begun inside the piece
            for i in self.suffixes.get(p[:j], ()):
                s = self.pieces[i]
                if not whole_words or boundary(s[len(s) - j - 1], p[0]):
                    found.add(i)
        wordy = whole_words and not is_free(p[-1])  # a whole word ends only before a boundary
        for m in range(1, n):  # (3) going on past the phrase's end: where the phrase ends inside the piece
            for i in self.prefixes.get(p[m:], ()):
                s = self.pieces[i]
                if len(s) > n - m and (not wordy or is_free(s[n - m])):
                    found.add(i)
        if n < self.longest:
            found.update(i for piece, i in self.ids.items() if p in piece and len(piece) > n)
        return sorted(found)


@dataclass(frozen=True)
class Term:
    """One phrase compiled for one vocabulary: its automaton on the pieces that move it."""

    text: str
    whole_words: bool
    tokens: list[int]
    """The candidate pieces (those that can move the automaton)."""
    nxt: list[list[int]]
    """`nxt[state][m]`: the state after piece `tokens[m]`."""
    events: list[list[int]]
    """`events[state][m]`: how many times piece `tokens[m]` completes the phrase."""
    offers: list[tuple[int, int]]
    """Per state, the pieces a constrained search offers to go on writing the phrase (-1: none): the longest
    piece that continues it, and from the start also its `▁`-led form."""
    pieces: int
    """Pieces of the phrase's shortest spelling from mid-word (what it takes of the output's length)."""

    @property
    def states(self) -> int:
        return len(self.text) + 2

    @property
    def waits(self) -> bool:
        """Whether a full match waits for the next character to say it is a whole word."""
        return self.whole_words and not is_free(self.text[-1])

    @property
    def free_start(self) -> bool:
        return not self.whole_words or is_free(self.text[0])


def compile_term(vocab: Vocabulary, text: str, whole_words: bool = True) -> Term:
    """Phrase `text` (as the model's normalizer writes it, `▁` for spaces) compiled for `vocab`; raises
    ValueError naming the characters no piece spells."""
    missing = sorted({c for c in text if c not in vocab.chars})
    if missing:
        raise ValueError(", ".join(f"{c!r} (U+{ord(c):04X})" for c in missing))
    return _compile(vocab, text, whole_words)


def _compile(vocab: Vocabulary, p: str, whole: bool) -> Term:
    n = len(p)
    ok = boundary if whole else (lambda a, b: True)
    # fail[k]: the longest proper suffix of p[:k] that is a prefix of p and starts at a boundary within p
    fail = [0] * (n + 1)
    for k in range(2, n + 1):
        fail[k] = next(
            (j for j in range(k - 1, 0, -1) if p[k - j : k] == p[:j] and ok(p[k - j - 1], p[0])), 0
        )
    waits = whole and not is_free(p[-1])

    def step(state: int, ch: str) -> tuple[int, int]:
        k = state - 1 if state > START else 0
        start_ok = (state == START) if k == 0 else ok(p[k - 1], p[0])
        events = 0
        if k == n:  # waiting: ch says whether the match was a whole word
            events += ok(p[-1], ch)
            k = fail[n]
        while True:
            if k < n and p[k] == ch and (k > 0 or start_ok):
                k += 1
                break
            if k == 0:
                break
            k = fail[k]
        if k == n and not waits:
            events += 1
            k = fail[n]
        if k == 0:
            return (START if ok(ch, p[0]) else MID), events
        return k + 1, events

    def run(state: int, s: str) -> tuple[int, int]:
        events = 0
        for ch in s:
            state, e = step(state, ch)
            events += e
        return state, events

    tokens = vocab.candidates(p, whole)
    table = [[run(state, vocab.pieces[t]) for t in tokens] for state in range(n + 2)]
    nxt = [[x for x, _ in row] for row in table]
    events = [[e for _, e in row] for row in table]

    def longest(state: int, text: str) -> int:
        for j in range(min(len(text), vocab.longest), 0, -1):
            piece = vocab.ids.get(text[:j])
            if piece is not None and run(state, text[:j]) != (state, 0):
                return piece
        return -1

    offers = []
    for state in range(n + 2):
        k = state - 1 if state > START else 0
        if state == n + 1:
            offers.append((-1, -1))
        elif state > START:
            offers.append((longest(state, p[k:]), -1))
        else:
            spaced = longest(state, "▁" + p) if p[0] != "▁" else -1
            offers.append((longest(state, p) if state == START else spaced, spaced if state == START else -1))
    # the pieces of its greedy longest-match spelling, after a space where the model writes spaces
    text, pieces = ("▁" + p if "▁" in vocab.chars and p[0] != "▁" else p), 0
    while text:
        j = next((j for j in range(min(len(text), vocab.longest), 0, -1) if text[:j] in vocab.ids), 1)
        text, pieces = text[j:], pieces + 1
    return Term(p, whole, tokens, nxt, events, offers, max(pieces, 1))


_VOCABULARIES: dict[str, Vocabulary] = {}


def vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    """The [`Vocabulary`][attnx.inference.terms.Vocabulary] of a SentencePiece model, built once per model."""
    key = tokenizer.sha256
    if key not in _VOCABULARIES:
        sp = tokenizer.sp
        pieces = [
            ""  # attnx's detokenizer drops <unk>: it spells nothing
            if sp.is_control(i) or sp.is_unknown(i)
            else OPAQUE
            if sp.is_byte(i) or sp.is_unused(i)
            else sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
        ]
        _VOCABULARIES.clear()  # one model at a time is usual; a second replaces it
        _VOCABULARIES[key] = Vocabulary(pieces)
    return _VOCABULARIES[key]


def normalized(tokenizer: Tokenizer, phrase: str) -> str:
    """`phrase` as the model's normalizer writes text (NFKC, collapsed spaces), `▁` for its inner spaces."""
    return tokenizer.sp.normalize(phrase).strip("▁")
