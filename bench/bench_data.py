"""Data pipeline benchmarks: prepare throughput and memory, batch fill, DataModule memory on a WMT-sized corpus.

    python bench/bench_data.py [--data DIR] [--tmp DIR] [--pairs 1000000] [--big_pairs 4500000] [--only NAME ...]
    python bench/bench_data.py --only wmt [--wmt_pairs 4500000] [--workers 2]   # cleaning at WMT14 scale
    python bench/bench_data.py --only checksums [--big_pairs 4500000]            # the corpus checksums' cost

``wmt`` builds a WMT14-sized training corpus of real sentences: every pair of the corpora in ``--data``
(Multi30k, the OpenNMT WMT sample, newstest 2008-2020, about 85k pairs) repeated with the copy number appended
to the source side, so deduplication keeps each copy and language identification sees real text. It is split
into three corpora like Europarl, Common Crawl and News Commentary, prepared with every cleaning filter on, and
each cleaning step is also timed alone on 100k pairs (``stages``): where the time goes.

``checksums`` times what the per-file SHA-256 of a prepared corpus costs on the synthetic WMT14-sized binarized
corpus (and on Multi30k): prepare recording them, and opening the corpus for training verifying them.

Each measurement runs in its own child process so that peak RSS (``ru_maxrss``) is that measurement's alone.
Results go to stdout as a Markdown table; docs/benchmarks.md records them with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from harness import add_data_option, machine, machine_line


def real_pairs(data: Path) -> tuple[list[str], list[str]]:
    """Every aligned pair of ``data/*/*.en.gz`` + ``.de.gz`` (the filtered newstest2014 is a subset: skipped)."""
    import gzip

    src, tgt = [], []
    for en in sorted(data.glob("*/*.en.gz")):
        de = en.with_name(en.name.removesuffix(".en.gz") + ".de.gz")
        if "filtered" in en.name or not de.is_file():
            continue
        with gzip.open(en, "rt", encoding="utf-8") as f, gzip.open(de, "rt", encoding="utf-8") as g:
            a, b = f.read().splitlines(), g.read().splitlines()
        if len(a) == len(b):
            src += a
            tgt += b
    return src, tgt


def wmt_sized_text(data: Path, raw: Path, pairs: int) -> list[Path]:
    """Three gzipped corpora of ``pairs`` real pairs in all: copy ``k`` of a pair has `` (k)`` after its source."""
    import gzip

    src, tgt = real_pairs(data)
    raw.mkdir(parents=True, exist_ok=True)
    names = ["europarl", "commoncrawl", "news_commentary"]
    sizes = [pairs // 3, pairs // 3, pairs - 2 * (pairs // 3)]
    prefixes, n = [], 0
    for name, size in zip(names, sizes, strict=True):
        prefix = raw / name
        with (
            gzip.open(f"{prefix}.en.gz", "wt", compresslevel=1) as en,
            gzip.open(f"{prefix}.de.gz", "wt", compresslevel=1) as de,
        ):
            for start in range(n, n + size, 100_000):
                block = range(start, min(start + 100_000, n + size))
                en.write("".join(f"{src[i % len(src)]} ({i // len(src)})\n" for i in block))
                de.write("".join(f"{tgt[i % len(tgt)]}\n" for i in block))
        n += size
        prefixes.append(prefix)
    return prefixes


def stages(data: Path, n: int = 100_000) -> dict[str, float]:
    """Seconds per 100k pairs of each cleaning and encoding step alone, in one process on one core."""
    from attnx.data.cleaning import SeenPairs, copies, identifier, pair_keys
    from attnx.data.text import normalize
    from attnx.data.tokenizer import train_sentencepiece

    src, tgt = real_pairs(data)
    src = [f"{src[i % len(src)]} ({i // len(src)})" for i in range(n)]
    tgt = [tgt[i % len(tgt)] for i in range(n)]
    timings: dict[str, float] = {}

    def timed(name: str, fn: object) -> object:
        start = time.perf_counter()
        result = fn()  # type: ignore[operator]
        timings[name] = round(time.perf_counter() - start, 3)
        return result

    timed("normalize", lambda: ([normalize(x) for x in src], [normalize(x) for x in tgt]))
    timed("copies", lambda: copies(src, tgt))
    timed("duplicates", lambda: SeenPairs().first_seen(pair_keys(src, tgt)))
    identifier()
    timed("language id (both sides)", lambda: (identifier().classify(src), identifier().classify(tgt)))
    import py3langid

    k = 5000
    timed(f"py3langid line by line, {k} pairs", lambda: [py3langid.classify(x) for x in src[:k] + tgt[:k]])
    tokenizer = train_sentencepiece(8000, sentences=src[:20_000] + tgt[:20_000])
    timed(
        "sentencepiece encode (both sides, 1 thread)",
        lambda: (tokenizer.encode_batch(src, num_threads=1), tokenizer.encode_batch(tgt, num_threads=1)),
    )
    return timings


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and its descendants (shared pages counted once, split between
    the processes sharing them): the memory a process tree really holds, forked workers included."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the process ended meanwhile
            continue
    return total


def run_prepare(argv: list[str]) -> dict[str, float]:
    """``attnx prepare ARGV`` in a child process: wall time, the peak RSS of its largest process (``ru_maxrss``
    covers the child and the workers it waited for) and the peak PSS of the whole process tree (sampled)."""
    import threading

    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "attnx", "prepare", *argv], stdout=subprocess.PIPE, text=True
    )
    peak_tree = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            peak_tree[0] = max(peak_tree[0], tree_pss_mb(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    output = child.stdout.read() if child.stdout else ""
    if status != 0:
        raise SystemExit(f"attnx prepare failed:\n{output}")
    out = Path(argv[argv.index("--output") + 1])
    meta = json.loads((out / "meta.json").read_text())
    pairs = meta["splits"]["train"]["read"] + sum(
        s["read"] for n, s in meta["splits"].items() if n != "train"
    )
    return {
        "seconds": seconds,
        "pairs": pairs,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "peak_tree_pss_mb": peak_tree[0],
        "steps": meta["seconds"],
    }


# --- synthetic corpora ----------------------------------------------------------------------------------


def synthetic_text(prefix: Path, pairs: int, seed: int = 0) -> None:
    """``prefix.en``/``prefix.de``: Zipf-distributed words of a 30k-word vocabulary, ~22 words a sentence."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöü"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(30_000)])
    mapping = rng.permutation(len(vocab))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{prefix}.en", "w") as en, open(f"{prefix}.de", "w") as de:
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            lengths = np.clip(rng.lognormal(3.0, 0.5, n).astype(int), 1, 200)
            words = np.minimum(rng.zipf(1.3, int(lengths.sum())) - 1, len(vocab) - 1)
            cuts = np.cumsum(lengths)[:-1]
            src = [" ".join(s) for s in np.split(vocab[words], cuts)]
            tgt = [" ".join(s) for s in np.split(vocab[mapping[words]], cuts)]
            en.write("\n".join(src) + "\n")
            de.write("\n".join(tgt) + "\n")


def synthetic_binarized(out: Path, pairs: int, spm_model: Path, seed: int = 0) -> None:
    """A prepared-corpus directory of ``pairs`` random training pairs (WMT14-like lengths), written directly."""
    from attnx.data.corpus import BINARY, FORMAT_VERSION, checksums

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(spm_model, out / "spm.model")
    totals = {}
    for lang in ("en", "de"):
        lengths = np.clip(rng.lognormal(3.2, 0.6, pairs).astype(np.int32), 1, 250)
        offsets = np.zeros(pairs + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        with open(out / f"train.{lang}.bin", "wb") as f:
            for start in range(0, int(offsets[-1]), 50_000_000):
                n = min(50_000_000, int(offsets[-1]) - start)
                f.write(rng.integers(4, 8000, n, dtype=np.uint16).tobytes())
        np.save(out / f"train.{lang}.len.npy", lengths)
        np.save(out / f"train.{lang}.idx.npy", offsets)
        totals[lang] = int(offsets[-1])
    split = {
        "pairs": pairs,
        "src_tokens": totals["en"],
        "tgt_tokens": totals["de"],
        "read": pairs,
        "dropped": {},
    }
    meta = {"format_version": FORMAT_VERSION, "src_lang": "en", "tgt_lang": "de", "vocab_size": 8000}
    meta |= {"dtype": "uint16", "splits": {"train": split | {"inputs": {}}}}
    meta["files"] = ["spm.model"] + [f"train.{lang}{end}" for lang in ("en", "de") for end in BINARY]
    meta["checksums"] = checksums(out, meta["files"])
    (out / "meta.json").write_text(json.dumps(meta))


def rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def in_child(name: str, *args: object) -> dict[str, float]:
    """A measurement of ``data_children.py`` in a process of its own, so that its peak RSS is its alone."""
    argv = [sys.executable, str(Path(__file__).with_name("data_children.py")), name, *map(str, args)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_option(p)
    p.add_argument("--tmp", default="/tmp/attnx-bench-data", help="scratch folder (deleted at the end)")
    p.add_argument("--pairs", type=int, default=1_000_000, help="pairs of the synthetic text corpus")
    p.add_argument("--big_pairs", type=int, default=4_500_000, help="pairs of the synthetic binarized corpus")
    p.add_argument(
        "--sample_size", type=int, default=2_000_000, help="SentencePiece sample on the synthetic corpus"
    )
    p.add_argument("--wmt_pairs", type=int, default=4_500_000, help="pairs of the WMT-sized real-text corpus")
    p.add_argument("--wmt_sample_size", type=int, default=1_000_000, help="SentencePiece sample on it")
    p.add_argument("--workers", type=int, default=None, help="attnx prepare --workers (default: every core)")
    p.add_argument("--only", nargs="*", default=["multi30k", "synthetic", "fill", "datamodule"])
    args = p.parse_args()
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    m30k = Path(args.data) / "multi30k"
    print(f"# {machine_line(machine(with_torch=False))}")
    results: dict[str, object] = {}
    langs = ["--src_lang", "en", "--tgt_lang", "de", "--vocab_size", "8000"]
    prepared = tmp / "multi30k"
    if "stages" in args.only:
        results["stages, seconds per 100k pairs"] = stages(Path(args.data))
    if "wmt" in args.only:
        start = time.perf_counter()
        prefixes = wmt_sized_text(Path(args.data), tmp / "wmt_raw", args.wmt_pairs)
        print(f"wrote {args.wmt_pairs:,} real pairs in 3 corpora in {time.perf_counter() - start:.0f} s")
        train = "[" + ", ".join(map(str, prefixes)) + "]"
        argv = [*langs, "--train", train, "--sample_size", str(args.wmt_sample_size)]
        argv += ["--workers", str(args.workers)] if args.workers else []
        report = tmp / "wmt_report.md"
        result = run_prepare([*argv, "--output", str(tmp / "wmt"), "--report", str(report)])
        train_meta = json.loads((tmp / "wmt" / "meta.json").read_text())["splits"]["train"]
        result["pairs_per_second"] = result["pairs"] / result["seconds"]
        result["kept"] = train_meta["pairs"]
        result["dropped"] = train_meta["dropped"]
        results[f"prepare wmt-sized {args.wmt_pairs:,} real pairs, cleaning on"] = result
        shutil.rmtree(tmp / "wmt_raw"), shutil.rmtree(tmp / "wmt")
    if {"multi30k", "fill", "datamodule", "checksums"} & set(args.only):
        splits = ["--train", m30k / "train", "--valid", m30k / "val", "--test", m30k / "test_2016_flickr"]
        shutil.rmtree(prepared, ignore_errors=True)
        results["prepare multi30k"] = run_prepare([*langs, *map(str, splits), "--output", str(prepared)])
    if "synthetic" in args.only:
        start = time.perf_counter()
        synthetic_text(tmp / "raw" / "train", args.pairs)
        print(f"generated {args.pairs:,} synthetic pairs in {time.perf_counter() - start:.0f} s")
        argv = [*langs, "--train", str(tmp / "raw" / "train"), "--sample_size", str(args.sample_size)]
        results[f"prepare synthetic {args.pairs:,}"] = run_prepare(
            [*argv, "--output", str(tmp / "synthetic")]
        )
        shutil.rmtree(tmp / "raw"), shutil.rmtree(tmp / "synthetic")
    if "fill" in args.only:
        for max_tokens in (4096, 25_000 // 8, 1024):
            results[f"fill multi30k max_tokens {max_tokens}"] = in_child("fill", prepared, max_tokens)
    if {"datamodule", "checksums"} & set(args.only):
        big = tmp / "big"
        start = time.perf_counter()
        synthetic_binarized(big, args.big_pairs, prepared / "spm.model")
        print(f"wrote a {args.big_pairs:,}-pair binarized corpus in {time.perf_counter() - start:.0f} s")
    if "datamodule" in args.only:
        results[f"datamodule {args.big_pairs:,} pairs"] = in_child("datamodule", big, 4096, 200)
        results["datamodule multi30k"] = in_child("datamodule", prepared, 4096, 100)
    if "checksums" in args.only:
        results[f"checksums {args.big_pairs:,} pairs"] = in_child("checksums", big)
        results["checksums multi30k"] = in_child("checksums", prepared)
    for name, r in results.items():
        print(f"{name}: {json.dumps(rounded(r))}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
