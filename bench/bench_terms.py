"""Terminology constraints on a term list, not on phrases cut from the references: words the references lack,
words after an opening bracket or quote, a word listed twice, words to exclude (compounds of them allowed).
Per set: the phrases met (included) or kept out (excluded) as whole words of the detokenized output, sacreBLEU
without and with the constraints, and sentences/s of each, in one process (model loaded once).

    python bench/bench_terms.py --model averaged.ckpt --source ../shared/data/multi30k/test_2016_flickr.en.gz \
        --references ../shared/data/multi30k/test_2016_flickr.de.gz [--limit 1000] [--beam 4] [--threads 2] \
        [--precision 32-true] [--seed 1] [--output terms.md]

Sets (one phrase per sentence, a fixed seed):
- `reference word`: a word of 4+ letters of the reference (what earlier tables measure);
- `absent word`: a word of 4+ letters of another sentence's reference that this reference lacks;
- `after ( / „`: the output is forced to start with `(` or `„` (a prefix), then must hold a reference word: the
  word must follow the bracket without a space (`„Hund`, not `„ Hund`), counted as `stray spaces`;
- `listed twice`: a reference word to include twice: it must appear twice;
- `excluded word`: a word of 4+ letters the unconstrained output holds, to exclude: it must not appear as a word
  (`compounds kept` counts outputs that still hold it inside a longer word, which whole-word matching allows).
"""

from __future__ import annotations

import argparse
import platform
import random
import re
import sys
import time
from pathlib import Path

import torch
from bench_constraints_draw import read_lines

from attnx.evaluation.bleu import score
from attnx.inference.config import SearchConfig
from attnx.inference.eager import EagerTranslator
from attnx.inference.terms import surface_contains

WORD = re.compile(r"\w{4,}")


def words(text: str) -> list[str]:
    return WORD.findall(text)


def draw_sets(refs: list[str], plain: list[str], rng: random.Random) -> dict[str, list[dict]]:
    """Per set, one constraints object per sentence (None: the sentence has no word to draw)."""
    pool = sorted({w for r in refs for w in words(r)})
    sets: dict[str, list] = {"reference word": [], "absent word": [], "after ( / „": [], "listed twice": []}
    sets["excluded word"] = []
    for ref, out in zip(refs, plain, strict=True):
        own = words(ref)
        word = rng.choice(own) if own else None
        sets["reference word"].append({"include": [word]} if word else None)
        absent = [w for w in (rng.choice(pool) for _ in range(20)) if w not in ref]
        sets["absent word"].append({"include": [absent[0]]} if absent else None)
        sets["after ( / „"].append({"include": [word], "prefix": rng.choice(["(", "„"])} if word else None)
        sets["listed twice"].append({"include": [word, word]} if word else None)
        written = words(out)
        sets["excluded word"].append({"exclude": [rng.choice(written)]} if written else None)
    return sets


def run(
    translator: EagerTranslator, lines: list[str], items: list[dict | None] | None
) -> tuple[list[str], float]:
    """The translations and the seconds they took."""
    constraints = (
        None if items is None else [c and {k: v for k, v in c.items() if k != "prefix"} for c in items]
    )
    prefixes = None
    if items is not None and any(c and "prefix" in c for c in items):
        prefixes = [(c or {}).get("prefix", "") for c in items]
    start = time.perf_counter()
    hyps = translator.generate(lines, prefixes=prefixes, constraints=constraints)
    return [h[0].text for h in hyps], time.perf_counter() - start


def row(
    name: str, outs: list[str], seconds: float, items: list, refs: list[str], plain_bleu: float, plain_rate
):
    held = total = compounds = stray = 0
    for out, c in zip(outs, items, strict=True):
        if not c:
            continue
        for word in set(c.get("include", [])):
            need = c["include"].count(word)
            total += need
            held += min(surface_contains(out, word), need)
            if "prefix" in c and re.search(re.escape(f"{c['prefix']} {word}") + r"(?!\w)", out):
                stray += 1  # the word right after the bracket, a space between
        for word in c.get("exclude", []):
            total += 1
            held += surface_contains(out, word) == 0
            compounds += word in out
    rate = len(outs) / seconds
    return {
        "set": name,
        "phrases met / kept out (as words)": f"{held:,}/{total:,} ({100 * held / max(total, 1):.1f}%)",
        "BLEU without": f"{plain_bleu:.2f}",
        "BLEU with": f"{score(outs, refs).bleu:.2f}",
        "sent/s without": f"{plain_rate:.1f}",
        "sent/s with": f"{rate:.1f}",
        "stray spaces": str(stray) if name.startswith("after") else "",
        "compounds kept": str(compounds) if name.startswith("excluded") else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint (*.ckpt)")
    parser.add_argument("--source", type=Path, required=True, help="source lines (plain or .gz)")
    parser.add_argument("--references", type=Path, required=True, help="reference lines (plain or .gz)")
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences only")
    parser.add_argument("--beam", type=int, default=4, help="beam size")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--precision", default="32-true", help="decoding precision")
    parser.add_argument("--seed", type=int, default=1, help="seed of the drawn words")
    parser.add_argument("--output", type=Path, default=None, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines, refs = read_lines(args.source)[: args.limit], read_lines(args.references)[: args.limit]
    search = SearchConfig(beam=args.beam)
    translator = EagerTranslator.from_checkpoint(args.model, search=search, precision=args.precision)
    translator.generate(lines[:8])  # warm-up
    plain, seconds = run(translator, lines, None)
    plain_bleu, plain_rate = score(plain, refs).bleu, len(lines) / seconds
    rows = []
    for name, items in draw_sets(refs, plain, random.Random(args.seed)).items():
        outs, seconds = run(translator, lines, items)
        rows.append(row(name, outs, seconds, items, refs, plain_bleu, plain_rate))
        print(rows[-1], file=sys.stderr, flush=True)
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        names = [
            x.split(":", 1)[1].strip() for x in info.read_text().splitlines() if x.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    head = f"{cpu}, {platform.python_version()}, torch {torch.__version__}, {args.threads} threads, {args.precision}"
    table = [f"<!-- {head}; beam {args.beam}; {len(lines)} sentences -->", "| " + " | ".join(rows[0]) + " |"]
    table.append("|---|" + "---:|" * (len(rows[0]) - 1))
    table += ["| " + " | ".join(r.values()) + " |" for r in rows]
    text = "\n".join(table) + "\n"
    print(text)
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
