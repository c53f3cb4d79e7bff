"""The data of ``bench_gpu.py``: the WMT news-test corpus prepared once, the training loader's own batches,
the padding of token-budget batches over an epoch, and the decoding batches of a test split.

    python bench/gpu_data.py [--out data/news] [--raw DIR]   # prepares the news corpus (docs/gpu.md, section 1)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from attnx.data.batch import Batch
from attnx.data.batching import TokenBatchSampler, collate_indices, plan_batches
from attnx.data.corpus import PreparedCorpus
from attnx.data.datamodule import TranslationDataModule
from attnx.data.prepare import Inputs, Settings, prepare

NEWS_TRAIN = [
    "newstest2008",
    "newssyscomb2009",
    "newstest2009",
    "newstest2010",
    "newstest2011",
    "newstest2012",
    "newstest2015",
    "newstest2016",
    "newstest2017",
    "newstest2018",
    "newstest2019.en-de",
    "newstest2019.de-en",
    "newstest2020.en-de",
    "newstest2020.de-en",
]
"""Every set of wmt_newstest_deen_other except newstestB2020 (the same sources as newstest2020 again)."""


def prepare_news(out: Path, news_raw: Path, wmt14_raw: Path, vocab_size: int = 37000) -> dict[str, Any]:
    """The news-test corpus: ~31k training pairs, valid = newstest2013, newstest2014 = the full test set."""
    inputs = Inputs.from_prefixes(
        {
            "train": [news_raw / name for name in NEWS_TRAIN],
            "valid": [wmt14_raw / "newstest2013"],
            "newstest2014": [wmt14_raw / "newstest2014"],
        },
        "en",
        "de",
    )
    return prepare(inputs, out, Settings("en", "de", vocab_size=vocab_size))


def training_batches(data: Path, max_tokens: int, count: int, pin: bool) -> list[Batch]:
    """The first ``count`` batches of the training loader, epoch after epoch (pinned when ``pin``)."""
    dm = TranslationDataModule(str(data), max_tokens=max_tokens, seed=1, pin_memory=pin)
    loader = dm.train_dataloader()
    batches: list[Batch] = []
    epoch = 0
    while len(batches) < count:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            batches.append(batch)
            if len(batches) == count:
                break
        epoch += 1
    return batches


def padding_rows(data: Path, budgets: list[int]) -> list[dict[str, Any]]:
    """Padding of every training batch of an epoch at each per-device budget (host only, no model)."""
    dataset = PreparedCorpus(str(data)).dataset("train")
    src = np.asarray(dataset.src_lengths, dtype=np.int64) + 1  # + EOS
    tgt = np.asarray(dataset.tgt_lengths, dtype=np.int64) + 1  # + BOS or EOS
    rows = []
    for budget in budgets:
        sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, budget, seed=1)
        real = padded = real_tgt = padded_tgt = unpadded_src = 0
        sizes = []
        for k in range(sampler.num_batches):
            pairs = sampler.order[sampler.bounds[k] : sampler.bounds[k + 1]]
            s, t = src[pairs], tgt[pairs]
            real += int(s.sum()) + int(t.sum())
            padded += len(pairs) * int(s.max() + t.max())
            real_tgt += int(t.sum())
            padded_tgt += len(pairs) * int(t.max())
            unpadded_src += bool(s.min() == s.max())
            sizes.append(len(pairs))
        rows.append(
            {
                "max_tokens": budget,
                "batches": sampler.num_batches,
                "pairs_per_batch": float(np.mean(sizes)),
                "padding": 1 - real / padded,
                "padding_target": 1 - real_tgt / padded_tgt,
                "budget_used": padded / 2 / sampler.num_batches / budget,
                "batches_without_source_padding": unpadded_src / sampler.num_batches,
            }
        )
    return rows


def decode_batches(data: Path, split: str, sentences: int, max_tokens: int) -> list[Batch]:
    """The first ``sentences`` of ``split``, batched by length within ``max_tokens``."""
    dataset = PreparedCorpus(str(data)).dataset(split)
    chosen = np.arange(min(sentences, len(dataset)))
    order, bounds = plan_batches(dataset.src_lengths[chosen], dataset.tgt_lengths[chosen], max_tokens)
    return [
        collate_indices(dataset, chosen[order[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    from harness import data_root

    from attnx.data.prepare import report

    parser = argparse.ArgumentParser(description="Prepare the WMT news-test corpus bench_gpu.py trains on.")
    parser.add_argument("--out", type=Path, default=Path("data/news"), help="the prepared corpus's folder")
    parser.add_argument("--raw", type=Path, default=None,
                        help="folder of wmt_newstest_deen_other and wmt14_ende_test (default: $ATTNX_DATA_DIR)")  # fmt: skip
    parser.add_argument("--vocab_size", type=int, default=37000, help="joint BPE pieces (the paper's 37,000)")
    args = parser.parse_args(argv)
    raw = data_root(args.raw)
    meta = prepare_news(args.out, raw / "wmt_newstest_deen_other", raw / "wmt14_ende_test", args.vocab_size)
    print(report(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
