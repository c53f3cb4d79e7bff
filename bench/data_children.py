"""The measurements of ``bench_data.py`` that each run in a child process of their own (``bench_data.in_child``),
so that a peak RSS (``ru_maxrss``) is that measurement's alone: batch fill over an epoch, a DataModule's memory,
the corpus checksums' cost.

    python bench/data_children.py NAME ARGS...   # prints the measurement's JSON on its last line
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


def rss_mb(kind: str = "VmRSS") -> float:
    """Current resident set size of this process: all of it (VmRSS), private memory (RssAnon), or mapped files
    (RssFile: page cache of memory-mapped corpora, shared between processes and reclaimable)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- measurements in child processes --------------------------------------------------------------------


def child_fill(data_dir: str, max_tokens: int) -> dict[str, float]:
    """Share of the padded tensors (and of the budget) that is real tokens, over one epoch of training batches."""
    from attnx.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(data_dir, max_tokens=max_tokens)
    real = padded = budget_used = 0.0
    real_s = real_t = pad_s = pad_t = 0
    n = 0
    for batch in dm.train_dataloader():
        real_s, real_t = real_s + batch.n_src_tokens, real_t + batch.n_tgt_tokens
        pad_s, pad_t = pad_s + batch.src.numel(), pad_t + batch.tgt_out.numel()
        budget_used += max(batch.src.numel(), batch.tgt_out.numel()) / max_tokens
        n += 1
    real, padded = real_s + real_t, pad_s + pad_t
    return {
        "batches": n,
        "src_fill": real_s / pad_s,
        "tgt_fill": real_t / pad_t,
        "fill": real / padded,
        "budget_used": budget_used / n,
        "real_of_budget": real / (2 * n * max_tokens),
    }


def child_datamodule(data_dir: str, max_tokens: int, batches: int) -> dict[str, float]:
    """RSS before and after building a DataModule, its batch plan, and iterating ``batches`` batches."""
    import lightning  # noqa: F401  (imports count in the baseline, not in the DataModule)

    from attnx.data.datamodule import TranslationDataModule

    base, base_anon, base_peak = rss_mb(), rss_mb("RssAnon"), peak_mb()
    start = time.perf_counter()
    dm = TranslationDataModule(data_dir, max_tokens=max_tokens)
    loader = dm.train_dataloader()
    setup = time.perf_counter() - start
    start = time.perf_counter()
    it = iter(loader)
    for _ in range(batches):
        next(it)
    per_batch = (time.perf_counter() - start) / batches
    return {
        "pairs": len(dm.corpus.dataset("train")),
        "batches_per_epoch": len(loader),
        "setup_seconds": setup,
        "ms_per_batch": per_batch * 1000,
        "baseline_rss_mb": base,
        "baseline_anon_mb": base_anon,
        "baseline_peak_mb": base_peak,
        "rss_mb": rss_mb(),
        "anon_mb": rss_mb("RssAnon"),
        "file_mb": rss_mb("RssFile"),
        "peak_mb": peak_mb(),
    }


def child_checksums(data_dir: str) -> dict[str, float]:
    """What the corpus checksums cost on a corpus in the page cache: prepare hashing every file it wrote, and
    `attnx fit` opening the corpus (sizes, then the SHA-256 of the training split's files, in threads)."""
    from attnx.data.corpus import PreparedCorpus, checksums

    directory = Path(data_dir)
    files = json.loads((directory / "meta.json").read_text())["files"]
    megabytes = sum((directory / name).stat().st_size for name in files) / 2**20
    checksums(directory, files)  # read once: the page cache holds the corpus, as after prepare wrote it
    start = time.perf_counter()
    checksums(directory, files)
    record = time.perf_counter() - start
    start = time.perf_counter()
    corpus = PreparedCorpus(directory)
    opened = time.perf_counter() - start
    corpus.verify_split("train")
    corpus.tokenizer  # noqa: B018  (its SHA-256 is checked as it loads)
    verified = time.perf_counter() - start
    return {
        "megabytes": megabytes,
        "prepare_record_seconds": record,
        "open_sizes_seconds": opened,
        "open_and_verify_seconds": verified,
        "verify_mb_per_second": megabytes / verified,
        "threads": min(len(files), os.cpu_count() or 1),
    }


CHILDREN = {
    "fill": (child_fill, (str, int)),
    "datamodule": (child_datamodule, (str, int, int)),
    "checksums": (child_checksums, (str,)),
}


if __name__ == "__main__":
    fn, types = CHILDREN[sys.argv[1]]
    print(json.dumps(fn(*(t(a) for t, a in zip(types, sys.argv[2:], strict=True)))))
