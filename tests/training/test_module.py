"""Training behaviour through `attnx fit`: the schedule under gradient accumulation, bf16, a diverging run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnx.cli import main as attnx
from attnx.training.schedule import inverse_sqrt_schedule
from tests.training.conftest import fit_args, read_metrics, train_losses

QUICK = [
    "--trainer.callbacks",
    "null",
    "--evaluation.bleu_samples",
    "0",
    "--trainer.enable_checkpointing",
    "false",
]


def fit(corpus: Path, work: Path, *extra: str) -> tuple[int, Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        rc = attnx(fit_args(corpus, *QUICK, *extra))
    return rc, work / "runs" / "tiny" / "version_0"


def test_gradient_accumulation_steps_the_schedule_once_per_update(corpus: Path, tmp_path: Path) -> None:
    rc, run = fit(corpus, tmp_path, "--trainer.max_steps", "5", "--trainer.accumulate_grad_batches", "2")
    assert rc == 0
    rates = {int(r["step"]): float(r["train/lr"]) for r in read_metrics(run) if r["train/lr"]}
    # 10 batches, 5 updates; update n (logged at step n - 1) uses Eq. 3 at n: d_model 32, warmup 4
    assert rates == pytest.approx({n - 1: inverse_sqrt_schedule(n, 32, 4) for n in range(1, 6)})


def test_bf16_mixed_trains_on_cpu(corpus: Path, tmp_path: Path) -> None:
    rc, run = fit(corpus, tmp_path, "--trainer.max_steps", "3", "--trainer.precision", "bf16-mixed")
    assert rc == 0
    losses = train_losses(run)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses.values())


def test_diverging_run_stops_with_the_step_and_advice(corpus: Path, tmp_path: Path, capsys) -> None:
    rc, _ = fit(corpus, tmp_path, "--trainer.max_steps", "4", "--model.lr_factor", "1e30")
    err = capsys.readouterr().err
    assert rc == 1
    assert "training loss is nan at optimizer step 2" in err
    assert "Lower model.lr_factor" in err and "32-true" in err


def test_hyperparameters_are_plain_without_the_cli(corpus: Path) -> None:
    from attnx.model import TransformerConfig
    from attnx.training.module import TranslationTask

    task = TranslationTask(TransformerConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32))
    assert isinstance(task.hparams["transformer"], dict) and isinstance(task.hparams["loss"], dict)
    restored = TranslationTask(**{k: v for k, v in task.hparams.items()})
    assert restored.config == task.config
    torch.testing.assert_close(torch.tensor(restored.hparams["betas"]), torch.tensor(task.hparams["betas"]))
