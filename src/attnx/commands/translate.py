"""`attnx translate`, `attnx attention` and `attnx score`: a trained model on text, and BLEU of a file."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any, Literal

from attnx.commands.resumable import PARTIAL, ResumableOutput, StreamOutput, with_precision
from attnx.commands.text_input import TextInput
from attnx.errors import ConfigError
from attnx.inference.config import (
    AUTO,
    DEFAULT_MAX_TOKENS,
    PAPER_SEARCH,
    PRECISIONS,
    Precision,
    SearchConfig,
    check_precision,
)
from attnx.inference.formats import OutputFormat


def check_device(device: str) -> None:
    """A usage error for a device this machine does not have."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as err:
        raise ConfigError(f"--device {device!r}: {err}") from None
    index = torch.device(device).index or 0
    if kind == "cuda" and index >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); use --device cpu"
            + (" or cuda:0" if torch.cuda.is_available() else "")
        )


def decoding_device(device: str, models: list[str]) -> tuple[str, str | None]:
    """The device `--device` names, and for `auto` the one it chose with the line that says so: CUDA where
    this machine has it (and, for a CTranslate2 export, where CTranslate2 was built with it), else the CPU."""
    if device != "auto":
        return device, None
    import torch

    from attnx.inference.ctranslate2 import is_ctranslate2_model

    cuda = torch.cuda.is_available()
    if cuda and any(is_ctranslate2_model(path) for path in models):
        import ctranslate2

        cuda = ctranslate2.get_cuda_device_count() > 0
    why = "a CUDA device is here; --device cpu decodes on the CPU" if cuda else "no CUDA device here"
    chosen = "cuda" if cuda else "cpu"
    return chosen, f"attnx translate: decoding on {chosen} (--device auto: {why})"


def kept_precision(
    output: str, options: dict[str, Any] | None, model: str | list[str], precision: str, device: str
) -> tuple[str, str | None] | None:
    """What `--precision auto` decodes in when it continues the interrupted run of the file `output` (whose
    other `options` it shares): the precision, or an export's CTranslate2 compute type, that run recorded, as
    (precision, compute type or None) to load with. None to choose afresh: a precision given, no such run, or one
    this device cannot decode in (the run then starts over, saying so)."""
    from attnx.commands.resumable import decoded_in, interrupted_run

    previous = None if options is None or precision != AUTO else interrupted_run(output)
    if previous is None:
        return None
    recorded = previous["options"]
    if any(recorded.get(key) != value for key, value in json.loads(json.dumps(options)).items()):
        return None  # another model or other options: it starts over, and auto chooses afresh
    label = decoded_in(recorded)
    if label in PRECISIONS:  # a checkpoint's (32-true where none is recorded)
        try:
            check_precision(label, device.split(":")[0])
        except ConfigError:
            return None
        return label, None
    from attnx.inference.ctranslate2 import is_ctranslate2_model

    paths = [model] if isinstance(model, str) else model
    if len(paths) != 1 or not is_ctranslate2_model(paths[0]):
        return None
    import torch

    from attnx.inference.compute_type import supported_compute_types

    return (AUTO, label) if label in supported_compute_types(torch.device(device)) else None


def own_search(values: dict[str, Any]) -> SearchConfig | None:
    """The search settings the `--model` of a command line decodes with unless its `--search.*` options change
    them: an export's stored ones; None for checkpoints, whose own are SearchConfig's defaults (and for an
    export of another format, which its loader refuses)."""
    from attnx.commands.spellings import ensemble_members
    from attnx.inference.ctranslate2 import FORMAT_VERSION, read_metadata, stored_search

    model = ensemble_members(values["model"])
    paths = [model] if isinstance(model, str) else model
    meta = read_metadata(paths[0]) if len(paths) == 1 else None
    if meta is None or meta.get("format_version") != FORMAT_VERSION:
        return None
    return stored_search(meta)


def translate(
    model: list[str] | str,
    input: str = "-",
    output: str = "-",
    format: OutputFormat = "text",
    target: str | None = None,
    prefix: str | None = None,
    constraints: str | None = None,
    constraint: str | None = None,
    token_scores: bool = False,
    weights: list[float] | None = None,
    search: SearchConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    buffer_size: int = 2000,
    device: str = "auto",
    precision: Precision = AUTO,
    force: bool = False,
) -> int:
    """Translate text with a trained model: one segment a line in, one translation a line out, same order.

    The model is a checkpoint of attnx fit/average or a directory of attnx export --format ctranslate2; it
    carries its own SentencePiece model. Blank lines stay blank; lines longer than the model accepts are
    truncated with a warning. Decoding is the model's own default (a checkpoint: §6.1's beam 4, α 0.6, GNMT
    length penalty, input length + 50; an export: the settings stored with it), of which --search.* change
    some (attnx translate --search.help lists them: n-best, sampling, constraints, alignments); on an export
    the others stay as stored: --beam 2 keeps its length penalty.
    With --target, nothing is searched: the given translations are scored (forced decoding).

    Input of any size is read, translated and written --buffer_size lines at a time, in input order; a pipe
    or terminal gets each line's translation as soon as it is ready. An --output file grows as
    OUTPUT.attnx-partial and appears under its name only once complete; a run stopped on the way (SIGTERM,
    Ctrl+C, a kill, a full disk) keeps the lines done, and the same command run again continues after them.
    Example: echo "A dog runs." | attnx translate --model base.ckpt --search.nbest 4 --format jsonl

    Args:
        model: Checkpoint file (*.ckpt) or exported CTranslate2 directory; several checkpoints are decoded
            as one ensemble: --model a.ckpt b.ckpt, --model a.ckpt:b.ckpt (fairseq's way) or
            --model "[a.ckpt,b.ckpt]".
        input: File, named pipe or <(process substitution) with one source segment a line, or - for
            standard input.
        output: File for the translations, or - for standard output.
        format: text (the best translation a line; with --search.alignment true, "text ||| 0-0 1-2 ...";
            with --search.nbest above 1, Marian's n-best lines "id ||| text ||| score", id from 0),
            jsonl (one JSON object a line: every hypothesis with text, score, log_prob, tokens) or moses
            (n-best lines "id ||| text ||| F0= log_prob ||| score"). score is what the search ranked by
            (log_prob / length penalty), log_prob the total log-probability in nats.
        target: File of translations, one per --input line, to score instead of searching (forced decoding).
        prefix: File of target prefixes, one per --input line (blank: none), every translation must start with.
        constraints: File of terminology constraints, one line per --input line (blank: none): a JSON object
            {"include": ["phrase", ...], "exclude": ["phrase", ...], "ordered": false}, a JSON array of
            phrases to include, null, a JSON string (one phrase), or else tab-separated phrases to include.
            Every translation contains each phrase to include (in the given order with "ordered": true) and
            none to exclude, as whole words however the model spells them ("whole_words": false: inside
            longer words too); docs/decoding.md.
        constraint: The same constraints for every input line, written as one line of --constraints, e.g.
            --constraint Bestellnummer or --constraint '{"exclude": ["Auftragsnummer"]}'.
        token_scores: Also write each target piece's log-probability (jsonl: pieces and token_log_probs;
            moses: a WordScores= field).
        weights: Ensemble weights, one per --model checkpoint (default: equal), e.g. "[0.6,0.4]".
        search: Beam size, n-best, sampling, length penalty, maximum output length, e.g. --search.beam 1
            (greedy).
        max_tokens: Source tokens per decoding batch, padding included.
        buffer_size: Lines read, translated (sorted by length) and written at a time; a pipe's lines are
            translated as they arrive, up to this many together.
        device: Where to decode: auto (CUDA where this machine has it, else the CPU; the choice is said on
            standard error), cpu, cuda, cuda:1, ...
        precision: A checkpoint decodes in 32-true, bf16-mixed or 16-mixed (CUDA only): the matrix products
            under autocast in bf16 or fp16, softmax and scores in float32; faster where the device has units
            for them, and a translation may differ from fp32's. An export loads with the matching CTranslate2
            compute type. auto (the default): bf16-mixed where a probe finds the device's bf16 units make
            decoding faster, else 32-true; an export, the compute type a probe finds fastest here; the
            choice is said on standard error. An --output run continued after an interruption decodes in what
            it started in (recorded with its lines).
        force: Replace the --output file if it exists (otherwise an existing file is left and the command stops).
    """
    from attnx.commands.spellings import ensemble_members
    from attnx.commands.streaming import (
        PairedInputs,
        Stop,
        TranslationJob,
        check_output_options,
        content_digest,
        run_options,
        run_translation,
        stop_on_sigterm,
    )
    from attnx.commands.usage import refuse_to_replace, require_extra
    from attnx.inference.ctranslate2 import is_ctranslate2_model

    model = ensemble_members(model)
    if buffer_size < 1:
        raise ConfigError(f"--buffer_size must be at least 1, got {buffer_size}")
    check_output_options(format, target, prefix, token_scores, search)
    if output != "-":
        refuse_to_replace(output, force)
    device, chosen = decoding_device(device, model if isinstance(model, list) else [model])
    check_device(device)
    check_precision(precision, device.split(":")[0])
    for path in model if isinstance(model, list) else [model]:
        if is_ctranslate2_model(path):
            require_extra("ct2", f"attnx translate --model {path} (a CTranslate2 model)")
    from attnx.commands.constraint_lines import ENGINES, ConstraintLines, EnginePlan, check_continued

    terms = ConstraintLines(constraints, constraint)
    if target is not None and terms.given:
        raise ConfigError("--target scores given translations: --constraints and --constraint do not apply")
    with stop_on_sigterm():
        try:
            with PairedInputs(input, target=target, prefix=prefix, constraints=constraints) as inputs:
                inputs.check_line_counts()
                from attnx.inference.load import DecodingPrecision, load

                # what decides a file's lines, for its record (standard output keeps none)
                options = None
                if output != "-":
                    options = run_options(
                        model, weights, search, format, token_scores, None, buffer_size, max_tokens
                    )
                kept = kept_precision(output, options, model, precision, device)
                translator = load(
                    model,
                    device=device,
                    search=search,
                    max_tokens=max_tokens,
                    weights=weights,
                    precision=kept[0] if kept else precision,
                    compute_type=kept[1] if kept else None,
                )  # `auto` measured on the model and said once
                runs_in = DecodingPrecision.of(translator, precision)
                if kept:
                    print(
                        f"attnx translate: decoding in {runs_in.label}, as the interrupted run in {output}{PARTIAL} "
                        "did (--precision auto continues a run in the precision it started in)",
                        file=sys.stderr,
                        flush=True,
                    )
                if options is not None:
                    options = with_precision(options, runs_in.label)
                if (
                    options is not None and terms.given
                ):  # a continued run must decode with the same constraints
                    file = constraints if constraints and Path(constraints).is_file() else None
                    options["constraints"] = {"file": file and content_digest(file), "inline": constraint}
                # an export hands its lines with constraints to its checkpoint: decided once, for every line
                plan = EnginePlan.decide(translator, model, terms, "attnx translate")
                if options is not None and plan is not None:
                    options[ENGINES] = plan.record
                sink = StreamOutput() if options is None else ResumableOutput(output, options)
                sink.prepare()
                if plan is not None and isinstance(sink, ResumableOutput):
                    check_continued(sink.previous, sink.options, str(sink.partial))
                from attnx.checkpoint.ema import checkpoint_weights_line

                if chosen:  # once the model is on it
                    print(chosen, file=sys.stderr, flush=True)
                if ema := checkpoint_weights_line(model, "translate"):
                    print(ema, file=sys.stderr, flush=True)
                if (
                    drawn := translator.search.samples_drawn()
                ) is not None:  # fairseq's --sampling draws more
                    print(f"attnx translate: {drawn}", file=sys.stderr, flush=True)

                if plan is not None:
                    same = translator.search  # the checkpoint searches as the export does
                    translator = plan.translator(
                        translator,
                        lambda ckpt: load(
                            ckpt, device=device, search=same, max_tokens=max_tokens, precision=precision
                        ),
                    )
                job = TranslationJob(translator, format, token_scores, buffer_size, terms)
                return run_translation(job, inputs, sink)
        except Stop:  # before the first line was read: nothing to keep
            print(
                "attnx translate: stopped by SIGTERM before translating; nothing was written", file=sys.stderr
            )
            return 128 + signal.SIGTERM


translate.own_search = own_search  # --search.* change an export's stored settings


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
        raise ConfigError("--text is empty: give the sentence to translate and draw")
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
    hypotheses: Path,
    references: Path,
    lang: str = "de",
    format: Literal["text", "json"] = "text",
    sentence: bool = False,
) -> int:
    """Score a detokenized translation file against a reference file, line by line.

    Prints sacreBLEU BLEU and chrF2 with their signatures, and the paper-style tokenized BLEU (not comparable
    to sacreBLEU); with --sentence, the scores of each segment instead. Either file may be gzipped (*.gz, as
    attnx download writes them). Example: attnx score --hypotheses test.hyp --references newstest2014.de

    Args:
        hypotheses: Translations, one segment a line (plain or gzipped), or - for standard input.
        references: References, one segment a line, in the same order (plain or gzipped).
        lang: Target language, for the paper-style BLEU's Moses tokenizer.
        format: text (one score a line) or json.
        sentence: One line per segment on standard output, in input order: its sentence BLEU and chrF2
            (sacreBLEU's sentence_bleu and sentence_chrf), tab-separated, or with --format json one object a
            line, {"line": 1, "bleu": ..., "chrf": ...}; the corpus scores go to standard error.
    """
    import dataclasses
    import json

    from attnx.evaluation.bleu import check_pairs, sentence_scores
    from attnx.evaluation.bleu import score as bleu

    texts = {}
    for option, path in (("--hypotheses", hypotheses), ("--references", references)):
        with TextInput(path, option) as text:
            texts[option] = [line.rstrip() for line in text.read_all()]
            if text.warning():
                print(f"attnx score: warning: {text.warning()}", file=sys.stderr)
    hyps, refs = texts["--hypotheses"], texts["--references"]
    check_pairs(hyps, refs, f"--hypotheses {hypotheses}", f"--references {references}")
    report = bleu(hyps, refs, lang)
    corpus = json.dumps(dataclasses.asdict(report)) if format == "json" else "\n".join(report.lines())
    if not sentence:
        print(corpus)
        return 0
    for number, scores in enumerate(sentence_scores(hyps, refs), start=1):
        if format == "json":
            print(json.dumps({"line": number, **dataclasses.asdict(scores)}))
        else:
            print(f"{scores.bleu:.2f}\t{scores.chrf:.2f}")
    print(corpus, file=sys.stderr)
    return 0
