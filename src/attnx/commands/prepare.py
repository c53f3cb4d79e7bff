"""What `attnx prepare` does around the pipeline: check its options, build, print the report, and end on Ctrl-C
or SIGTERM with one line saying what the output directory holds.

The options and their help are the signature and docstring of `attnx.commands.data.prepare`; the pipeline is
`attnx.data.prepare`, which holds off the stop signals while its output directory is between two consistent
states (`attnx.data.prepare.interrupt`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from attnx.data.errors import DataError
from attnx.data.prepare.alignments import MAX_PIECES
from attnx.data.prepare.interrupt import STOP_SIGNALS, Interrupted, interrupt
from attnx.data.prepare.pipeline import prepare
from attnx.data.prepare.read import corpus_name
from attnx.data.prepare.reports import report, write_report
from attnx.data.prepare.settings import TRAIN, Inputs, Settings
from attnx.data.prepare.vocabulary import read_sentencepiece

SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def prepare_command(
    settings: Settings,
    train: Sequence[str],
    output: str | Path,
    valid: str | None = None,
    test: Sequence[str] = (),
    workers: int | None = None,
    report_file: str | Path | None = None,
    spm_model: str | Path | None = None,
    vocab_size_given: bool = True,
    train_align: Sequence[str | Path] = (),
    valid_align: str | Path | None = None,
) -> int:
    """`attnx prepare` (see `attnx.commands.data.prepare` for the options): check, build, report."""
    if (
        settings.vocab_size < 8
        or settings.max_sentence_tokens < 1
        or settings.max_ratio < 1
        or settings.sample_size < 1
    ):
        raise DataError(
            "--vocab_size must be ≥ 8, --max_sentence_tokens ≥ 1, --max_ratio ≥ 1 and --sample_size ≥ 1"
        )
    if settings.src_lang == settings.tgt_lang:
        raise DataError(f"--src_lang and --tgt_lang are both {settings.src_lang!r}")
    if isinstance(train, str):
        train = [train]
    if isinstance(test, str):
        test = [test]
    names, train = training_corpora(train, settings.src_lang)
    check_per_corpus(settings, len(train))
    prefixes: dict[str, list[str]] = {TRAIN: list(train)}
    for value, default in [(valid, "valid")] * bool(valid) + [(t, "test") for t in test]:
        name, prefix = _named(value, default)
        if name in prefixes:
            raise DataError(f"split {name!r} is given twice; name extra test sets with --test NAME=PREFIX")
        prefixes[name] = [prefix]
    inputs = Inputs.from_prefixes(prefixes, settings.src_lang, settings.tgt_lang)
    inputs.train_names = names
    inputs.alignments = alignment_inputs(settings, train, train_align, valid, valid_align)
    brought = None if spm_model is None else Path(spm_model)
    if brought is not None:  # a model that cannot serve is said before any input is read
        settings = brought_model_settings(settings, brought, vocab_size_given)
    replaced = False
    with _stop_signals():
        try:
            meta = prepare(inputs, output, settings, workers, brought)
            replaced = True
            print(report(meta))
            if report_file is not None:
                write_report(Path(report_file), meta, output)
                print(f"report of what cleaning dropped: {report_file}")
            print(f"corpus: {output}", flush=True)
        except Interrupted as stop:
            raise SystemExit(_stopped(stop, output, replaced or stop.corpus_replaced, report_file)) from None
    return 0


def brought_model_settings(settings: Settings, spm_model: Path, vocab_size_given: bool) -> Settings:
    """`settings` for a corpus with the SentencePiece model `spm_model` (checked): the vocabulary size is the
    model's, and an option that only shapes training one is refused rather than ignored."""
    model = read_sentencepiece(spm_model, settings)
    if vocab_size_given and settings.vocab_size != model.vocab_size:
        raise DataError(
            f"--vocab_size {settings.vocab_size} but --spm_model {spm_model} has {model.vocab_size} pieces: leave "
            "out --vocab_size (it is read from the model)"
        )
    for option in ("sample_size", "character_coverage", "seed"):
        if getattr(settings, option) != getattr(Settings, option):
            raise DataError(
                f"--{option} shapes the training of a SentencePiece model, and with --spm_model {spm_model} none "
                f"is trained: leave out --{option}"
            )
    return dataclasses.replace(settings, vocab_size=model.vocab_size)


def alignment_inputs(
    settings: Settings,
    train: Sequence[str],
    train_align: Sequence[str | Path],
    valid: str | None,
    valid_align: str | Path | None,
) -> dict[str, list[Path]]:
    """Split name → its alignment files, checked to exist, one per corpus (`--train_align`, `--valid_align`)."""
    if train_align and len(train_align) != len(train):
        raise DataError(
            f"--train_align has {len(train_align)} files for {len(train)} --train corpora: give one per corpus, "
            "in order"
        )
    if valid_align is not None and valid is None:
        raise DataError("--valid_align needs --valid: the alignments of which validation set?")
    found = {TRAIN: [Path(p) for p in train_align]} if train_align else {}
    if valid_align is not None and valid is not None:
        found[_named(valid, "valid")[0]] = [Path(valid_align)]
    given = [("--train_align", Path(p)) for p in train_align]
    if valid_align is not None:
        given.append(("--valid_align", Path(valid_align)))
    for option, path in given:
        if not path.is_file():
            raise DataError(f"{option} {path}: no such file")
    if found and settings.max_sentence_tokens > MAX_PIECES:
        raise DataError(
            f"alignments index pieces as 16-bit numbers: with --train_align or --valid_align, "
            f"--max_sentence_tokens must be at most {MAX_PIECES}"
        )
    return found


def check_per_corpus(settings: Settings, corpora: int) -> None:
    """One `--train_repeat` count (>= 1) and one `--train_tag` (one piece, or "") per `--train` corpus."""
    for option, values in (("--train_repeat", settings.train_repeat), ("--train_tag", settings.train_tag)):
        if values and len(values) != corpora:
            raise DataError(
                f"{option} has {len(values)} values for {corpora} --train corpora: give one per corpus, in order"
            )
    if any(n < 1 for n in settings.train_repeat):
        raise DataError(f"--train_repeat counts must be at least 1, got {list(settings.train_repeat)}")
    for symbol in [*settings.train_tag, *settings.user_defined_symbols]:
        if symbol != symbol.strip() or len(symbol.split()) > 1 or symbol in ("<pad>", "<unk>", "<s>", "</s>"):
            raise DataError(
                f"{symbol!r} cannot be a tag or a user-defined symbol: use one word without spaces that is not "
                "<pad>, <unk>, <s> or </s> (e.g. <BT>)"
            )
    if "" in settings.user_defined_symbols:
        raise DataError("--user_defined_symbols has an empty symbol")


def training_corpora(train: Sequence[str], src_lang: str) -> tuple[list[str], list[str]]:
    """(names, prefixes) of the `--train` corpora, each `PREFIX` or `NAME=PREFIX`; the names are [] when none
    is given (each corpus is then named by its prefix, as before names existed)."""
    named = [value.partition("=") for value in train]
    prefixes = [prefix if sep else name for name, sep, prefix in named]
    if len(set(prefixes)) != len(prefixes):
        raise DataError("a training corpus is given twice in --train")
    if not any(sep for _, sep, _ in named):
        return [], prefixes
    names = []
    for value, (name, sep, prefix) in zip(train, named, strict=True):
        if sep and not SPLIT_NAME.fullmatch(name):
            raise DataError(
                f"bad corpus name {name!r} in --train {value!r}: use letters, digits, '_', '.', '-' (e.g. "
                "--train europarl=raw/europarl)"
            )
        names.append(name if sep else corpus_name(Path(prefix), src_lang))
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise DataError(
            f"the training corpus name {twice!r} is given twice in --train: give each corpus a name of its own "
            "(--train NAME=PREFIX)"
        )
    return names, prefixes


def _named(value: str, default: str) -> tuple[str, str]:
    name, sep, prefix = value.partition("=")
    if not sep:
        return default, value
    if not SPLIT_NAME.fullmatch(name) or name == TRAIN:
        raise DataError(
            f"bad split name {name!r} in {value!r}: use letters, digits, '_', '.', '-', not 'train'"
        )
    return name, prefix


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """SIGTERM and Ctrl-C raise [Interrupted][attnx.data.prepare.interrupt.Interrupted] while this is held (after
    the [uninterrupted][attnx.data.prepare.interrupt.uninterrupted] block they come in, if any).

    A signal that comes after `attnx prepare` has said everything, while Python shuts down, is ignored: the
    command has finished, its last line says where the corpus is, and its status stays 0.
    """

    def stop(signum: int, frame: Any) -> None:
        interrupt(signum)

    try:
        previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        atexit.unregister(_ignore_stop_signals)  # once, however many times prepare runs in this process
        atexit.register(_ignore_stop_signals)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _stopped(stop: Interrupted, output: str | Path, replaced: bool, report_file: str | Path | None) -> int:
    """Say what an interrupted prepare left (one line on standard error); return the exit status."""
    for signum in STOP_SIGNALS:  # a second signal does not cut the line (`_stop_signals` restores them)
        signal.signal(signum, signal.SIG_IGN)
    how = "SIGTERM" if stop.signum == signal.SIGTERM else "Ctrl-C"
    if replaced:
        left = (
            f"{output} holds the complete corpus (run the same command again to print its report"
            f"{' and write --report ' + str(report_file) if report_file is not None else ''}; it reuses the "
            "corpus)"
        )
    else:
        left = f"{output} keeps what it held before (run the same command again to finish)"
    sys.stdout.flush()
    print(f"attnx prepare: interrupted by {how}; {left}", file=sys.stderr, flush=True)
    return 128 + stop.signum
