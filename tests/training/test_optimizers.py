"""`--optimizer` and `--lr_scheduler` (LightningCLI's options) in place of the paper's Adam and Eq. 3: what
runs is said in one line, Eq. 3 stays over another optimizer's rate unless a schedule replaces it, and a
schedule without an optimizer is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnx.model import TransformerConfig
from attnx.training.module import TranslationTask
from attnx.training.optimizers import choice_line, configure_optimizers
from attnx.training.schedule import inverse_sqrt_schedule
from tests.training.conftest import fit_args, read_metrics

TINY_MODEL = {"d_model": 32, "n_heads": 4, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1}


def sgd(lr: float) -> dict:
    return {"class_path": "torch.optim.SGD", "init_args": {"lr": lr, "momentum": 0.0}}


def test_the_line_says_what_replaces_adam_and_eq3() -> None:
    model = {"transformer": {"d_model": 32}, "lr_factor": 2.0, "warmup_steps": 4}
    line = choice_line(sgd(0.5), None, model)
    assert "--optimizer SGD replaces the paper's optimizer" in line and "model.betas" in line
    assert "follows Eq. 3, times SGD's lr 0.5 (peak 0.0884 at step 4)" in line  # 0.5·2·(32·4)^-0.5
    scheduler = {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 2}}
    line = choice_line(sgd(0.5), scheduler, model)
    assert "--lr_scheduler StepLR replaces Eq. 3's schedule" in line and "after every update" in line


def test_another_optimizer_keeps_eq3_over_its_rate() -> None:
    task = TranslationTask(TransformerConfig(**TINY_MODEL, vocab_size=50), warmup_steps=4, lr_factor=2.0)
    optimizer = torch.optim.SGD(task.parameters(), lr=0.5)
    config = configure_optimizers(task, optimizer)
    scheduler = config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    for step in range(1, 7):
        expected = 0.5 * inverse_sqrt_schedule(step, d_model=32, warmup_steps=4, factor=2.0)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected)
        optimizer.step()
        scheduler.step()


def attnx(corpus: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    argv = [*fit_args(corpus, "--trainer.max_steps", "3"), *extra]
    return subprocess.run(
        [sys.executable, "-m", "attnx", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def learning_rates(cwd: Path) -> list[float]:
    rows = read_metrics(cwd / "runs" / "tiny" / "version_0")
    return [float(row["train/lr"]) for row in rows if row.get("train/lr")]


@pytest.mark.slow
def test_fit_with_sgd_says_so_and_keeps_eq3(corpus: Path, tmp_path: Path) -> None:
    done = attnx(corpus, tmp_path, "--optimizer", "SGD", "--optimizer.lr", "0.5")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attnx fit: --optimizer SGD replaces the paper's optimizer" in done.stdout
    assert "will be overridden" not in done.stderr  # Lightning's own warning gives way to that line
    tiny = {"d_model": 32, "warmup_steps": 4, "factor": 1.0}  # configs/tiny.yaml
    expected = [0.5 * inverse_sqrt_schedule(step, **tiny) for step in (1, 2, 3)]
    assert learning_rates(tmp_path) == pytest.approx(expected)


@pytest.mark.slow
def test_fit_with_a_schedule_of_its_own_steps_it_every_update(corpus: Path, tmp_path: Path) -> None:
    schedule = ["--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "2", "--lr_scheduler.gamma", "0.1"]
    done = attnx(corpus, tmp_path, "--optimizer", "SGD", "--optimizer.lr", "0.5", *schedule)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--lr_scheduler StepLR replaces Eq. 3's schedule" in done.stdout
    assert learning_rates(tmp_path) == pytest.approx([0.5, 0.5, 0.05])


def test_a_schedule_without_an_optimizer_is_refused(corpus: Path, tmp_path: Path) -> None:
    done = attnx(corpus, tmp_path, "--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "2")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("attnx fit: error: --lr_scheduler replaces Eq. 3's schedule")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
