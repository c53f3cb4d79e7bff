"""Subword sampling (`data.subword_sampling`): training pairs segmented anew each epoch in the planned shapes,
never longer than the model reads, validation on the prepared segmentation, the same draws after a resume, wrong
settings refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnx.cli import main as attnx
from attnx.data.batching import collate_indices
from attnx.data.datamodule import TranslationDataModule
from attnx.data.sampling import SubwordSampling
from attnx.errors import ConfigError
from tests.training.conftest import fit_args, train_losses
from tests.training.test_resume import fit


def datamodule(corpus: Path, alpha: float = 0.3, buckets: int = 8) -> TranslationDataModule:
    return TranslationDataModule(
        str(corpus), max_tokens=512, shape_buckets=buckets, subword_sampling=SubwordSampling(alpha=alpha)
    )


def epoch_batches(dm: TranslationDataModule, epoch: int) -> dict[int, object]:
    """The epoch's training batches by their first pair (the same batches come in another order each epoch)."""
    dm.train_sampler.set_epoch(epoch)
    return {int(b.index[0]): b for b in dm.train_dataloader()}


def pieces(dataset, batch) -> list:
    """The prepared source pieces (EOS included) of each pair of `batch`."""
    prepared = collate_indices(dataset, batch.index.numpy())
    return [prepared.src[r][prepared.src_mask[r]] for r in range(len(batch.index))]


@pytest.mark.parametrize("buckets", [8, 0])
def test_training_batches_change_each_epoch_in_their_planned_shapes(corpus: Path, buckets: int) -> None:
    dm = datamodule(corpus, buckets=buckets)
    first, second, again = epoch_batches(dm, 0), epoch_batches(dm, 1), epoch_batches(dm, 0)
    assert first.keys() == second.keys()
    sampler, dataset = dm.train_sampler, dm.corpus.dataset("train")
    planned = {int(sampler.order[sampler.bounds[k]]): tuple(sampler.shapes[k]) for k in range(len(first))}
    changed = 0
    for key, batch in first.items():
        prepared = collate_indices(dataset, batch.index.numpy())
        if buckets:  # the shapes of the plan: what captured graphs and oneDNN's kernels are built for
            assert (len(batch.index), batch.src.shape[1], batch.tgt_in.shape[1]) == planned[key]
        else:  # within the token budget
            assert batch.src.numel() <= 512 or len(batch.index) == 1
        assert batch.src.equal(again[key].src) and batch.tgt_out.equal(again[key].tgt_out)  # seeded
        changed += not batch.src.equal(second[key].src)
        # another segmentation of the same text
        tokenizer = dm.tokenizer
        for row in range(len(batch.index)):
            assert tokenizer.decode(batch.src[row].tolist()) == tokenizer.decode(prepared.src[row].tolist())
            assert tokenizer.decode(batch.tgt_out[row].tolist()) == tokenizer.decode(
                prepared.tgt_out[row].tolist()
            )
        assert batch.n_tgt_tokens == int(batch.tgt_mask.sum())
    assert changed == len(first)  # every batch differs between epochs
    # nearly every pair is resegmented: the batches were planned with room for the longer segmentations
    rows = [(b.src[r][b.src_mask[r]], p) for b in first.values() for r, p in enumerate(pieces(dataset, b))]
    assert sum(not x.equal(p) for x, p in rows) > 0.8 * len(rows)


def test_validation_keeps_the_prepared_segmentation(corpus: Path) -> None:
    dm, plain = datamodule(corpus), TranslationDataModule(str(corpus), max_tokens=512, shape_buckets=8)
    for epoch in (0, 1):
        dm.train_sampler.set_epoch(epoch)
        for sampled, prepared in zip(dm.val_dataloader(), plain.val_dataloader(), strict=True):
            assert sampled.src.equal(prepared.src) and sampled.tgt_out.equal(prepared.tgt_out)


def test_without_alpha_the_batches_are_the_prepared_ones(corpus: Path) -> None:
    dm, plain = (
        datamodule(corpus, alpha=0.0),
        TranslationDataModule(str(corpus), max_tokens=512, shape_buckets=8),
    )
    for sampled, prepared in zip(dm.train_dataloader(), plain.train_dataloader(), strict=True):
        assert sampled.src.equal(prepared.src)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"alpha": -0.1}, r"^data\.subword_sampling\.alpha must be >= 0"),
        ({"alpha": float("nan")}, r"^data\.subword_sampling\.alpha must be >= 0"),
        ({"alpha": 0.1, "nbest_size": 0}, r"^data\.subword_sampling\.nbest_size must be -1"),
        ({"alpha": 0.1, "nbest_size": 1}, r"^data\.subword_sampling\.nbest_size must be -1"),
    ],
)
def test_wrong_settings_are_refused_naming_the_option(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SubwordSampling(**settings)


def test_a_bpe_dropout_of_1_is_refused_and_an_ignored_nbest_is_said(corpus: Path) -> None:
    tokenizer = TranslationDataModule(str(corpus)).tokenizer
    with pytest.raises(ConfigError, match=r"^data\.subword_sampling\.alpha 1\.0 drops every merge"):
        SubwordSampling(alpha=1.0).check(tokenizer)
    assert "nbest_size 4 ignored (BPE)" in SubwordSampling(alpha=0.1, nbest_size=4).check(tokenizer)


def test_a_resumed_run_draws_what_the_uninterrupted_run_drew(corpus: Path, tmp_path: Path) -> None:
    sampling = ("--data.subword_sampling.alpha", "0.2", "--data.shape_buckets", "8")
    whole = fit(corpus, tmp_path, "whole", "--trainer.max_steps", "12", *sampling)
    first = fit(corpus, tmp_path, "first", "--trainer.max_steps", "5", *sampling)
    ckpt = first / "checkpoints" / "last.ckpt"
    rest = fit(corpus, tmp_path, "rest", "--trainer.max_steps", "12", "--ckpt_path", str(ckpt), *sampling)
    plain = fit(corpus, tmp_path, "plain", "--trainer.max_steps", "12", "--data.shape_buckets", "8")
    expected, after = train_losses(whole), train_losses(rest)
    assert sorted(after) == list(range(5, 12))
    for step, loss in after.items():
        assert loss == pytest.approx(expected[step], rel=1e-6, abs=1e-6), f"step {step}"
    # and sampling changed what was trained on
    assert not np.allclose(list(expected.values()), list(train_losses(plain).values()))


@pytest.mark.parametrize("buckets", ["0", "8"])
def test_fit_never_samples_a_side_longer_than_the_model_reads(
    corpus: Path, tmp_path: Path, buckets: str
) -> None:
    """A model of max_len 100 reads every prepared pair (the longest needs 97 positions with its `</s>`), not
    the segmentations BPE-dropout 0.5 samples for the longest (up to ~170 pieces): a side whose sampled pieces
    would outgrow the model keeps its prepared ones, and shape buckets stop at its positions (100 is none of
    theirs), so `attnx fit` trains a whole epoch instead of stopping at the positional table's error."""
    max_len = 100
    dm = datamodule(corpus, alpha=0.5, buckets=int(buckets))
    dm.max_positions = max_len  # what `attnx fit` reads off its model
    data = dm.corpus.dataset("train")
    assert max(int(data.src_lengths.max()), int(data.tgt_lengths.max())) + 1 <= max_len
    batches = list(dm.train_dataloader())
    assert max(max(b.src.shape[1], b.tgt_in.shape[1]) for b in batches) <= max_len
    longest_source = max(int(b.src_mask.sum(1).max()) for b in batches)
    assert longest_source > int(data.src_lengths.max()) + 1  # sampled longer than any prepared source
    steps = len(dm.train_sampler)  # one epoch: every batch, the longest among them
    (tmp_path / "run").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path / "run")
        argv = fit_args(corpus, "--model.transformer.max_len", str(max_len), "--data.shape_buckets", buckets)
        argv += ["--data.subword_sampling.alpha", "0.5", "--trainer.max_steps", str(steps)]
        argv += ["--trainer.val_check_interval", str(steps), "--evaluation.bleu_samples", "0"]
        assert attnx(argv) == 0
    assert sorted(train_losses(tmp_path / "run" / "runs" / "tiny" / "version_0")) == list(range(steps))
