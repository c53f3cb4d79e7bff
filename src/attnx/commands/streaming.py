"""The loop behind `attnx translate`: read a chunk of input lines (with the `--target`, `--prefix` or
`--constraints` lines beside them), search or score it, write it in the output format, in input order, until
the input ends or a signal stops it. Memory holds one chunk, whatever the size of the input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnx.commands.constraint_lines import ConstraintLines
from attnx.commands.resumable import ResumableOutput, StreamOutput, with_precision
from attnx.commands.text_input import TextInput
from attnx.errors import ConfigError, UsageError
from attnx.inference.config import SearchConfig
from attnx.inference.formats import OutputFormat, render
from attnx.inference.phrases import check_phrases, encode_phrases, unmet_lines, unmet_warnings
from attnx.inference.progress import Progress

if TYPE_CHECKING:
    from attnx.inference.hypothesis import Hypothesis
    from attnx.inference.translator import Translator


class LineCountMismatch(UsageError):
    """`--input` and `--target`/`--prefix` do not pair up line by line (exit status 2)."""


def check_output_options(
    format: OutputFormat,
    target: str | None,
    prefix: str | None,
    token_scores: bool,
    search: SearchConfig | None,
) -> None:
    """Refuse combinations that would silently drop something the user asked for."""
    if target is not None and prefix is not None:
        raise ConfigError(
            "--target scores given translations and --prefix constrains a search: give one of them"
        )
    if target is not None and search is not None and (search.nbest != 1 or search.sampling or search.mbr):
        raise ConfigError(
            "--target scores the given translations, one each: --search.nbest, --search.sampling and "
            "--search.mbr do not apply (leave them out)"
        )
    if format == "text" and token_scores:
        raise ConfigError("--token_scores needs --format jsonl or --format moses (text has no scores)")


def content_digest(path: str | Path) -> str:
    """SHA-256 of a file, or of a directory's files (names and contents, in name order)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode("utf-8") + b"\0")
        with open(file, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def run_options(
    model: str | Sequence[str],
    weights: Sequence[float] | None,
    search: SearchConfig | None,
    format: OutputFormat,
    token_scores: bool,
    precision: str | None = None,
    buffer_size: int | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """What decides a run's output besides its inputs: the models' content and every output option. A
    model that cannot be read is left for the loader to name.

    Seeded sampling also depends on how the lines are grouped: each chunk of `buffer_size` lines draws from a
    seed of its own ([`chunk_seed`][attnx.commands.streaming.chunk_seed]), and the chunk's batches of
    `max_tokens` from one stream in turn, so both are part of its options. A search that does not sample
    decides each line on its own (a batch adds only padding, which the masks hide): grouping is not recorded,
    and a run continued with another `--buffer_size` gives the same lines."""
    models = [model] if isinstance(model, str) else list(model)
    seeded = search is not None and search.samples and search.seed is not None
    options = {
        "model": [
            {"path": str(Path(m).resolve()), "sha256": content_digest(m) if Path(m).exists() else None}
            for m in models
        ],
        "weights": None if weights is None else list(weights),
        "search": dataclasses.asdict(search) if search is not None else None,
        "format": format,
        "token_scores": token_scores,
        **({"buffer_size": buffer_size, "max_tokens": max_tokens} if seeded else {}),
    }
    # fp32 is what a run decoded in before the option existed: its records continue
    return options if precision is None else with_precision(options, precision)


class PairedInputs:
    """`--input`, with the `--target` or `--prefix` file read beside it line for line."""

    def __init__(
        self, input: str, target: str | None = None, prefix: str | None = None, constraints: str | None = None
    ) -> None:
        self.texts: dict[str, TextInput] = {}
        try:
            self.texts["input"] = TextInput(input)
            if target is not None:
                self.texts["target"] = TextInput(target, "--target")
            if prefix is not None:
                self.texts["prefix"] = TextInput(prefix, "--prefix")
            if constraints is not None:
                self.texts["constraints"] = TextInput(constraints, "--constraints")
        except BaseException:
            self.close()
            raise

    @property
    def source(self) -> TextInput:
        return self.texts["input"]

    def close(self) -> None:
        for text in self.texts.values():
            text.close()

    def __enter__(self) -> PairedInputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mismatch(
        self, other: TextInput, input_lines: int, other_lines: int, exact: bool = True
    ) -> LineCountMismatch:
        source = self.source
        where = f"{source.option} {source.name}" if source.path else source.name
        there = f"{other.option} {other.name}" if other.path else other.name
        return LineCountMismatch(
            f"{where} has {input_lines if exact else f'at least {input_lines}'} lines but {there} has "
            f"{other_lines}; they must pair up line by line"
        )

    def check_line_counts(self) -> None:
        """Files (not streams) are counted before anything is decoded or written."""
        counts = {name: text.count_lines() for name, text in self.texts.items()}
        for name, text in self.texts.items():
            known = counts[name] is not None and counts["input"] is not None
            if name != "input" and known and counts[name] != counts["input"]:
                raise self.mismatch(text, counts["input"], counts[name])

    def read(self, limit: int) -> dict[str, list[str]]:
        """The next chunk: up to `limit` input lines and as many of each paired file (`{}` at the end)."""
        lines = self.source.read(limit)
        chunk = {"input": lines}
        for name, text in self.texts.items():
            if name == "input":
                continue
            chunk[name] = text.read(len(lines), wait_for_all=True) if lines else text.read(1)
            if len(chunk[name]) != len(lines):
                exact = not lines  # the input has ended
                raise self.mismatch(text, self.source.lines, text.lines, exact=exact)
        return chunk if lines else {}


CHUNK_SEED_MAX = 2**32 - 1
"""The largest seed a chunk draws from: 32 bits, what every engine's generator takes (torch's takes 64,
CTranslate2's 32)."""


def chunk_seed(seed: int, first_line: int) -> int:
    """The sampling seed of the chunk starting at input line `first_line`, from 0 to
    [`CHUNK_SEED_MAX`][attnx.commands.streaming.CHUNK_SEED_MAX] whatever the engine: every chunk draws its own
    numbers, and a resumed run draws the same ones again."""
    digest = hashlib.sha256(f"{seed}:{first_line}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass
class Truncated:
    """Lines longer than the model accepts, numbered across chunks, for one warning at the end."""

    max_positions: int
    what: str
    count: int = 0
    lines: list[int] = field(default_factory=list)

    def cut(self, ids: list[list[int]], first_line: int) -> list[list[int]]:
        limit = self.max_positions - 1  # the </s> (or <s>) takes one
        for i, x in enumerate(ids):
            if len(x) > limit:
                self.count += 1
                if len(self.lines) < 10:
                    self.lines.append(first_line + i)
        return [x[:limit] for x in ids]

    def warning(self) -> str | None:
        if not self.count:
            return None
        shown = ", ".join(map(str, self.lines)) + (" ..." if self.count > len(self.lines) else "")
        return (
            f"{self.count} {self.what}(s) exceed the model's {self.max_positions} positions and were truncated to "
            f"{self.max_positions - 1} tokens: {self.what} {shown}"
        )


class TranslationJob:
    """How one chunk is decoded and written: the translator, the output format, what to score."""

    def __init__(
        self,
        translator: Translator,
        format: OutputFormat,
        token_scores: bool,
        buffer_size: int,
        constraints: ConstraintLines | None = None,
    ) -> None:
        self.translator = translator  # for a CTranslate2 model with constraints, both engines behind one
        self.constraints = constraints  # each line's phrases to include and exclude
        self.unmet: dict[
            str, list[int]
        ] = {}  # why (unmet_reason) -> lines whose best translation left phrases out
        self.format = format
        self.token_scores = token_scores
        self.buffer_size = buffer_size
        self.truncated = {
            what: Truncated(translator.max_positions, what) for what in ("input", "target", "prefix")
        }

    def pieces(self, ids: Sequence[int]) -> list[str]:
        sp = self.translator.tokenizer.sp
        return [sp.id_to_piece(i) for i in ids]

    def decode(self, chunk: dict[str, list[str]], first: int) -> list[list[Hypothesis]]:
        """Hypotheses of the chunk's lines (`first` is the 1-based number of its first line), best first."""
        translator = self.translator
        lines = chunk["input"]
        sources = self.truncated["input"].cut(translator.encode(lines), first)
        if "target" in chunk:
            targets = self.truncated["target"].cut(translator.encode(chunk["target"]), first)
            scored = translator.score_ids(sources, targets)
            for hyp in scored:
                hyp.text = translator.decode(hyp.tokens)
            return [[hyp] for hyp in scored]
        prefixes = None
        if "prefix" in chunk:
            prefixes = self.truncated["prefix"].cut(translator.encode(chunk["prefix"]), first)
        phrases = None
        if self.constraints is not None and self.constraints.given:
            items = self.constraints.parse(chunk.get("constraints"), first, len(lines)) or []
            where = [self.constraints.where(first + i) for i in range(len(lines))]
            phrases = encode_phrases(translator.encode, items, where)
            check_phrases(phrases, sources, prefixes, translator.search, where)
        search = translator.search
        if search.samples and search.seed is not None:
            translator = translator.with_search(seed=chunk_seed(search.seed, first))
        results = translator.generate_ids(sources, prefixes, constraints=phrases)
        unmet = unmet_lines(phrases, [h[0].unmet if h else None for h in results], sources, search, first)
        for reason, found in unmet.items():
            self.unmet.setdefault(reason, []).extend(found)
        for line, hyps in zip(lines, results, strict=True):
            for hyp in hyps:
                hyp.text = translator.decode(hyp.tokens) if line.strip() else ""
                if search.alignment and hyp.alignment is None:  # a blank line: every line has the field
                    hyp.alignment = []
        return results

    def render(self, results: list[list[Hypothesis]], first: int, scored: bool) -> bytes:
        if scored and self.format == "text":  # forced scoring: the log-probability of each given target
            text = "".join(
                repr(hyps[0].log_prob)
                + (
                    ""
                    if hyps[0].alignment is None
                    else " ||| " + " ".join(f"{i}-{j}" for i, j in hyps[0].alignment)
                )
                + "\n"
                for hyps in results
            )
        else:
            text = render(
                self.format,
                results,
                first=first - 1,
                token_scores=self.token_scores,
                pieces=self.pieces,
                nbest=self.translator.search.nbest > 1,
            )
        return text.encode("utf-8")

    def warnings(self) -> list[str]:
        said = [w for w in (t.warning() for t in self.truncated.values()) if w]
        said += unmet_warnings(self.unmet, self.translator.search, "--search.")
        return said


class Stop(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, `kill`) while translating: unwinds like Ctrl+C."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    def on_term(signum: int, frame: object) -> None:
        raise Stop

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def warnings_on_stderr(command: str) -> Iterator[logging.Logger]:
    """attnx's warnings reach the user whatever logging is set up, as `attnx COMMAND: warning: ...`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"attnx {command}: warning: %(message)s"))
    log = logging.getLogger("attnx")
    log.addHandler(handler)
    try:
        yield log
    finally:
        log.removeHandler(handler)


def run_translation(job: TranslationJob, inputs: PairedInputs, sink: StreamOutput | ResumableOutput) -> int:
    """Read, decode and write `inputs` chunk by chunk into `sink`; 143 (SIGTERM) or 130 (Ctrl+C) when
    stopped, after one line saying how many lines are done and where they are."""
    source = inputs.source
    with warnings_on_stderr("translate") as log:
        resumed = sink.start(inputs.texts)
        if resumed:
            print(f"attnx translate: {resumed}", file=sys.stderr, flush=True)
        total = source.count_lines()
        progress = Progress(
            "attnx translate",
            None if total is None else sink.resumed + total,
            sys.stderr,
            done=sink.resumed,
            live=sys.stderr.isatty(),
            enabled=not (source.path is None and sys.stdin.isatty()),
        )
        scored = "target" in inputs.texts
        try:
            with stop_on_sigterm():
                while chunk := inputs.read(job.buffer_size):
                    first = source.lines - len(chunk["input"]) + 1
                    results = job.decode(chunk, first)
                    sink.write(job.render(results, first, scored), inputs.texts)
                    progress.update(source.lines)
        except LineCountMismatch:
            sink.abandon()
            raise
        except KeyboardInterrupt as stop:
            progress.close()
            signum = signal.SIGTERM if isinstance(stop, Stop) else signal.SIGINT
            name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl+C"
            of = "" if progress.total is None else f" of {progress.total}"
            print(
                f"attnx translate: stopped by {name} after {sink.lines}{of} line(s); {sink.stopped(sink.lines)}",
                file=sys.stderr,
            )
            return 128 + signum
        progress.close()
        sink.finish()
        for warning in [w for t in inputs.texts.values() if (w := t.warning())] + job.warnings():
            log.warning(warning)
    return 0
