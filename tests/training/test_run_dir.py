"""The folder a run writes: `attnx fit --run_dir DIR` and `--name NAME` put the whole run there (every logger,
the checkpoints, the configs), never over another run, and a resume continues there; `validate`, `test` and
`predict` of a checkpoint write inside the run it lies in, or beside a checkpoint of no run, never in a new
`version_N`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.errors import ConfigError
from attnx.training.run_dir import checkpoint_run, chosen_folder
from tests.training.conftest import fit_args, read_metrics, train_losses
from tests.training.test_runs import tensorboard_steps

RUN_FILES = ["checkpoints", "config.yaml", "hparams.yaml", "metrics.csv"]
"""A run's folder holds these, and one TensorBoard events file."""


def fit(corpus: Path, *extra: str) -> int:
    return attnx(fit_args(corpus, "--evaluation.bleu_samples", "0", *extra))


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def run_files(folder: Path) -> list[str]:
    names = sorted(p.name for p in folder.iterdir())
    events = [n for n in names if n.startswith("events.out.tfevents.")]
    assert len(events) == 1, names  # CSV and TensorBoard in the same folder
    return [n for n in names if n not in events]


@pytest.fixture(scope="module")
def parent(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run, `runs/tiny/version_0`, that fine-tuning runs start from (`--init_from`)."""
    work = tmp_path_factory.mktemp("parent")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert fit(corpus, "--trainer.max_steps", "2") == 0
    return work / "runs" / "tiny" / "version_0"


def test_name_puts_a_fine_tuning_run_in_its_own_folder_refuses_it_again_and_resumes_it_there(
    corpus: Path, parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`attnx fit --init_from parent.ckpt --name lora_medical` landed in runs/tiny/version_N beside the parent."""
    monkeypatch.chdir(tmp_path)
    start = ["--init_from", str(parent / "checkpoints" / "averaged.ckpt"), "--name", "lora_medical"]
    assert fit(corpus, *start, "--trainer.max_steps", "2") == 0
    run = Path("runs") / "lora_medical"
    assert sorted(p.name for p in Path("runs").iterdir()) == ["lora_medical"]  # no version_N anywhere
    assert run_files(run) == RUN_FILES
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "averaged.ckpt",
        "last.ckpt",
        "step=1.ckpt",
        "step=2.ckpt",
    ]
    assert f"logs and checkpoints in {run}" in capsys.readouterr().out

    # the same command again never writes over the run: one line, the run as it was
    metrics = (run / "metrics.csv").read_bytes()
    assert fit(corpus, *start, "--trainer.max_steps", "2") == 2
    assert one_line(capsys) == (
        "attnx fit: error: --name lora_medical: runs/lora_medical already holds a run (checkpoints/, "
        "config.yaml, hparams.yaml, metrics.csv, TensorBoard events); resume it with --ckpt_path "
        "runs/lora_medical/checkpoints/last.ckpt, or choose another folder"
    )
    assert (run / "metrics.csv").read_bytes() == metrics

    # `--ckpt_path last` with the same --name, then the checkpoint's path alone, continue in the folder
    assert fit(corpus, "--name", "lora_medical", "--ckpt_path", "last", "--trainer.max_steps", "3") == 0
    captured = capsys.readouterr()
    assert f"--ckpt_path last is {run / 'checkpoints' / 'last.ckpt'} (the run in {run})" in captured.err
    assert f"resumed at step 2 in {run} (from {run / 'checkpoints' / 'last.ckpt'})" in captured.out
    last = str(run / "checkpoints" / "last.ckpt")
    assert fit(corpus, "--ckpt_path", last, "--trainer.max_steps", "4") == 0
    assert f"resumed at step 3 in {run}" in capsys.readouterr().out
    assert sorted(p.name for p in Path("runs").iterdir()) == ["lora_medical"]
    assert sorted(train_losses(run)) == [0, 1, 2, 3]  # every step once, in one metrics.csv
    assert tensorboard_steps(run, "train/loss") == [0, 1, 2, 3]


def test_run_dir_takes_any_folder_and_refuses_name_beside_it(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert fit(corpus, "--run_dir", "experiments/seed1", "--trainer.max_steps", "1") == 0
    assert run_files(tmp_path / "experiments" / "seed1") == RUN_FILES
    assert not (tmp_path / "runs").exists()  # nothing under the loggers' own runs/tiny
    capsys.readouterr()
    assert fit(corpus, "--run_dir", "a", "--name", "b") == 2
    assert one_line(capsys) == (
        "attnx fit: error: --run_dir a and --name b both given: --name NAME is short for --run_dir "
        "<the loggers' save_dir>/NAME; pass one of them"
    )
    assert fit(corpus, "--run_dir", ".") == 2
    assert one_line(capsys).endswith("--run_dir needs a folder of the run's own (e.g. runs/NAME), got '.'")
    assert not (tmp_path / "a").exists() and not (tmp_path / "runs").exists()


def test_a_test_writes_in_the_run_its_checkpoint_lies_in_or_beside_a_loose_one(
    corpus: Path, parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """From another folder, a test of a run's checkpoint made a new runs/tiny/version_0 there (the run's folder
    is recorded relative to where it trained), and one of a loose m.ckpt a new version_N."""
    monkeypatch.chdir(tmp_path)
    last = parent / "checkpoints" / "last.ckpt"
    assert (
        attnx(fit_args(corpus, "--ckpt_path", str(last), "--evaluation.search.beam", "1", subcommand="test"))
        == 0
    )
    folder = parent / "test" / "last"
    out = capsys.readouterr().out
    assert f"attnx test: {last} belongs to the run {parent}; this test logs in {folder}" in out
    assert len((folder / "test.hyp").read_text(encoding="utf-8").splitlines()) == 50
    assert "test/bleu" in read_metrics(folder)[0]
    assert "decoding_precision: 32-true" in (folder / "hparams.yaml").read_text()  # what it decoded in, kept
    assert not (tmp_path / "runs").exists()

    shutil.copy(parent / "checkpoints" / "averaged.ckpt", tmp_path / "m.ckpt")
    args = fit_args(corpus, "--ckpt_path", "m.ckpt", "--evaluation.search.beam", "1", subcommand="predict")
    assert attnx(args) == 0
    out = capsys.readouterr().out
    assert "attnx predict: m.ckpt lies in no run's checkpoints/ folder; this predict logs in m.predict" in out
    assert out.splitlines()[-1] == f"translations written to {Path('m.predict') / 'test.hyp'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ckpt", "m.predict"]  # no runs/tiny/version_N


def test_a_test_with_name_decodes_that_run_s_checkpoint_and_refuses_another_s(
    corpus: Path, parent: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(parent.parents[2])
    other = parent.parents[2] / "elsewhere.ckpt"
    shutil.copy(parent / "checkpoints" / "averaged.ckpt", other)
    args = ["--run_dir", str(parent), "--evaluation.search.beam", "1", "--trainer.limit_test_batches", "1"]
    assert attnx(fit_args(corpus, *args, "--ckpt_path", str(other), subcommand="test")) == 2
    assert one_line(capsys).startswith(
        f"attnx test: error: --run_dir {parent}: --ckpt_path {other} is not a checkpoint of the run in {parent}"
    )
    assert attnx(fit_args(corpus, *args, "--ckpt_path", "last", subcommand="test")) == 0
    assert f"this test logs in {parent / 'test' / 'last'}" in capsys.readouterr().out


def test_the_folder_a_name_means_and_the_run_a_checkpoint_lies_in(tmp_path: Path) -> None:
    loggers = {"logger": [{"init_args": {"save_dir": "runs", "name": "tiny"}}]}
    assert chosen_folder(None, "lora", loggers) == Path("runs/lora")
    assert chosen_folder("x/y", None, loggers) == Path("x/y")
    assert chosen_folder(None, None, loggers) is None
    loggers["logger"].append({"init_args": {"save_dir": "logs", "name": "tiny"}})
    with pytest.raises(ConfigError, match="write under runs and logs, so NAME names no one folder"):
        chosen_folder(None, "lora", loggers)
    with pytest.raises(ConfigError, match="name no save_dir"):
        chosen_folder(None, "lora", {"logger": None})
    chosen = tmp_path / "lora" / "checkpoints"
    chosen.mkdir(parents=True)
    assert checkpoint_run(chosen / "last.ckpt") is None  # a folder named checkpoints in no run
    (tmp_path / "lora" / "metrics.csv").touch()
    assert checkpoint_run(chosen / "last.ckpt") == tmp_path / "lora"
    (tmp_path / "version_3" / "checkpoints").mkdir(parents=True)
    assert checkpoint_run(tmp_path / "version_3" / "checkpoints" / "step=5.ckpt") == tmp_path / "version_3"
    assert checkpoint_run(tmp_path / "m.ckpt") is None
