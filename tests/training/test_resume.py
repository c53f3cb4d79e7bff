"""Exact resume: a run stopped mid-epoch and resumed from its last checkpoint repeats the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.data.datamodule import TranslationDataModule
from tests.training.conftest import fit_args, train_losses

MAX_TOKENS = "1536"  # 10 batches an epoch: the run below crosses an epoch boundary after resuming


def fit(corpus: Path, work: Path, name: str, *extra: str) -> Path:
    args = [
        "--data.max_tokens",
        MAX_TOKENS,
        "--model.transformer.dropout",
        "0.3",
        "--evaluation.bleu_samples",
        "0",
    ]
    args += ["--trainer.val_check_interval", "3"]
    (work / name).mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work / name)
        assert attnx(fit_args(corpus, *args, *extra)) == 0
    return work / name / "runs" / "tiny" / "version_0"


def test_resumed_run_has_the_same_batches_and_losses(corpus: Path, tmp_path: Path) -> None:
    assert len(TranslationDataModule(str(corpus), max_tokens=int(MAX_TOKENS)).train_sampler) == 10
    whole = fit(corpus, tmp_path, "whole", "--trainer.max_steps", "14")
    first = fit(corpus, tmp_path, "first", "--trainer.max_steps", "6")  # killed after step 6, mid-epoch
    ckpt = first / "checkpoints" / "last.ckpt"
    rest = fit(corpus, tmp_path, "rest", "--trainer.max_steps", "14", "--ckpt_path", str(ckpt))

    expected, before, after = train_losses(whole), train_losses(first), train_losses(rest)
    assert sorted(expected) == list(range(14)) and sorted(after) == list(range(6, 14))
    assert len(set(expected.values())) == 14  # dropout is on: equal losses are not a coincidence
    for step, loss in {**before, **after}.items():
        assert loss == pytest.approx(expected[step], rel=1e-6, abs=1e-6), f"step {step}"
