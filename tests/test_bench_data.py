"""bench/bench_data.py's measurements that run in a child process of their own (bench/data_children.py), on
the tests' prepared corpus: what comes back is the measurement's JSON, counted from the corpus itself."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))  # as `python bench/bench_data.py` has it: its `harness` module

import bench_data  # noqa: E402


def test_the_fill_of_an_epoch_is_measured_in_a_child_process(corpus: Path) -> None:
    from attnx.data.datamodule import TranslationDataModule

    fill = bench_data.in_child("fill", corpus, 512)
    assert fill["batches"] == len(TranslationDataModule(str(corpus), max_tokens=512).train_dataloader())
    assert 0 < fill["fill"] <= 1 and 0 < fill["src_fill"] <= 1 and 0 < fill["tgt_fill"] <= 1
    assert 0 < fill["real_of_budget"] <= fill["budget_used"] <= 1


def test_the_checksums_cost_is_measured_in_a_child_process(corpus: Path) -> None:
    measured = bench_data.in_child("checksums", corpus)
    assert measured["megabytes"] > 0 and measured["open_and_verify_seconds"] >= measured["open_sizes_seconds"]
