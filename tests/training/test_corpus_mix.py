"""The realized corpus mix through `attnx fit`: logged per step, said at the start, and a weighted run stopped
mid-epoch and resumed with `--ckpt_path` trains on exactly the batches of the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.data.datamodule import TranslationDataModule
from tests.data.test_mixing import prepare_two_corpora
from tests.training.conftest import read_metrics, train_losses
from tests.training.test_resume import MAX_TOKENS, fit

WEIGHTS = ("--data.corpus_weights", "{big: 1, small: 1}")  # 300 and 100 pairs: half and half


@pytest.fixture(scope="module")
def two_corpora(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two_small_corpora")
    return prepare_two_corpora(shared_data, root, {"big": 300, "small": 100}, vocab=300)


def mix_of(run_dir: Path) -> dict[int, tuple[float, float]]:
    """(big, small) share of the pairs trained on so far, per optimizer step, from the CSV logger."""
    return {
        int(row["step"]): (float(row["train/mix/big"]), float(row["train/mix/small"]))
        for row in read_metrics(run_dir)
        if row.get("train/mix/big")
    }


def test_a_weighted_run_resumed_mid_epoch_repeats_the_uninterrupted_one(
    two_corpora: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    datamodule = TranslationDataModule(
        str(two_corpora), max_tokens=int(MAX_TOKENS), shape_buckets=0, corpus_weights={"big": 1, "small": 1}
    )
    assert len(datamodule.train_sampler) < 14  # the run crosses an epoch boundary after resuming
    whole = fit(two_corpora, tmp_path, "whole", "--trainer.max_steps", "14", *WEIGHTS)
    said = capsys.readouterr().out
    assert "corpus mix (data.corpus_weights {big: 1, small: 1}): asked big 50.0%, small 50.0% of the" in said
    first = fit(two_corpora, tmp_path, "first", "--trainer.max_steps", "6", *WEIGHTS)
    ckpt = first / "checkpoints" / "last.ckpt"
    rest = fit(two_corpora, tmp_path, "rest", "--trainer.max_steps", "14", "--ckpt_path", str(ckpt), *WEIGHTS)

    expected, before, after = train_losses(whole), train_losses(first), train_losses(rest)
    assert sorted(expected) == list(range(14)) and sorted(after) == list(range(6, 14))
    assert len(set(expected.values())) == 14  # dropout is on: equal losses are not a coincidence
    for step, loss in {**before, **after}.items():
        assert loss == pytest.approx(expected[step], rel=1e-6, abs=1e-6), f"step {step}"

    mix = mix_of(whole)
    assert (
        sorted(mix) == list(range(14)) and {**mix_of(first), **mix_of(rest)} == mix
    )  # counted on after resuming
    assert all(big + small == pytest.approx(1.0) for big, small in mix.values())
    assert {0 < big < 1 for big, _ in list(mix.values())[4:]} == {True}  # both corpora drawn


def test_without_weights_nothing_is_mixed_or_logged(corpus: Path, tmp_path: Path) -> None:
    run_dir = fit(corpus, tmp_path, "plain", "--trainer.max_steps", "2")
    assert not any(key.startswith("train/mix") for key in read_metrics(run_dir)[0])
