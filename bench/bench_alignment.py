"""Alignment error of the alignments attnx prints, against an aligner's on held-out pairs (guided alignment).

    python bench/bench_alignment.py --checkpoint runs/plain/.../averaged.ckpt runs/guided/.../averaged.ckpt \\
        --source heldout.en --target heldout.de --reference heldout.align [--pairs 1000] [--json out.json]

Each checkpoint aligns the given pairs as `attnx translate --search.alignment` does for its own outputs (a
teacher-forced pass over the reference target, the last decoder layer's encoder-decoder attention averaged over
heads, each target piece linked to the source piece it attends to most); those piece links become word links (a
word pair is linked when any of their pieces are) and are compared with the aligner's (`--reference`, Pharaoh,
0-based whitespace words: what docs/training.md's eflomal recipe writes). The aligner's links serve as both sure
and possible links: AER = 1 - 2|A ∩ R| / (|A| + |R|), with precision |A ∩ R| / |A| and recall |A ∩ R| / |R|.
Results go to stdout as a Markdown table, with the machine line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import machine_line

from attnx.data.prepare.alignments import PieceMap, parse_links
from attnx.inference.config import SearchConfig
from attnx.inference.load import load


def read_lines(path: Path, n: int) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[:n]


def word_links(
    pairs: list[tuple[int, int]], src_words: list[int], tgt_words: list[int]
) -> set[tuple[int, int]]:
    """Piece links `(source piece, target piece)` as word links (any linked pieces link their words)."""
    return {(src_words[i], tgt_words[j]) for i, j in pairs if i < len(src_words) and j < len(tgt_words)}


def measure(checkpoint: Path, sources: list[str], targets: list[str], reference: list[set]) -> dict:
    translator = load(checkpoint, search=SearchConfig(alignment=True), precision="32-true")
    pieces = PieceMap(translator.tokenizer)
    hypotheses = translator.score(sources, targets)
    found = hit = expected = 0
    for src, tgt, ref, hyp in zip(sources, targets, reference, hypotheses, strict=True):
        src_words = pieces.words(src, translator.tokenizer.encode(src)).tolist()
        tgt_words = pieces.words(tgt, translator.tokenizer.encode(tgt)).tolist()
        links = word_links(hyp.alignment or [], src_words, tgt_words)
        found, hit, expected = found + len(links), hit + len(links & ref), expected + len(ref)
    return {
        "checkpoint": str(checkpoint),
        "pairs": len(sources),
        "precision": hit / found if found else float("nan"),
        "recall": hit / expected if expected else float("nan"),
        "aer": 1 - 2 * hit / (found + expected) if found + expected else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", nargs="+", type=Path, required=True, help="checkpoints to compare")
    parser.add_argument(
        "--source", type=Path, required=True, help="held-out source text, one sentence a line"
    )
    parser.add_argument("--target", type=Path, required=True, help="its reference translations")
    parser.add_argument(
        "--reference", type=Path, required=True, help="the aligner's Pharaoh links of the pairs"
    )
    parser.add_argument("--pairs", type=int, default=1000, help="the first this many pairs")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    sources, targets = read_lines(args.source, args.pairs), read_lines(args.target, args.pairs)
    lines = read_lines(args.reference, args.pairs)
    if not (len(sources) == len(targets) == len(lines)):
        print(
            f"error: {len(sources)} sources, {len(targets)} targets and {len(lines)} alignment lines",
            file=sys.stderr,
        )
        return 2
    reference = [set(parse_links(line, args.reference, k)) for k, line in enumerate(lines, 1)]
    rows = [measure(path, sources, targets, reference) for path in args.checkpoint]
    print(machine_line())
    print()
    print("| checkpoint | pairs | precision | recall | AER |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['checkpoint']} | {r['pairs']} | {r['precision']:.3f} | {r['recall']:.3f} | {r['aer']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
