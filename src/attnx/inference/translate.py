"""``attnx translate``: text in, translations out, one segment a line, in the same order.

Lines are tokenized with the checkpoint's own SentencePiece model, sorted by length and decoded in batches
of at most ``max_tokens`` source tokens (padding included), then put back in input order. An empty or
whitespace-only line gives an empty line; a line longer than the model's ``max_len`` is truncated (with a
warning) rather than refused, so the output always has exactly as many lines as the input.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from attnx.checkpoint import CheckpointError, LoadedModel, load_model
from attnx.data.batch import collate
from attnx.inference.search import SearchConfig, translate_batch

log = logging.getLogger(__name__)


def token_batches(lengths: list[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices of ``lengths`` grouped, shortest first, so that rows × longest ≤ ``max_tokens`` (≥ 1 row each)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[i] > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _one_line(text: str) -> str:
    """Keep a translation on one output line whatever the detokenizer produced."""
    return text.replace("\r", " ").replace("\n", " ").strip()


def translate_lines(
    loaded: LoadedModel,
    lines: list[str],
    config: SearchConfig,
    max_tokens: int = 4096,
    progress: bool = False,
) -> list[str]:
    """Translate ``lines`` (one segment each) with a loaded model; returns one string per line, same order."""
    model, tokenizer = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    max_len = loaded.config.max_len
    if config.max_positions is None:
        config = replace(config, max_positions=max_len)
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    ids = tokenizer.encode_batch([texts[i] for i in todo]) if todo else []
    too_long = [todo[j] + 1 for j, x in enumerate(ids) if len(x) > max_len - 1]
    if too_long:
        shown = ", ".join(map(str, too_long[:10])) + (" ..." if len(too_long) > 10 else "")
        log.warning(
            "%d line(s) exceed the model's max_len of %d positions and were truncated to %d tokens: line %s",
            len(too_long),
            max_len,
            max_len - 1,
            shown,
        )
        ids = [x[: max_len - 1] for x in ids]

    out = [""] * len(lines)
    lengths = [len(x) + 1 for x in ids]  # + the source </s>
    with tqdm(total=len(ids), unit="sent", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
        for batch in token_batches(lengths, max_tokens):
            b = collate([(ids[j], []) for j in batch])
            hyps = translate_batch(model, b.src.to(device), b.src_mask.to(device), config)
            for j, hyp in zip(batch, hyps, strict=True):
                out[todo[j]] = _one_line(tokenizer.decode(hyp))
            bar.update(len(batch))
    return out


def split_segments(text: str) -> list[str]:
    """One segment per ``\\n``-terminated line (a final line without ``\\n`` counts; ``\\r\\n`` too)."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _read(source: str) -> tuple[list[str], bool]:
    if source == "-":
        return split_segments(sys.stdin.buffer.read().decode("utf-8", errors="replace")), False
    return split_segments(Path(source).read_bytes().decode("utf-8", errors="replace")), True


def _write(lines: list[str], target: str | None) -> None:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if target is None or target == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        Path(target).write_bytes(data)


def parse_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """``--device`` as a torch device that exists here, else a usage error."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        parser.error(f"--device {name!r}: {err}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: this torch build or machine has no CUDA device; use --device cpu")
    return device


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnx translate",
        description="Translate text with a checkpoint: one segment a line in, one translation a line out, "
        "same order and same number of lines (§6.1 beam search by default).",
    )
    parser.add_argument(
        "--ckpt_path", required=True, type=Path, help="checkpoint written by attnx fit/average"
    )
    parser.add_argument(
        "--input", default="-", help="file with one source segment a line, or - for stdin (default -)"
    )
    parser.add_argument("--output", default=None, help="file for the translations (default: stdout)")
    parser.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy search (default 4)")
    parser.add_argument(
        "--alpha", type=float, default=0.6, help="length penalty exponent α (default 0.6, §6.1)"
    )
    parser.add_argument(
        "--length_penalty",
        choices=("gnmt", "fairseq"),
        default="gnmt",
        help="gnmt: ((5+|Y|)/6)^α as in the paper; fairseq: |Y|^α (default gnmt)",
    )
    parser.add_argument(
        "--max_len_a",
        type=float,
        default=1.0,
        help="maximum output length = a × input length + b; this is a (default 1.0)",
    )
    parser.add_argument(
        "--max_len_b",
        type=int,
        default=50,
        help="maximum output length = a × input length + b; this is b (default 50)",
    )
    parser.add_argument(
        "--max_tokens",
        type=int,
        default=4096,
        help="source tokens per batch, padding included; batches are formed after sorting by length (default 4096)",
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device to decode on, e.g. cpu or cuda (default cpu)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error("--beam must be at least 1")
    if args.max_tokens < 1:
        parser.error("--max_tokens must be at least 1")
    if args.input != "-" and not Path(args.input).is_file():
        parser.error(f"input file {args.input} does not exist")
    device = parse_device(parser, args.device)
    try:
        loaded = load_model(args.ckpt_path, device=device)
    except CheckpointError as err:
        print(f"attnx translate: {err}", file=sys.stderr)
        return 2
    config = SearchConfig(
        beam=args.beam,
        alpha=args.alpha,
        length_penalty=args.length_penalty,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
    )
    lines, from_file = _read(args.input)
    warnings = logging.StreamHandler(sys.stderr)  # warnings reach the user whatever logging is set up
    warnings.setFormatter(logging.Formatter("attnx translate: warning: %(message)s"))
    log.addHandler(warnings)
    log.propagate = False
    try:
        translations = translate_lines(loaded, lines, config, args.max_tokens, progress=from_file)
    finally:
        log.removeHandler(warnings)
        log.propagate = True
    _write(translations, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
