"""Where a run starts from: a run stopped mid-epoch and resumed from its last checkpoint repeats the uninterrupted
run; `--ckpt_path last` finds the newest run of the config; a new run gets a new folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnx.checkpoint import CheckpointError
from attnx.cli import main as attnx
from attnx.commands.ckpt_path import last_choice
from attnx.data.datamodule import TranslationDataModule
from attnx.training.resume import checkpoint_directories, continue_run, finished_run, last_checkpoint
from tests.test_files import killed_write
from tests.training.conftest import fit_args, read_metrics, train_losses

MAX_TOKENS = "1536"  # 10 batches an epoch: the run below crosses an epoch boundary after resuming


def resume_args() -> list[str]:
    """10 batches an epoch, dropout on (losses differ at every step), validation every 3 batches, no BLEU."""
    args = [
        "--data.max_tokens",
        MAX_TOKENS,
        "--model.transformer.dropout",
        "0.3",
        "--evaluation.bleu_samples",
        "0",
    ]
    return [*args, "--trainer.val_check_interval", "3"]


def fit(corpus: Path, work: Path, name: str, *extra: str) -> Path:
    args = resume_args()
    (work / name).mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work / name)
        assert attnx(fit_args(corpus, *args, *extra)) == 0
    return work / name / "runs" / "tiny" / "version_0"


@pytest.mark.parametrize("shape_buckets", ["0", "8"])
def test_resumed_run_has_the_same_batches_and_losses(
    corpus: Path, tmp_path: Path, shape_buckets: str
) -> None:
    datamodule = TranslationDataModule(
        str(corpus), max_tokens=int(MAX_TOKENS), shape_buckets=int(shape_buckets)
    )
    assert len(datamodule.train_sampler) < 14  # the run crosses an epoch boundary after resuming
    buckets = ("--data.shape_buckets", shape_buckets)
    whole = fit(corpus, tmp_path, "whole", "--trainer.max_steps", "14", *buckets)
    first = fit(
        corpus, tmp_path, "first", "--trainer.max_steps", "6", *buckets
    )  # killed after step 6, mid-epoch
    ckpt = first / "checkpoints" / "last.ckpt"
    rest = fit(corpus, tmp_path, "rest", "--trainer.max_steps", "14", "--ckpt_path", str(ckpt), *buckets)

    expected, before, after = train_losses(whole), train_losses(first), train_losses(rest)
    assert sorted(expected) == list(range(14)) and sorted(after) == list(range(6, 14))
    assert len(set(expected.values())) == 14  # dropout is on: equal losses are not a coincidence
    for step, loss in {**before, **after}.items():
        assert loss == pytest.approx(expected[step], rel=1e-6, abs=1e-6), f"step {step}"


def attnx_process(corpus: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "attnx", *fit_args(corpus, *resume_args(), *extra)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_ckpt_path_last_without_a_run_stops_with_one_line(corpus: Path, tmp_path: Path) -> None:
    done = attnx_process(corpus, tmp_path, "--ckpt_path", "last")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("attnx fit: error: --ckpt_path last: no last.ckpt in this config's runs")
    assert not (tmp_path / "runs").exists()  # nothing trained from step 0


def test_ckpt_path_last_resumes_the_newest_run_and_removes_killed_writes(
    corpus: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs" / "tiny"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert attnx(fit_args(corpus, *resume_args(), "--trainer.max_steps", "2")) == 0
        assert attnx(fit_args(corpus, *resume_args(), "--trainer.max_steps", "4")) == 0  # a second, newer run
    newest = runs / "version_1" / "checkpoints"
    left = killed_write(newest / "last.ckpt")
    done = attnx_process(corpus, tmp_path, "--trainer.max_steps", "5", "--ckpt_path", "last")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "--ckpt_path last is runs/tiny/version_1/checkpoints/last.ckpt (the newest of this config's 2 runs, all "
        "finished; another: --ckpt_path runs/tiny/version_N/checkpoints/last.ckpt)" in done.stderr
    )
    resumed = "resumed at step 4 in runs/tiny/version_1 (from runs/tiny/version_1/checkpoints/last.ckpt)"
    assert resumed in done.stdout
    assert f"removed {left.relative_to(tmp_path)}, left by a checkpoint write that was killed" in done.stderr
    assert not left.exists() and (newest / "last.ckpt").is_file()
    # it continued that run from step 4, in its folder: step 5 is logged after the first four, each once
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1"]
    steps = [int(row["step"]) for row in read_metrics(runs / "version_1") if row.get("train/loss")]
    assert steps == [0, 1, 2, 3, 4]


def loggers(save_dir: Path) -> dict:
    """A CSV and a TensorBoard logger sharing `save_dir/tiny`, as configs/tiny.yaml has them."""
    args = {"save_dir": str(save_dir), "name": "tiny"}
    return {
        "logger": [
            {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": dict(args)},
            {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": dict(args)},
        ]
    }


def test_last_is_the_newest_last_ckpt_of_the_config_s_runs(tmp_path: Path) -> None:
    trainer = loggers(tmp_path / "runs")
    with pytest.raises(CheckpointError, match="no run directory of this config exists here"):
        last_checkpoint(trainer)
    for version in (0, 1, 2):
        (tmp_path / "runs" / "tiny" / f"version_{version}" / "checkpoints").mkdir(parents=True)
    older, newer = (tmp_path / "runs" / "tiny" / f"version_{v}" / "checkpoints" / "last.ckpt" for v in (1, 0))
    older.write_bytes(b"1")
    newer.write_bytes(b"0")
    os.utime(older, ns=(1_000_000_000, 1_000_000_000))  # version_1's was written first
    assert len(checkpoint_directories(trainer)) == 3
    assert last_checkpoint(trainer) == newer


def test_last_passes_over_newer_runs_that_finished(tmp_path: Path) -> None:
    """A run stopped at step 147, then a 5-step smoke test of the same config run to its end: `last` is the run
    stopped halfway, and one line says why the newer one was passed over."""
    trainer = loggers(tmp_path / "runs")
    runs = tmp_path / "runs" / "tiny"

    def write(version: int, step: int, trainer_config: dict, seconds: float = 0.0) -> Path:
        path = runs / f"version_{version}" / "checkpoints" / "last.ckpt"
        path.parent.mkdir(parents=True)
        state = {"log_dir": str(path.parent.parent), "config": yaml.safe_dump({"trainer": trainer_config})}
        timer = {"time_elapsed": {"train": seconds}}
        torch.save({"global_step": step, "callbacks": {"RunFolder": state, "Timer": timer}}, path)
        return path

    stopped = write(0, 147, {"max_steps": -1, "max_time": "00:00:30:00"}, seconds=480.0)
    assert last_choice(trainer, stopped) == "this config's only run"
    smoke = write(1, 5, {"max_steps": 5})
    os.utime(stopped, ns=(1_000_000_000, 1_000_000_000))  # the smoke test came later
    assert finished_run(smoke) == "finished at step 5 of max_steps 5" and finished_run(stopped) is None
    assert last_checkpoint(trainer) == stopped
    assert last_choice(trainer, stopped) == (
        "version_0, which has not finished, over the newer run of this config, finished: version_1 finished at "
        "step 5 of max_steps 5; another: "
        f"--ckpt_path {runs / 'version_N' / 'checkpoints' / 'last.ckpt'}"
    )
    timed_out = write(2, 300, {"max_steps": -1, "max_time": {"minutes": 30}}, seconds=1800.0)
    assert finished_run(timed_out) == "finished its max_time at step 300"
    assert last_checkpoint(trainer) == stopped


def test_a_periodic_checkpoint_dirpath_is_the_one_place_looked_in(tmp_path: Path) -> None:
    trainer = loggers(tmp_path / "runs")
    (tmp_path / "runs" / "tiny" / "version_0" / "checkpoints").mkdir(parents=True)
    trainer["callbacks"] = [
        {
            "class_path": "attnx.training.checkpointing.PeriodicCheckpoint",
            "init_args": {"dirpath": str(tmp_path)},
        }
    ]
    assert checkpoint_directories(trainer) == [tmp_path]


def test_a_new_run_pins_its_loggers_to_one_new_folder(tmp_path: Path) -> None:
    (tmp_path / "runs" / "tiny" / "version_0").mkdir(parents=True)
    trainer = loggers(tmp_path / "runs")
    assert continue_run(trainer, None, {}) is False
    assert [logger["init_args"]["version"] for logger in trainer["logger"]] == [1, 1]


def test_a_checkpoint_of_another_run_says_the_folder_it_continues_in(tmp_path: Path, capsys) -> None:
    """Resumed into a folder --run_dir chose (or a new version_N), the line names that folder, not the
    loggers' save_dir."""
    from attnx.training.run_dir import place_loggers
    from attnx.training.runs import Resumed

    other = Resumed(tmp_path / "a" / "last.ckpt", 4, tmp_path / "elsewhere" / "version_0", None, {})
    trainer = loggers(tmp_path / "runs")
    place_loggers(trainer, tmp_path / "runs" / "lora")
    assert continue_run(trainer, other, {"model": {}}) is False
    out = capsys.readouterr().out
    assert f"continues in a new run folder, {tmp_path / 'runs' / 'lora'}: its own run's folder" in out
    assert f"{tmp_path / 'elsewhere' / 'version_0'}, is not where this command logs" in out
    fresh = loggers(tmp_path / "logs")
    assert continue_run(fresh, other, {"model": {}}) is False
    assert (
        f"continues in a new run folder, {tmp_path / 'logs' / 'tiny' / 'version_0'}:"
        in capsys.readouterr().out
    )
