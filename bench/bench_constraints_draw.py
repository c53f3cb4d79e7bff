"""Terminology constraints drawn from reference translations, as Post & Vilar (2018) and Hu et al. (2019)
evaluate lexically constrained decoding: per sentence, ``--phrases`` random phrases of 1 to ``--max_words``
consecutive reference words, not overlapping, with a fixed seed.

    python bench/bench_constraints_draw.py --references ../shared/data/multi30k/test_2016_flickr.de.gz \
        --phrases 1 --output test.1phrase.jsonl [--max_words 3] [--seed 1]

The output has one JSON object a line, ``{"include": ["..."]}``, the format ``attnx translate --constraints``
reads (a sentence too short for more phrases gets fewer; a blank reference gets ``{}``, no constraint).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path


def draw(words: list[str], phrases: int, max_words: int, rng: random.Random) -> list[str]:
    """Up to `phrases` phrases of 1 to `max_words` consecutive `words`, not overlapping, in sentence order."""
    taken = [False] * len(words)
    spans: list[tuple[int, int]] = []
    for _ in range(phrases):
        length = rng.randint(1, max_words) + 1
        starts: list[int] = []
        while not starts and length > 1:  # shorter when no span of that length is free
            length -= 1
            starts = [i for i in range(len(words) - length + 1) if not any(taken[i : i + length])]
        if not starts:
            break
        start = rng.choice(starts)
        taken[start : start + length] = [True] * length
        spans.append((start, start + length))
    return [" ".join(words[a:b]) for a, b in sorted(spans)]


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--references", type=Path, required=True, help="reference translations (plain or .gz)"
    )
    parser.add_argument("--output", type=Path, required=True, help="constraints file to write (JSON lines)")
    parser.add_argument("--phrases", type=int, default=1, help="phrases per sentence (1 or 2 in the papers)")
    parser.add_argument("--max_words", type=int, default=3, help="words per phrase at most")
    parser.add_argument("--seed", type=int, default=1, help="seed of the draw")
    parser.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)
    if args.phrases < 1 or args.max_words < 1:
        sys.exit("--phrases and --max_words must be at least 1")
    if args.output.exists() and not args.force:
        sys.exit(f"{args.output} exists: give --force to replace it")
    rng = random.Random(args.seed)
    rows = []
    for line in read_lines(args.references):
        phrases = draw(line.split(), args.phrases, args.max_words, rng)
        rows.append(json.dumps({"include": phrases} if phrases else {}, ensure_ascii=False))
    args.output.write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} lines of constraints to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
