"""MBR utilities: attnx's pairwise chrF and sentence BLEU (per-candidate n-gram counts, all pairs in one array
operation) against sacreBLEU's pair-by-pair loop, and `mbrs` where it is installed, on the same candidates.

    python bench/bench_mbr.py [--data DIR] [--ckpt_path CKPT] [--sentences 100] [--n 8 16 32] [--repeats 3]

Candidates: with ``--ckpt_path``, ``N`` samples of the checkpoint per source sentence of Multi30k
test_2016_flickr (``attnx.load(...).with_search(sampling=True, nbest=N, seed=1)``); without it, ``N``
variants of each German reference made by dropping and swapping words (seeded), which have the overlap
structure of real samples without needing a model. Both sides get the same candidate lists; the benchmark
checks that they give the same expected utilities (to 1e-9) and choose the same candidate, then prints the
time per sentence (best of ``--repeats``, median beside it) as Markdown for docs/benchmarks.md.

What ``mbrs`` (PyPI) computes is measured without installing it (its requirements include COMET, BLEURT and
BERTScore, which attnx does not need): its ``MetricBLEU``, and its ``MetricChrF`` by default, score each pair
with sacreBLEU (in a process pool: the pair-by-pair row here is one process); ``MetricChrF(fastchrf=True)``
calls the Rust ``fastchrf.pairwise_chrf``, measured when ``fastchrf`` imports
(``pip install --target /tmp/fastchrf fastchrf`` and ``PYTHONPATH=/tmp/fastchrf``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence

import numpy as np
from harness import data_root, machine, machine_line, multi30k, timed

from attnx.inference.mbr import UTILITIES


def variants(sentence: str, n: int, rng: random.Random) -> list[str]:
    """`n` noisy copies of `sentence`: each word dropped with p 0.1, neighbours swapped with p 0.1; some repeat."""
    out = []
    for _ in range(n):
        words = [w for w in sentence.split() if rng.random() > 0.1]
        for i in range(len(words) - 1):
            if rng.random() < 0.1:
                words[i], words[i + 1] = words[i + 1], words[i]
        out.append(" ".join(words))
    return out


def candidates(args: argparse.Namespace, n: int) -> list[list[str]]:
    data = data_root(args.data)
    if args.ckpt_path:
        import attnx

        translator = attnx.load(args.ckpt_path)
        sampler = translator.with_search(sampling=True, nbest=n, seed=1)
        sources = multi30k(data, "test_2016_flickr", "en", args.sentences)
        return [[h.text for h in hyps] for hyps in sampler.generate(sources)]
    rng = random.Random(1)
    return [variants(s, n, rng) for s in multi30k(data, "test_2016_flickr", "de", args.sentences)]


def expected_attnx(utility: str) -> Callable[[list[str]], np.ndarray]:
    def run(texts: list[str]) -> np.ndarray:
        return UTILITIES[utility](texts).mean(axis=1)  # every candidate, duplicates included

    return run


def expected_sacrebleu(utility: str) -> Callable[[list[str]], np.ndarray]:
    from sacrebleu.metrics import BLEU, CHRF

    metric = CHRF() if utility == "chrf" else BLEU(effective_order=True)

    def run(texts: list[str]) -> np.ndarray:
        return np.array([[metric.sentence_score(h, [r]).score for r in texts] for h in texts]).mean(axis=1)

    return run


def expected_fastchrf() -> Callable[[list[str]], np.ndarray] | None:
    """`mbrs`'s fast chrF path: `MetricChrF(fastchrf=True)` calls `fastchrf.pairwise_chrf` exactly so."""
    try:
        import fastchrf
    except ImportError:
        return None

    def run(texts: list[str]) -> np.ndarray:
        pairwise = fastchrf.pairwise_chrf(
            [texts], [texts], char_order=6, beta=2.0, remove_whitespace=True, eps_smoothing=False
        )
        return np.array(pairwise[0]).mean(axis=1)

    return run


def per_sentence(fn: Callable[[list[str]], np.ndarray], lists: Sequence[list[str]], repeats: int):
    """Best and median seconds per candidate list of ``repeats`` runs over all of them, and their results."""
    timing = timed(lambda: [fn(texts) for texts in lists], repeats)
    return timing.best / len(lists), timing.median / len(lists), timing.result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="corpora directory (default $ATTNX_DATA_DIR or ../shared/data)")
    parser.add_argument("--ckpt_path", help="draw the candidates as samples of this checkpoint")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--n", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(machine_line(machine(with_torch=False)))
    print(
        f"candidates: {'samples of ' + args.ckpt_path if args.ckpt_path else 'word-dropout variants'}, "
        f"{args.sentences} sentences of test_2016_flickr\n"
    )
    print(
        "| utility | N | implementation | ms / sentence (best) | median | same choices as attnx | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.n:
        lists = candidates(args, n)
        for utility in ("chrf", "bleu"):
            ours_best, ours_median, ours = per_sentence(expected_attnx(utility), lists, args.repeats)
            rows = [("attnx", ours_best, ours_median, ours)]
            others = [("sacreBLEU pair by pair (mbrs without fastchrf)", expected_sacrebleu(utility))]
            if utility == "chrf":
                others.append(("fastchrf (mbrs with fastchrf=True)", expected_fastchrf()))
            for name, fn in others:
                if fn is None:
                    rows.append((name, None, None, None))
                    continue
                best, median, out = per_sentence(fn, lists, args.repeats)
                rows.append((name, best, median, out))
            for name, best, median, out in rows:
                if out is None:
                    print(f"| {utility} | {n} | {name} | not installed | | | |")
                    continue
                same = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(out, ours, strict=True))
                diff = max(float(np.abs(a - b).max()) for a, b in zip(out, ours, strict=True))
                print(
                    f"| {utility} | {n} | {name} | {best * 1e3:.2f} | {median * 1e3:.2f} | "
                    f"{same}/{len(lists)} | {diff:.2g} |"
                )


if __name__ == "__main__":
    main()
