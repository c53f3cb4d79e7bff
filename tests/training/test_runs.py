"""A run is one folder across its restarts: a run killed (SIGKILL, SIGTERM) and resumed each time ends with the
uninterrupted run's checkpoints, averaged checkpoint and logs, in the uninterrupted run's folder."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnx.cli import main as attnx
from tests.training.conftest import TINY, fit_args, read_metrics, train_losses
from tests.training.test_stopping import attnx_command, environment, resume_hint, run, stop_at

STEPS = 12


def every_two_steps(tmp_path: Path) -> Path:
    """configs/tiny.yaml saving at every second step (none on time), the last 3 kept and averaged."""
    config = yaml.safe_load(TINY.read_text())
    config["trainer"]["callbacks"][0]["init_args"] = {"minutes": None, "every_n_steps": 2, "keep": 3}
    path = tmp_path / "every_two_steps.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of a scalar as TensorBoard shows it (events a resumed run purged are left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def checkpoint_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_file())


@pytest.mark.slow
def test_a_run_killed_twice_and_resumed_ends_as_the_uninterrupted_run(
    corpus: Path, tmp_path: Path, uninterrupted_run: Path
) -> None:
    config = every_two_steps(tmp_path)
    command = attnx_command(corpus, "--trainer.max_steps", str(STEPS), config=config)
    whole = uninterrupted_run  # the same command, never interrupted

    work = tmp_path / "interrupted"
    killed = stop_at(command, work, 3, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    stopped = stop_at([*command, "--ckpt_path", "last"], work, 7, signal.SIGTERM)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    _, resume = resume_hint(stopped.stderr)
    run(resume, work)  # the printed command

    assert sorted(p.name for p in (work / "runs" / "tiny").iterdir()) == ["version_0"]  # one folder
    ours = work / "runs" / "tiny" / "version_0"
    assert (
        checkpoint_files(ours)
        == checkpoint_files(whole)
        == [
            "averaged.ckpt",
            "last.ckpt",
            "step=10.ckpt",
            "step=12.ckpt",
            "step=8.ckpt",
        ]
    )
    assert (ours / "checkpoints" / "averaged.ckpt").read_bytes() == (
        whole / "checkpoints" / "averaged.ckpt"
    ).read_bytes()
    # the logs hold every step once, with the uninterrupted run's losses
    rows = [int(row["step"]) for row in read_metrics(ours) if row.get("train/loss")]
    assert rows == list(range(STEPS))
    assert train_losses(ours) == train_losses(whole)
    assert tensorboard_steps(ours, "train/loss") == list(range(STEPS))


def test_resuming_an_older_checkpoint_sets_the_later_ones_aside(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--evaluation.bleu_samples", "0"]
    assert attnx(fit_args(corpus, *args, "--trainer.max_steps", "6")) == 0
    checkpoints = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints"
    older = checkpoints / "step=4.ckpt"
    capsys.readouterr()
    assert attnx(fit_args(corpus, *args, "--trainer.max_steps", "8", "--ckpt_path", str(older))) == 0
    out = capsys.readouterr().out
    assert (
        f"resume: {older} is at step 4, before this run's newest checkpoint; the later ones (step=5.ckpt, "
        "step=6.ckpt) are moved to runs/tiny/version_0/checkpoints/abandoned_after_step=4 and not averaged"
        in out
    )
    aside = checkpoints / "abandoned_after_step=4"
    assert sorted(p.name for p in aside.iterdir()) == ["last.ckpt", "step=5.ckpt", "step=6.ckpt"]
    assert torch.load(aside / "last.ckpt", weights_only=True)["global_step"] == 6
    averaged = torch.load(checkpoints / "averaged.ckpt", weights_only=True)
    assert averaged["averaged_from"] == [f"runs/tiny/version_0/checkpoints/step={s}.ckpt" for s in (6, 7, 8)]
    steps = [int(row["step"]) for row in read_metrics(checkpoints.parent) if row.get("train/loss")]
    assert steps == list(range(8))  # the abandoned steps 4 and 5 are logged once, by the new branch
    assert sorted(p.name for p in checkpoints.parent.parent.iterdir()) == ["version_0"]


def test_a_start_refused_before_training_leaves_no_run_folder(corpus: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *fit_args(corpus, "--data.max_tokens", "8")],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 1 and "max_tokens" in done.stderr, done.stderr[-3000:]
    assert not list(tmp_path.glob("runs/tiny/version_*"))
