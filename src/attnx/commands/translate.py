"""`attnx translate`, `attnx attention` and `attnx score`: a trained model on text, and BLEU of a file."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from attnx.commands.progress import Progress
from attnx.commands.resumable import ResumableOutput, StreamOutput
from attnx.commands.text_input import TextInput
from attnx.inference.config import DEFAULT_MAX_TOKENS, PAPER_SEARCH, SearchConfig

if TYPE_CHECKING:
    from attnx.inference.translator import Translator


def check_device(device: str) -> None:
    """A usage error for a device this machine does not have."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as err:
        raise ValueError(f"--device {device!r}: {err}") from None
    index = torch.device(device).index or 0
    if kind == "cuda" and index >= torch.cuda.device_count():
        raise ValueError(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); use --device cpu"
            + (" or cuda:0" if torch.cuda.is_available() else "")
        )


def translate(
    model: str,
    input: str = "-",
    output: str = "-",
    search: SearchConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    buffer_size: int = 2000,
    device: str = "cpu",
    force: bool = False,
) -> int:
    """Translate text with a trained model: one segment a line in, one translation a line out, same order.

    The model is a checkpoint of attnx fit/average or a directory of attnx export --format ctranslate2; it
    carries its own SentencePiece model. Blank lines stay blank; lines longer than the model accepts are
    truncated with a warning. Decoding is the model's own default (a checkpoint: §6.1's beam 4, α 0.6, GNMT
    length penalty, input length + 50; an export: the settings stored with it) unless --search.* says
    otherwise (attnx translate --search.help lists them).

    Input of any size is read, translated and written --buffer_size lines at a time, in input order; a pipe
    or terminal gets each line's translation as soon as it is ready. An --output file grows as
    OUTPUT.attnx-partial and appears under its name only once complete; a run stopped on the way (SIGTERM,
    Ctrl+C, a kill, a full disk) keeps the lines done, and the same command run again continues after them.
    Example: echo "A dog runs." | attnx translate --model base.ckpt

    Args:
        model: Checkpoint file (*.ckpt) or exported CTranslate2 directory.
        input: File, named pipe or <(process substitution) with one source segment a line, or - for
            standard input.
        output: File for the translations, or - for standard output.
        search: Beam size, length penalty and maximum output length, e.g. --search.beam 1 (greedy).
        max_tokens: Source tokens per decoding batch, padding included.
        buffer_size: Lines read, translated (sorted by length) and written at a time; a pipe's lines are
            translated as they arrive, up to this many together.
        device: Where to decode: cpu, cuda, cuda:1, ...
        force: Replace the --output file if it exists (otherwise an existing file is left and the command stops).
    """
    from attnx.commands.usage import refuse_to_replace

    if buffer_size < 1:
        raise ValueError(f"--buffer_size must be at least 1, got {buffer_size}")
    if output != "-":
        refuse_to_replace(output, force)
    check_device(device)
    with TextInput(input) as source:
        inputs = {"input": source}
        sink = StreamOutput() if output == "-" else ResumableOutput(output, run_options(model, search))
        sink.prepare()
        from attnx.inference.load import load

        translator = load(model, device=device, search=search, max_tokens=max_tokens)
        return run_translation(translator, inputs, sink, buffer_size)


def run_options(model: str, search: SearchConfig | None) -> dict[str, object]:
    """What decides a run's output besides its input: the model's content and the search settings."""
    import dataclasses

    return {
        "model": [{"path": str(Path(model).resolve()), "sha256": content_digest(model)}],
        "search": dataclasses.asdict(search) if search is not None else None,
    }


def content_digest(path: str | Path) -> str:
    """SHA-256 of a file, or of a directory's files (names and contents, in name order)."""
    import hashlib

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


class Truncated:
    """Input lines longer than the model accepts, numbered across chunks, for one warning at the end."""

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions
        self.lines: list[int] = []
        self.count = 0

    def cut(self, ids: list[list[int]], first_line: int) -> list[list[int]]:
        limit = self.max_positions - 1  # the source </s> takes one
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
            f"{self.count} input(s) exceed the model's {self.max_positions} positions and were truncated to "
            f"{self.max_positions - 1} tokens: input {shown}"
        )


def run_translation(
    translator: Translator,
    inputs: dict[str, TextInput],
    sink: StreamOutput | ResumableOutput,
    buffer_size: int,
) -> int:
    """Read, translate and write `inputs["input"]` chunk by chunk into `sink`; 143/130 when stopped."""
    source = inputs["input"]
    with warnings_on_stderr("translate") as log:
        resumed = sink.start(inputs)
        if resumed:
            print(f"attnx translate: {resumed}", file=sys.stderr, flush=True)
        total = source.count_lines()
        progress = Progress(
            "attnx translate",
            None if total is None else sink.resumed + total,
            sys.stderr,
            done=sink.resumed,
            live=sys.stderr.isatty(),
        )
        truncated = Truncated(translator.max_positions)
        try:
            with stop_on_sigterm():
                while lines := source.read(buffer_size):
                    first = source.lines - len(lines) + 1
                    ids = truncated.cut(translator.encode(lines), first)
                    outputs = translator.translate_ids(ids)
                    texts = [
                        translator.decode(x) if line.strip() else ""
                        for line, x in zip(lines, outputs, strict=True)
                    ]
                    sink.write("".join(t + "\n" for t in texts).encode("utf-8"), inputs)
                    progress.update(source.lines)
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
        for warning in (source.warning(), truncated.warning()):
            if warning:
                log.warning(warning)
    return 0


def attention(
    model: str,
    text: str,
    output: Path = Path("attention.png"),
    layer: int = -1,
    search: SearchConfig = PAPER_SEARCH,
    dpi: int = 120,
    device: str = "cpu",
    force: bool = False,
) -> int:
    """Translate one sentence and draw one layer's attention heads to a PNG, like the paper's appendix figures.

    Panels: every encoder self-attention head of the layer (source × source), then every encoder-decoder
    attention head (translation × source).
    Example: attnx attention --model base.ckpt --text "A dog runs." --output attention.png

    Args:
        model: Checkpoint file (*.ckpt) written by attnx fit/average.
        text: The source sentence (plain text).
        output: PNG file to write.
        layer: Layer to draw, 0-based; negative counts from the last.
        search: How to translate the sentence first (paper: beam 4, α 0.6).
        dpi: Resolution of the PNG.
        device: Where to decode: cpu, cuda, ...
        force: Replace the --output file if it exists (otherwise an existing file is left and the command stops).
    """
    from attnx.commands.usage import refuse_to_replace

    if not text.strip():
        raise ValueError("--text is empty: give the sentence to translate and draw")
    refuse_to_replace(output, force)
    check_device(device)
    from attnx.inference.attention_map import save_attention_figure
    from attnx.inference.eager import EagerTranslator

    translator = EagerTranslator.from_checkpoint(model, device=device, search=search)
    maps = translator.attention(text)
    save_attention_figure(maps, output, layer=layer, dpi=dpi)
    print(f"translation: {maps.translation}")
    print(f"wrote {output}")
    return 0


def score(
    hypotheses: Path, references: Path, lang: str = "de", format: Literal["text", "json"] = "text"
) -> int:
    """Score a detokenized translation file against a reference file, line by line.

    Prints sacreBLEU BLEU and chrF2 with their signatures, and the paper-style tokenized BLEU (not comparable
    to sacreBLEU). Example: attnx score --hypotheses test.hyp --references newstest2014.de

    Args:
        hypotheses: Translations, one segment a line.
        references: References, one segment a line, in the same order.
        lang: Target language, for the paper-style BLEU's Moses tokenizer.
        format: text (one score a line) or json.
    """
    import dataclasses
    import json

    from attnx.evaluation.bleu import score as bleu

    texts = {}
    for option, path in (("--hypotheses", hypotheses), ("--references", references)):
        with TextInput(path, option) as text:
            texts[option] = [line.rstrip() for line in text.read_all()]
            if text.warning():
                print(f"attnx score: warning: {text.warning()}", file=sys.stderr)
    hyps, refs = texts["--hypotheses"], texts["--references"]
    if len(hyps) != len(refs):
        raise ValueError(
            f"{hypotheses} has {len(hyps)} lines but {references} has {len(refs)}; they must pair up line by line"
        )
    report = bleu(hyps, refs, lang)
    print(json.dumps(dataclasses.asdict(report)) if format == "json" else "\n".join(report.lines()))
    return 0
