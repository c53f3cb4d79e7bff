"""What subword sampling (`data.subword_sampling`) costs the training loader, side by side with the prepared
segmentation in one run: batches and tokens a second, batches an epoch, and the share of pairs whose pieces
changed.

    python bench/bench_sampling.py --corpus data/multi30k [--max_tokens 4096] [--alphas 0.1 0.3] [--batches 200]
        [--shape_buckets 8] [--json out.json]

The loader runs in this process (`data.num_workers 0`, the slowest case: with workers the sampling runs beside the
training step). Results go to stdout as a Markdown table, with the machine line; the rates are comparable only
within one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness import machine_line

from attnx.data.batching import collate_indices
from attnx.data.datamodule import TranslationDataModule
from attnx.data.sampling import SubwordSampling


def measure(corpus: str, max_tokens: int, buckets: int, alpha: float, batches: int) -> dict[str, float]:
    """Loader rates over the first `batches` training batches of epoch 0, for one `alpha` (0: prepared)."""
    dm = TranslationDataModule(
        corpus, max_tokens=max_tokens, shape_buckets=buckets, subword_sampling=SubwordSampling(alpha=alpha)
    )
    sampler = dm.train_sampler  # the plan (and, with sampling, its headroom) before the clock starts
    dataset = dm.corpus.dataset(dm.train_split)
    tokens = changed = pairs = n = 0
    seconds = 0.0
    loader = iter(dm.train_dataloader())
    while n < batches:
        start = time.perf_counter()
        try:
            batch = next(loader)
        except StopIteration:
            break
        seconds += time.perf_counter() - start
        n += 1
        tokens += batch.n_src_tokens + batch.n_tgt_tokens
        prepared = collate_indices(dataset, batch.index.numpy())
        for row in range(len(batch.index)):
            pairs += 1
            changed += not batch.src[row][batch.src_mask[row]].equal(
                prepared.src[row][prepared.src_mask[row]]
            )
    return {
        "alpha": alpha,
        "batches_per_epoch": sampler.num_batches,
        "batches_per_s": n / seconds if seconds else float("nan"),
        "tokens_per_s": tokens / seconds if seconds else float("nan"),
        "resegmented": changed / max(pairs, 1),
        "batches_timed": n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a folder written by attnx prepare")
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--shape_buckets", type=int, default=8)
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.3])
    parser.add_argument("--batches", type=int, default=200, help="batches timed per setting")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = [
        measure(args.corpus, args.max_tokens, args.shape_buckets, alpha, args.batches)
        for alpha in [0.0, *args.alphas]
    ]
    print(machine_line())
    print("| alpha | batches an epoch | batches/s | tokens/s (src+tgt) | vs prepared | pairs resegmented |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        ratio = row["tokens_per_s"] / rows[0]["tokens_per_s"]
        print(
            f"| {row['alpha']:g} | {row['batches_per_epoch']:,} | {row['batches_per_s']:,.1f} | "
            f"{row['tokens_per_s']:,.0f} | {ratio:.2f}x | {row['resegmented']:.0%} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
