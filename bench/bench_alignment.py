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

The study (`--work` instead of `--checkpoint`) trains both models first, on Multi30k for the same budget:

    python bench/bench_alignment.py --work align_runs --train_align train.align \\
        --reference test_2016_flickr.align [--minutes 30 | --steps N] [--warmup_steps N] [--precision P] \\
        [--alignment_lambda 0.05] [--threads 2] [--output table.md]

`configs/multi30k_cpu.yaml` as it is (run `arm_paper`, the name bench_components.py gives the same model, so one
work folder serves both studies) and with `model.loss: guided_alignment` on a second corpus prepared with
`--train_align` (run `arm_guided_alignment`), each averaged, translated with beam 4 and scored on
test_2016_flickr (sacreBLEU BLEU, chrF2), their training tokens/s (median of `train/tokens_per_s`, source +
target) and the alignment error of each on the test pairs against `--reference`. `--train_align` and
`--reference` are the eflomal links of Multi30k's train and test_2016_flickr (docs/training.md). Expected wall
time: the two budgets plus about a minute each to average, translate and align; a step already done is not
repeated. `--train_lines`, `--test_lines` cut the corpora for a smoke test of the script only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnx_steps import PAPER_BEAM, Steps, add_budget_options, add_step_options, budget, tokens_per_s, updates
from harness import machine_line, publish

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


def reference_links(path: Path, pairs: int) -> list[set]:
    return [set(parse_links(line, path, k)) for k, line in enumerate(read_lines(path, pairs), 1)]


def study(args: argparse.Namespace) -> int:
    """Train Multi30k's model with and without guided alignment for the same budget; score and align both."""
    steps = Steps.from_args(args)
    train_align = args.train_align.resolve()
    if args.train_lines:  # the smoke test's cut corpus keeps the links of its lines
        cut = steps.work / "raw" / "train.align"
        cut.parent.mkdir(parents=True, exist_ok=True)
        cut.write_text("".join(f"{line}\n" for line in read_lines(train_align, args.train_lines)))
        train_align = cut
    data, source, target = steps.multi30k(args.train_lines, args.test_lines)
    aligned, _, _ = steps.multi30k(
        args.train_lines, args.test_lines, "multi30k_aligned", "--train_align", str(train_align)
    )
    sources, targets = read_lines(source, args.pairs), read_lines(target, args.pairs)
    reference = reference_links(args.reference, len(sources))
    if len(reference) != len(sources):
        raise SystemExit(f"{args.reference}: {len(reference)} lines for {len(sources)} test pairs")
    loss = {
        "name": "guided_alignment",
        "args": {"alignment_lambda": args.alignment_lambda, "layer": -1, "head": "mean"},
    }
    limits, budget_text = budget(args)
    rows = []
    for arm, label, data_dir, model in (
        ("arm_paper", "paper (label-smoothed loss)", data, {}),
        ("arm_guided_alignment", f"guided alignment (λ {args.alignment_lambda:g})", aligned, {"loss": loss}),
    ):
        config = steps.arm_config(
            arm, data_dir, warmup_steps=args.warmup_steps, precision=args.precision, model=model, **limits
        )
        averaged = steps.fit(arm, config)
        hypotheses, _ = steps.translate(arm, averaged, source, *PAPER_BEAM)
        score = steps.score(arm, hypotheses, target)
        links = measure(averaged, sources, targets, reference)
        run = steps.work / "runs" / arm
        rows.append([label, f"{score['bleu']:.2f}", f"{score['chrf']:.2f}", f"{tokens_per_s(run):,.0f}",
                     f"{updates(run):,}", f"{links['aer']:.3f}", f"{links['precision']:.3f}",
                     f"{links['recall']:.3f}"])  # fmt: skip
    columns = ["model", "BLEU", "chrF2", "train tokens/s", "updates", "AER", "precision", "recall"]
    title = f"Guided alignment on Multi30k en-de, {budget_text} of training each"
    title += f", alignments of {len(sources)} test pairs"
    publish(title, columns, rows, args.output)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", nargs="+", type=Path, help="checkpoints to compare")
    parser.add_argument("--source", type=Path, help="held-out source text, one sentence a line")
    parser.add_argument("--target", type=Path, help="its reference translations")
    parser.add_argument(
        "--reference", type=Path, required=True, help="the aligner's Pharaoh links of the held-out pairs"
    )
    parser.add_argument("--pairs", type=int, default=1000, help="the first this many pairs")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    study_options = parser.add_argument_group("the study (--work instead of --checkpoint)")
    add_step_options(study_options, required=False)
    add_budget_options(study_options)
    study_options.add_argument("--train_align", type=Path, help="the aligner's links of Multi30k's train")
    study_options.add_argument(
        "--warmup_steps", type=int, help="both runs' model.warmup_steps (default: the config's)"
    )
    study_options.add_argument("--precision", help="both runs' --trainer.precision (default: the config's)")
    study_options.add_argument(
        "--alignment_lambda", type=float, default=0.05, help="the guided run's alignment_lambda"
    )
    study_options.add_argument("--train_lines", type=int, help="smoke test only: train on the first N pairs")
    study_options.add_argument("--test_lines", type=int, help="smoke test only: score the first N test pairs")
    args = parser.parse_args(argv)
    if (args.work is None) == (args.checkpoint is None):
        parser.error("give --checkpoint (measure these) or --work (train both, then measure)")
    if args.work is not None:
        if args.train_align is None:
            parser.error("the study needs --train_align (the aligner's links of Multi30k's train)")
        if args.json is not None:
            parser.error("--json goes with --checkpoint; the study writes its table to --output")
        return study(args)
    if args.source is None or args.target is None:
        parser.error("--checkpoint needs --source and --target")
    sources, targets = read_lines(args.source, args.pairs), read_lines(args.target, args.pairs)
    reference = reference_links(args.reference, args.pairs)
    if not (len(sources) == len(targets) == len(reference)):
        print(
            f"error: {len(sources)} sources, {len(targets)} targets and {len(reference)} alignment lines",
            file=sys.stderr,
        )
        return 2
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
