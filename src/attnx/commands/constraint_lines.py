"""Terminology constraints on the command line: `attnx translate --constraints FILE` (per input line a JSON
object, array, string or null, or tab-separated phrases: [`phrases`][attnx.inference.phrases]) and `--constraint TEXT` (the same,
for every line), and the engine that can honour them.

CTranslate2 has no constrained beam search, and it bans a phrase only as one token sequence, where attnx
matches phrases as words of the output. So a CTranslate2 model given constraints hands the lines that have
some to attnx's own engine over the checkpoint the export was made from, when that checkpoint lies beside the
export and is the file the export recorded (its SHA-256); the other lines stay with CTranslate2. The choice is
made once, before the first line is decoded, from the whole constraints file
([`EnginePlan`][attnx.commands.constraint_lines.EnginePlan]), so which engine decodes a line never depends on
how the input was cut into chunks, and a continued run keeps the engines of the run it continues.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnx.errors import ConfigError
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lexical import PhraseIds
from attnx.inference.phrases import PhraseConstraints, parse_line
from attnx.inference.translator import Translator

ENGINES = "constrained_lines"
"""The key of a run's options that records which engine decodes its lines with constraints."""


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

    def ahead(self) -> tuple[str | None, bool] | None:
        """Read before anything is decoded: where the first phrase to include is (None: nowhere) and whether
        any line has phrases to exclude; None for a stream (a pipe is read once, beside the input)."""
        from attnx.commands.text_input import TextInput

        if self.inline is not None:
            return ("--constraint" if self.inline.include else None), bool(self.inline.exclude)
        if self.file is None:
            return None, False
        exclude = False
        with TextInput(self.file, self.option) as text:
            if not text.regular:
                return None
            while lines := text.read(1024):
                first = text.lines - len(lines) + 1
                for i, item in enumerate(self.parse(lines, first, len(lines)) or []):
                    if item.include:
                        return self.where(first + i), exclude
                    exclude = exclude or bool(item.exclude)
        return None, exclude


@dataclass(frozen=True)
class SourceCheckpoint:
    """The checkpoint a CTranslate2 export was made from, found beside it."""

    path: Path
    sha256: str
    """What the file holds now (hashed once, in blocks)."""
    checked: bool
    """Whether the export recorded a SHA-256 (and it is this one); exports before it was recorded have none."""


def source_checkpoint(directory: Path) -> tuple[str | None, SourceCheckpoint | None]:
    """The name of the checkpoint the export `directory` was made from (None: it records none), and that
    checkpoint when it lies beside the export; refused in one line naming both SHA-256s when the file there
    is not the one the export was made from."""
    from attnx.data.corpus import file_sha256
    from attnx.export.ctranslate2 import SOURCE, SOURCE_BYTES, SOURCE_SHA256
    from attnx.inference.ctranslate2 import read_metadata

    meta = read_metadata(directory) or {}
    name = meta.get(SOURCE)
    if not isinstance(name, str) or not name:
        return None, None
    path = directory.resolve().parent / name
    if not path.is_file():
        return name, None
    digest, size = file_sha256(path), path.stat().st_size  # hashlib reads it in blocks
    recorded = meta.get(SOURCE_SHA256)
    if recorded is not None and recorded != digest:
        was = meta.get(SOURCE_BYTES)
        sizes = (f" ({was} bytes)", f" ({size} bytes)") if was not in (None, size) else ("", "")
        raise ConfigError(
            f"{directory} was exported from a checkpoint with sha256 {recorded}{sizes[0]}; {path} now has "
            f"{digest}{sizes[1]}: give --model the checkpoint it was exported from"
        )
    return name, SourceCheckpoint(path, digest, recorded is not None)


class ByConstraints(Translator):
    """Two engines behind the calls of one: the inputs that have constraints are decoded by `constrained`,
    the others by `base`, and the hypotheses come back in input order. `base` tokenizes and scores."""

    def __init__(self, base: Translator, constrained: Translator) -> None:
        self.base = base
        self.constrained = constrained
        self.search = base.search
        self.tokenizer = base.tokenizer
        self.max_positions = base.max_positions

    @property
    def device(self) -> torch.device:
        return self.base.device

    def generate_ids(
        self,
        ids: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]] | None = None,
        progress: bool = False,
        scores: bool = True,
        constraints: Sequence[PhraseIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        if constraints is None or all(c is None for c in constraints):
            return self.base.generate_ids(ids, prefixes, progress, scores)
        if len(constraints) != len(ids):
            raise ConfigError(f"{len(constraints)} constraints for {len(ids)} inputs: give one per input")
        out: list[list[Hypothesis]] = [[] for _ in ids]
        for engine, given in ((self.constrained, True), (self.base, False)):
            rows = [i for i, c in enumerate(constraints) if (c is not None) == given]
            if rows:
                found = engine.generate_ids(
                    [ids[i] for i in rows],
                    None if prefixes is None else [prefixes[i] for i in rows],
                    progress,
                    scores,
                    constraints=[constraints[i] for i in rows] if given else None,
                )
                for i, hyps in zip(rows, found, strict=True):
                    out[i] = hyps
        return out

    def score_ids(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
    ) -> list[Hypothesis]:
        return self.base.score_ids(sources, targets)

    def to(self, device: str | torch.device) -> ByConstraints:
        self.base.to(device)
        self.constrained.to(device)
        return self

    def with_search(self, **changes: Any) -> ByConstraints:
        return ByConstraints(self.base.with_search(**changes), self.constrained.with_search(**changes))


def _engines(record: Mapping[str, Any] | None) -> str:
    """How a run's record of its engines reads in a message."""
    if not record or record.get("engine") != "attnx":
        return "CTranslate2"
    return f"attnx's engine from {record.get('checkpoint')} (sha256 {record.get('sha256')})"


@dataclass
class EnginePlan:
    """Which engine decodes the lines with constraints of a run on a CTranslate2 model, decided before the
    first line from all the constraints at once: attnx's engine over the export's checkpoint (`source`),
    or CTranslate2 itself (no checkpoint beside the export; then only phrases to exclude are decoded, with
    CTranslate2's token-sequence bans)."""

    directory: Path
    source: SourceCheckpoint | None
    note: str | None
    """What is said on standard error when the run starts."""

    @classmethod
    def decide(
        cls, translator: Translator, model: str | Sequence[str], terms: ConstraintLines, command: str
    ) -> EnginePlan | None:
        """The plan of a CTranslate2 model given constraints (None for a checkpoint, or no constraints);
        refused in one line when phrases to include have no engine, or the checkpoint beside the export is
        not the one it was exported from."""
        from attnx.inference.ctranslate2 import CTranslate2Translator

        if not isinstance(translator, CTranslate2Translator) or not terms.given:
            return None
        directory = Path(model if isinstance(model, str) else model[0])
        ahead = terms.ahead()
        if ahead == (None, False):  # no line has phrases: CTranslate2 decodes them all
            return cls(directory, None, None)
        include = ahead[0] if ahead is not None else None
        name, source = source_checkpoint(directory)
        if source is None and include is not None:
            raise ConfigError(
                f"{directory} is a CTranslate2 model, which cannot decode with phrases to include (CTranslate2 "
                f"has no constrained beam search), and {include} has some: give --model the checkpoint it was "
                "exported from" + (f" ({name}), or put it beside the export" if name else "")
            )
        if source is None:
            note = (
                f"{command}: lines with phrases to exclude are decoded by CTranslate2, which bans only each "
                "phrase's own segmentation (not every way of writing it, and not as whole words)"
                + (f": put {name} beside {directory} to decode them with attnx's engine" if name else "")
            )
            return cls(directory, None, note)
        check = (
            "sha256 matches"
            if source.checked
            else f"which cannot be checked: {directory} records no sha256 of it (exported by an earlier attnx; "
            "export it again to record one)"
        )
        note = (
            f"{command}: lines with constraints are decoded by attnx's engine from {source.path} (the "
            f"checkpoint {directory} was exported from, {check}); the others by CTranslate2"
        )
        return cls(directory, source, note)

    @property
    def record(self) -> dict[str, Any]:
        """What a continued run must find the same, in its options."""
        if self.source is None:
            return {"engine": "ctranslate2"}
        return {"engine": "attnx", "checkpoint": str(self.source.path), "sha256": self.source.sha256}

    def translator(self, translator: Translator, load: Callable[[Path], Translator]) -> Translator:
        """The run's translator: `translator`, or both engines behind one ([`ByConstraints`][attnx.commands.constraint_lines.ByConstraints]);
        `load` loads the checkpoint (with `translator`'s search settings, so both engines search alike)."""
        if self.note:
            print(self.note, file=sys.stderr, flush=True)
        if self.source is None:
            return translator
        engine = load(self.source.path)
        if engine.tokenizer.sha256 != translator.tokenizer.sha256:
            raise ConfigError(
                f"{self.source.path} has another SentencePiece model than {self.directory} (not the checkpoint "
                "it was exported from): give --model the checkpoint it was exported from"
            )
        return ByConstraints(translator, engine)


def check_continued(previous: Mapping[str, Any] | None, options: Mapping[str, Any], where: str) -> None:
    """Refuse, in one line, to continue an interrupted run (its record `previous`, of the partial output
    `where`) whose lines with constraints another engine decoded than this run's `options` name; a run whose
    other options differ starts over anyway."""
    if not previous or not int(previous.get("lines") or 0):
        return
    before = dict(previous.get("options") or {})
    engines = before.pop(ENGINES, None)
    if engines is None or engines == options.get(ENGINES):
        return
    if before != {k: v for k, v in options.items() if k != ENGINES}:
        return
    now = options.get(ENGINES) or {}
    fix = (
        f"put {engines.get('checkpoint')} back beside the export"
        if engines.get("engine") == "attnx"
        else f"move {now.get('checkpoint')} away from beside the export"
    )
    raise ConfigError(
        f"{where} holds {previous['lines']} line(s) of an interrupted run that decoded its lines with "
        f"constraints with {_engines(engines)}; this run would decode them with {_engines(now)}: {fix} to "
        f"continue it, or remove {where} to start over"
    )
