"""What checking a checkpoint's CRC-32s costs next to loading it.

Every command reads checkpoints through ``attnx.checkpoint.read_checkpoint``, which compares each member of the
zip archive with the CRC-32 that ``torch.save`` recorded for it before ``torch.load`` runs. This writes a
checkpoint of the paper's base model (37,000-piece vocabulary, with Adam's two moments, as ``attnx fit``
saves it) and times, alternating, ``torch.load`` alone, the CRC check alone, and ``read_checkpoint`` (both)::

    python bench/bench_checkpoint_crc.py --repeats 5

The page cache is warm after the first read (the figures are CPU time, not disk time). Run it on a quiet
machine: another process halves what two threads can do.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnx.checkpoint import format as checkpoint_format
from attnx.model import TransformerConfig, build_transformer


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def write_checkpoint(path: Path, vocab_size: int) -> int:
    """A base-sized training checkpoint: the weights and Adam's two moments (16 bytes a parameter)."""
    config = TransformerConfig(vocab_size=vocab_size)
    model = build_transformer(config)
    weights = model.state_dict()  # the shared embedding under each of its names, stored once
    parameters = dict(model.named_parameters())  # each once, as Adam keeps them
    moments = {
        f"{name}.{m}": torch.zeros_like(t) for name, t in parameters.items() for m in ("exp_avg", "sq")
    }
    meta = {"format_version": checkpoint_format.FORMAT_VERSION, "transformer": config.to_dict()}
    torch.save({"state_dict": weights, "optimizer_moments": moments, "attnx": meta}, path)
    return sum(t.numel() for t in parameters.values())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of each (default 5)")
    parser.add_argument("--vocab_size", type=int, default=37000, help="shared vocabulary (default 37000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "base.ckpt"
        parameters = write_checkpoint(path, args.vocab_size)

        def crc() -> None:
            checkpoint_format._whole.clear()  # a new command: nothing checked yet
            assert checkpoint_format.damaged_member(path) is None

        def load() -> None:
            torch.load(path, map_location="cpu", weights_only=True)

        def both() -> None:
            checkpoint_format._whole.clear()
            checkpoint_format.read_checkpoint(path)

        runs: dict[str, list[float]] = {"torch.load": [], "CRC check": [], "read_checkpoint": []}
        load()  # warm the page cache
        for round_ in range(args.repeats):
            order = list(zip(runs, (load, crc, both), strict=True))
            for name, fn in order if round_ % 2 == 0 else reversed(order):
                runs[name].append(timed(fn))
        size = path.stat().st_size
    print(
        f"# bench_checkpoint_crc: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(f"checkpoint: {parameters / 1e6:.1f}M parameters + Adam moments, {size / 2**20:,.0f} MiB\n")
    print("| read | median s | min s | GB/s (median) |\n|---|---:|---:|---:|")
    for name, times in runs.items():
        median = statistics.median(times)
        print(f"| {name} | {median:.3f} | {min(times):.3f} | {size / median / 1e9:.2f} |")
    ratio = statistics.median(runs["CRC check"]) / statistics.median(runs["torch.load"])
    print(f"\nCRC check / torch.load: {ratio:.2f}")


if __name__ == "__main__":
    main()
