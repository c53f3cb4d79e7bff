"""`--best.metric` keeps the checkpoint of the best validation as best.ckpt; `--best.patience` stops a run whose
validation no longer improves, and a resumed run goes on counting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnx.cli import main as attnx
from attnx.training.best import BestCheckpoint
from tests.training.conftest import fit_args, read_metrics

# Validation every 2 steps; no later validation can beat the first by 1,000 nats, so the count of validations
# without improvement does not depend on what the model learns.
EARLY = ["--best.metric", "loss", "--best.min_delta", "1000", "--trainer.val_check_interval", "2"]


def test_the_best_validation_is_kept_and_a_run_that_stops_improving_ends_early(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "tiny" / "version_0"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert attnx(fit_args(corpus, *EARLY, "--trainer.max_steps", "20", "--best.patience", "2")) == 0
        first = capsys.readouterr().out
        assert (
            attnx(
                fit_args(
                    corpus, *EARLY, "--trainer.max_steps", "20", "--best.patience", "3", "--ckpt_path", "last"
                )
            )
            == 0
        )
        second = capsys.readouterr().out
    best = run / "checkpoints" / "best.ckpt"
    assert (
        "best val/loss " in first
        and f" at step 2: {Path('runs/tiny/version_0/checkpoints/best.ckpt')}" in first
    )
    assert "early stopping at step 6: val/loss has not improved for 2 validations (best " in first
    assert torch.load(best, weights_only=True)["global_step"] == 2
    # the resumed run goes on counting from 2 validations without improvement: one more and it stops
    assert "resumed at step 6 in runs/tiny/version_0" in second
    assert "steps after step 6 (max_steps)" in second  # the estimate is for the steps left
    assert "early stopping at step 8: val/loss has not improved for 3 validations" in second
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    assert torch.load(best, weights_only=True)["global_step"] == 2
    steps = sorted({int(row["step"]) for row in read_metrics(run) if row.get("train/loss")})
    assert steps == list(range(8))
    # on a log file, a line after the first step of each segment
    assert "step 1/20 |" in first and "step 7/20 |" in second


def test_patience_without_a_metric_and_bleu_without_validation_bleu_are_one_line(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Exception, match="--best.patience 3 needs the score it waits on: add --best.metric"):
        BestCheckpoint(patience=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert attnx(fit_args(corpus, "--best.patience", "3")) == 2
        assert attnx(fit_args(corpus, "--best.metric", "bleu", "--evaluation.bleu_samples", "0")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--best.patience 3 needs the score it waits on" in err[0]
    assert "--best.metric bleu needs validation BLEU" in err[-1] and "Traceback" not in "".join(err)
    assert not (tmp_path / "runs" / "tiny" / "version_0" / "checkpoints").exists()
