"""A small real corpus (a slice of Multi30k, prepared by `attnx prepare`) and helpers to run `attnx fit` here."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest
import torch

from attnx.cli import main as attnx
from tests.conftest import REPO

TINY = REPO / "configs" / "tiny.yaml"
SPLITS = {"train": 400, "val": 50, "test_2016_flickr": 50}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from a second thread, and on a busy 2-core machine it makes them 2-3× slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 400 training and 50 validation/test pairs of Multi30k en-de, 300-piece joint BPE."""
    root = tmp_path_factory.mktemp("multi30k_slice")
    for split, n in SPLITS.items():
        for lang in ("en", "de"):
            with gzip.open(shared_data / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (root / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    out = root / "prepared"
    argv = [
        "--src_lang",
        "en",
        "--tgt_lang",
        "de",
        "--vocab_size",
        "300",
        "--workers",
        "1",
        "--output",
        str(out),
    ]
    argv += [
        "--train",
        str(root / "train"),
        "--valid",
        str(root / "val"),
        "--test",
        str(root / "test_2016_flickr"),
    ]
    assert attnx(["prepare", *argv]) == 0
    return out


def fit_args(corpus: Path, *extra: str, subcommand: str = "fit") -> list[str]:
    """``attnx <subcommand> --config configs/tiny.yaml`` on the slice, logging under the current directory."""
    return [subcommand, "--config", str(TINY), "--data.data_dir", str(corpus), *extra]


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def train_losses(run_dir: Path) -> dict[int, float]:
    """Training loss per optimizer step, from the CSV logger."""
    return {
        int(row["step"]): float(row["train/loss"]) for row in read_metrics(run_dir) if row.get("train/loss")
    }
