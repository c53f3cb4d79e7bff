"""What the benchmarks share: the machine line, the real corpora and the README's model, timing, Markdown tables.

Imported by the scripts beside it (``python bench/NAME.py`` puts ``bench/`` on the path). What attnx itself
provides (SentencePiece training, checkpoint writing, FLOP counts, device peaks) the scripts import from the
library, never restate. attnx and torch are imported inside the helpers that need them, so that the scripts
that only time subprocesses start without them.
"""

from __future__ import annotations

import gzip
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

import yaml

if TYPE_CHECKING:
    import argparse

    import lightning.pytorch as pl

    from attnx.data.batch import Batch
    from attnx.data.tokenizer import Tokenizer
    from attnx.model import TransformerConfig

REPO = Path(__file__).resolve().parents[1]
MULTI30K_CPU = REPO / "configs" / "multi30k_cpu.yaml"
"""The README's model (3+3 layers, d_model 256, 4 heads, d_ff 1024) and its training recipe."""

T = TypeVar("T")

# --- the machine ------------------------------------------------------------------------------------------
# Figures from different machines never compare: every benchmark prints the machine beside its numbers.


def cpu_model() -> str:
    """``Model name`` of ``lscpu``, else of ``/proc/cpuinfo``, else what ``platform`` knows (``platform.processor()``
    is an empty string or the architecture on Linux, not the model)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        if m := re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE):
            return m.group(1).strip()
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float:
    """The 1-minute load average now: on a shared machine, how much of it other work held."""
    return round(os.getloadavg()[0], 1)


def machine(with_torch: bool = True) -> dict[str, Any]:
    """The machine as a results file records it: CPU model and cores, the load now, Python, and (with
    ``with_torch``) torch's version and the threads it computes with."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "load_average": load_average(),
        "python": platform.python_version(),
    }
    if with_torch:
        import torch

        info |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    return info


def machine_line(info: dict[str, Any] | None = None) -> str:
    """``CPU: MODEL, N cores (1-min load L); torch V, T thread(s); Python P`` of ``machine()`` (now, by default)."""
    info = machine() if info is None else info
    parts = [f"CPU: {info['cpu']}, {info['cpu_cores']} cores (1-min load {info['load_average']})"]
    if "torch" in info:
        parts.append(f"torch {info['torch']}, {info['torch_threads']} thread(s)")
    parts.append(f"Python {info['python']}")
    return "; ".join(parts)


# --- the real corpora and the README's model ----------------------------------------------------------------


def data_root(given: str | Path | None = None) -> Path:
    """The folder of the raw corpora (``multi30k/``, ``wmt14_ende_test/``, ...): ``given``, else
    ``$ATTNX_DATA_DIR``, else ``../shared/data`` beside the checkout."""
    return Path(given or os.environ.get("ATTNX_DATA_DIR") or REPO.parent / "shared" / "data")


def add_data_option(parser: argparse.ArgumentParser) -> None:
    """``--data``: the folder of the raw corpora, ``data_root()`` by default."""
    parser.add_argument(
        "--data",
        type=Path,
        default=data_root(),
        help="folder holding multi30k/ (default $ATTNX_DATA_DIR or ../shared/data)",
    )


def read_lines(path: Path, n: int | None = None) -> list[str]:
    """The first ``n`` lines (all without ``n``) of a gzipped text file, as written: no normalization."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines if n is None else lines[:n]


def multi30k(data: Path, split: str, lang: str, n: int | None = None) -> list[str]:
    """The first ``n`` sentences of Multi30k ``split`` (``train``, ``val``, ``test_2016_flickr``) in ``lang``."""
    return read_lines(data / "multi30k" / f"{split}.{lang}.gz", n)


def multi30k_tokenizer(
    data: Path, vocab_size: int, per_side: int | None = None, cache: Path | None = None
) -> Tokenizer:
    """A joint BPE over the first ``per_side`` (default every) English and German sentences of Multi30k train,
    trained by ``attnx.data.tokenizer.train_sentencepiece`` (attnx's special ids). With ``cache`` (a path
    without suffix) it is written to ``CACHE.model`` and read from there on later runs."""
    from attnx.data.tokenizer import Tokenizer, train_sentencepiece

    if cache is not None and Path(f"{cache}.model").is_file():
        return Tokenizer.load(f"{cache}.model")
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
    text = multi30k(data, "train", "en", per_side) + multi30k(data, "train", "de", per_side)
    return train_sentencepiece(vocab_size, sentences=text, model_prefix=cache, character_coverage=1.0)


def model_config(vocab_size: int, config: Path = MULTI30K_CPU) -> TransformerConfig:
    """The ``model.transformer`` section of a training config (the README's model by default) over
    ``vocab_size`` pieces."""
    from attnx.model import TransformerConfig

    section = yaml.safe_load(config.read_text())["model"]["transformer"]
    return TransformerConfig.from_dict(section | {"vocab_size": vocab_size})


# --- timing -----------------------------------------------------------------------------------------------


@dataclass
class Timing(Generic[T]):
    """Seconds of each run of one measurement, and what the last run returned."""

    result: T
    times: list[float]

    @property
    def best(self) -> float:
        """The fastest run: on a shared machine other processes steal cores, so the closest to its real speed."""
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def timed(run: Callable[[], T], repeats: int) -> Timing[T]:
    """``run()`` ``repeats`` times (at least once), each timed with ``time.perf_counter``."""
    times: list[float] = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return Timing(result, times)


def batch_flops(config: TransformerConfig, batch: Batch) -> float:
    """Training FLOPs of a batch's real tokens at its mean lengths: the count ``train/mfu`` divides
    (``attnx.model.builders.training_flops_per_token``)."""
    from attnx.model.builders import training_flops_per_token

    n = batch.size
    per_token = training_flops_per_token(config, batch.n_src_tokens / n, batch.n_tgt_tokens / n)["per_token"]
    return per_token * (batch.n_src_tokens + batch.n_tgt_tokens)


def training_trainer(clock: pl.Callback, **options: Any) -> pl.Trainer:
    """A Lightning ``Trainer`` on one device that only trains (no logger, checkpoints, progress bar, model
    summary or validation), with ``clock`` the callback that times it; ``options`` go to the ``Trainer``."""
    import lightning.pytorch as pl

    return pl.Trainer(
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[clock],
        **options,
    )


def run_timed(main: Callable[[], int]) -> NoReturn:
    """Run a benchmark's ``main``, print its wall time after its output and exit with its code."""
    start = time.perf_counter()
    code = main()
    print(f"\n({time.perf_counter() - start:.0f} s)")
    sys.exit(code)


# --- tables -----------------------------------------------------------------------------------------------


def markdown_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table, left-aligned, for docs/benchmarks.md."""
    return "\n".join([markdown_row(columns), "|" + "---|" * len(columns), *map(markdown_row, rows)])


def publish(title: str, columns: list[str], rows: list[list[str]], output: Path | None) -> None:
    """A Markdown table for docs/benchmarks.md, its title ending with the machine: printed, and written to
    ``output`` when given."""
    text = f"{title} ({cpu_model()}, {os.cpu_count()} CPUs):\n\n{markdown_table(columns, rows)}\n"
    print(text)
    if output:
        output.write_text(text, encoding="utf-8")
