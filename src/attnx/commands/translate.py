"""`attnx translate`, `attnx attention` and `attnx score`: a trained model on text, and BLEU of a file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from attnx.inference.config import DEFAULT_MAX_TOKENS, PAPER_SEARCH, SearchConfig


def split_segments(text: str) -> list[str]:
    """One segment per `\\n`-terminated line (a final line without `\\n` counts; `\\r\\n` too)."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_segments(source: str) -> list[str]:
    """Lines of a UTF-8 file, or of standard input for `-`; bytes that are not UTF-8 become U+FFFD."""
    if source == "-":
        return split_segments(sys.stdin.buffer.read().decode("utf-8", errors="replace"))
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"input file {source} does not exist")
    return split_segments(path.read_bytes().decode("utf-8", errors="replace"))


def write_segments(lines: list[str], target: str) -> None:
    """Lines to standard output (`-`), or to a file through a temporary name, so that an interrupted write
    leaves no half-written file and a file read as input is replaced only once the output is complete."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if target == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        from attnx.checkpoint import atomic_write

        with atomic_write(target, needed=len(data), what="translations") as f:
            f.write(data)


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
    device: str = "cpu",
    force: bool = False,
) -> int:
    """Translate text with a trained model: one segment a line in, one translation a line out, same order.

    The model is a checkpoint of attnx fit/average or a directory of attnx export --format ctranslate2; it
    carries its own SentencePiece model. Blank lines stay blank; lines longer than the model accepts are
    truncated with a warning. Decoding is the model's own default (a checkpoint: §6.1's beam 4, α 0.6, GNMT
    length penalty, input length + 50; an export: the settings stored with it) unless --search.* says
    otherwise (attnx translate --search.help lists them).
    Example: echo "A dog runs." | attnx translate --model base.ckpt

    Args:
        model: Checkpoint file (*.ckpt) or exported CTranslate2 directory.
        input: File with one source segment a line, or - for standard input.
        output: File for the translations, or - for standard output.
        search: Beam size, length penalty and maximum output length, e.g. --search.beam 1 (greedy).
        max_tokens: Source tokens per decoding batch, padding included.
        device: Where to decode: cpu, cuda, cuda:1, ...
        force: Replace the --output file if it exists (otherwise an existing file is left and the command stops).
    """
    import logging

    from attnx.commands.usage import refuse_to_replace, require_extra
    from attnx.inference.ctranslate2 import is_ctranslate2_model
    from attnx.inference.load import load

    if output != "-":
        refuse_to_replace(output, force)
    check_device(device)
    if is_ctranslate2_model(model):
        require_extra("ct2", f"attnx translate --model {model} (a CTranslate2 model)")
    lines = read_segments(input)
    translator = load(model, device=device, search=search, max_tokens=max_tokens)
    warnings = logging.StreamHandler(sys.stderr)  # warnings reach the user whatever logging is set up
    warnings.setFormatter(logging.Formatter("attnx translate: warning: %(message)s"))
    log = logging.getLogger("attnx")
    log.addHandler(warnings)
    try:
        translations = translator.translate(lines, progress=input != "-" and sys.stderr.isatty())
    finally:
        log.removeHandler(warnings)
    write_segments(translations, output)
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

    from attnx.evaluation.bleu import score_files

    for path in (hypotheses, references):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
    report = score_files(hypotheses, references, lang)
    print(json.dumps(dataclasses.asdict(report)) if format == "json" else "\n".join(report.lines()))
    return 0
