"""Weighted corpora (`data.corpus_weights`, `data.sampling_temperature`): the mix a run realizes against the one
asked. Multi30k's training pairs are cut into named corpora (in order), prepared into one folder with
`attnx prepare --train NAME=PREFIX ...`, and `attnx fit` trains briefly on them with the given weights.

    python bench/bench_corpus_mix.py [--data DIR] [--work DIR] [--sizes big=20000 small=9000]
        [--weights big=1 small=1] [--temperature T] [--steps 300] [--config configs/multi30k_cpu.yaml] [--json out.json]

Results go to stdout as a Markdown table, with the machine line: per corpus its pairs, the share asked, the share
expected after rounding to whole batches, and the shares of pairs and tokens the run trained on (its logged
`train/mix/NAME` and `train/mix_tokens/NAME` at the last step).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

from harness import MULTI30K_CPU, add_data_option, machine_line, multi30k

from attnx.cli import main as attnx
from attnx.data.datamodule import TranslationDataModule


def prepare(data: Path, work: Path, sizes: dict[str, int], vocab_size: int) -> Path:
    """Multi30k train cut into `sizes` (name → pairs, in order), prepared into `work/prepared`."""
    start, argv = 0, []
    for name, n in sizes.items():
        for lang in ("en", "de"):
            lines = multi30k(data, "train", lang)[start : start + n]
            (work / f"{name}.{lang}").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        argv += ["--train", f"{name}={work / name}"]
        start += n
    for lang in ("en", "de"):
        lines = multi30k(data, "val", lang)
        (work / f"val.{lang}").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    out = work / "prepared"
    command = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--vocab_size", str(vocab_size)]
    if attnx([*command, *argv, "--valid", str(work / "val"), "--output", str(out)]) != 0:
        raise SystemExit("attnx prepare failed")
    return out


def last_mix(run_dir: Path, names: list[str]) -> dict[str, tuple[float, float]]:
    """Each corpus's (pairs, tokens) share at the run's last logged step."""
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get(f"train/mix/{names[0]}")]
    last = rows[-1]
    return {n: (float(last[f"train/mix/{n}"]), float(last[f"train/mix_tokens/{n}"])) for n in names}


def run(args: argparse.Namespace, work: Path) -> list[dict[str, object]]:
    sizes = dict(_pairs(args.sizes, int))
    weights = dict(_pairs(args.weights, float)) if args.weights else None
    corpus = prepare(args.data, work, sizes, args.vocab_size)
    datamodule = TranslationDataModule(
        str(corpus), max_tokens=args.max_tokens, corpus_weights=weights, sampling_temperature=args.temperature
    )
    sampler, mix = datamodule.train_sampler, datamodule.corpus_mix
    mixing = []
    if weights is not None:
        mixing += ["--data.corpus_weights", json.dumps(weights)]
    if args.temperature is not None:
        mixing += ["--data.sampling_temperature", str(args.temperature)]
    config = args.config.resolve() if args.config.is_file() else args.config  # the run starts in `work`
    argv = ["fit", "--config", str(config), "--data.data_dir", str(corpus), *mixing]
    argv += ["--data.max_tokens", str(args.max_tokens), "--trainer.max_steps", str(args.steps)]
    argv += ["--evaluation.bleu_samples", "0"]
    previous = Path.cwd()
    os.chdir(work)
    try:
        if attnx(argv) != 0:
            raise SystemExit("attnx fit failed")
    finally:
        os.chdir(previous)
    names = [c.name for c in mix.corpora]
    logs = sorted(
        work.glob("runs/**/metrics.csv"), key=lambda p: p.stat().st_mtime
    )  # the config's CSV logger
    realized = last_mix(logs[-1].parent, names)
    return [
        {
            "corpus": c.name,
            "pairs": c.pairs,
            "asked": mix.shares[i],
            "expected": float(sampler.expected[i]),
            "realized_pairs": realized[c.name][0],
            "realized_tokens": realized[c.name][1],
            "steps": args.steps,
        }
        for i, c in enumerate(mix.corpora)
    ]


def _pairs(values: list[str], kind: type) -> list[tuple[str, object]]:
    out = []
    for value in values:
        name, sep, number = value.partition("=")
        if not sep:
            raise SystemExit(f"{value!r}: write NAME=NUMBER")
        out.append((name, kind(number)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_option(parser)
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the corpora and the run (default: temporary)"
    )
    parser.add_argument(
        "--sizes", nargs="+", default=["big=20000", "small=9000"], help="NAME=PAIRS, in order"
    )
    parser.add_argument(
        "--weights", nargs="*", default=["big=1", "small=1"], help="NAME=WEIGHT (none: no weights)"
    )
    parser.add_argument("--temperature", type=float, default=None, help="data.sampling_temperature")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps trained")
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument(
        "--config", type=Path, default=MULTI30K_CPU, help="the fit config (default the README's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_corpus_mix-")))
        work.mkdir(parents=True, exist_ok=True)
        rows = run(args, work)
    print(machine_line())
    asked = " ".join(args.weights or []) + (
        f" T={args.temperature:g}" if args.temperature is not None else ""
    )
    print(f"mix asked: {asked.strip()}; {args.steps} steps of {args.max_tokens} tokens ({args.config.name})")
    print("| corpus | pairs | asked | expected | realized (pairs) | realized (tokens) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['corpus']} | {row['pairs']:,} | {row['asked']:.1%} | {row['expected']:.1%} | "
            f"{row['realized_pairs']:.1%} | {row['realized_tokens']:.1%} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
