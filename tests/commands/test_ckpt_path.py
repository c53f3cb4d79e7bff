"""`--ckpt_path` before Lightning reads it: `last` found among the config's runs, a bad file refused in one line
(for `fit`, also one with no training state to resume), killed writes cleaned up for `fit`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from attnx.checkpoint import CheckpointError, atomic_save, average_checkpoints
from attnx.cli import main as attnx
from attnx.commands.ckpt_path import checked_checkpoint
from attnx.errors import ConfigError
from tests.checkpoints import tiny_checkpoint
from tests.training.conftest import fit_args


def csv_logger(save_dir: Path) -> dict:
    return {"logger": [{"class_path": "CSVLogger", "init_args": {"save_dir": str(save_dir), "name": "tiny"}}]}


@pytest.mark.parametrize("ckpt_path", [None, "", "hpc", "registry"])
def test_no_checkpoint_and_lightning_s_keywords_pass_unread(ckpt_path, tmp_path: Path) -> None:
    assert checked_checkpoint("fit", ckpt_path, csv_logger(tmp_path)) == ckpt_path


def test_last_without_a_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="--ckpt_path last: no last.ckpt in this config's runs"):
        checked_checkpoint("fit", "last", csv_logger(tmp_path / "runs"))


def test_best_without_a_best_checkpoint_says_how_to_get_one(tmp_path: Path) -> None:
    """Lightning took `best` for its own keyword and ended in `AttributeError: 'PeriodicCheckpoint' object has no
    attribute 'best_model_path'`; attnx's best.ckpt is what a user means, and without one a line says how to get
    one."""
    (tmp_path / "runs" / "tiny" / "version_0" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError) as caught:
        checked_checkpoint("test", "best", csv_logger(tmp_path / "runs"))
    assert str(caught.value) == (
        f"--ckpt_path best: no best.ckpt in this config's runs ({tmp_path}/runs/tiny/version_0/checkpoints); a run "
        "keeps one when trained with --best.metric bleu (or loss, ppl). Pass a checkpoint's path, or --ckpt_path last"
    )


def test_best_is_the_newest_best_checkpoint_of_the_config_s_runs(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs" / "tiny"
    for version in (0, 1):
        (runs / f"version_{version}" / "checkpoints").mkdir(parents=True)
        tiny_checkpoint(corpus, runs / f"version_{version}" / "checkpoints" / "best.ckpt")
    newest = runs / "version_0" / "checkpoints" / "best.ckpt"
    os.utime(newest, ns=(time.time_ns() + 10**9,) * 2)
    assert checked_checkpoint("test", "best", csv_logger(tmp_path / "runs")) == str(newest)
    assert capsys.readouterr().err == (
        f"attnx test: --ckpt_path best is {newest} (the newest of this config's 2 runs' best.ckpt; another: "
        f"--ckpt_path {runs}/version_N/checkpoints/best.ckpt)\n"
    )


def test_test_with_ckpt_path_best_decodes_the_run_s_best_checkpoint(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    steps = ("--trainer.max_steps", "4", "--evaluation.bleu_samples", "0", "--best.metric", "loss")
    assert attnx(fit_args(corpus, *steps)) == 0
    best = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "best.ckpt"
    assert best.is_file()
    capsys.readouterr()
    extra = ("--evaluation.search.max_len_b", "2", "--evaluation.search.beam", "1")
    assert attnx(fit_args(corpus, "--ckpt_path", "best", *extra, subcommand="test")) == 0
    said = capsys.readouterr()
    assert (
        f"attnx test: --ckpt_path best is {best.relative_to(tmp_path)} (this config's only run with one)"
        in (said.err)
    ), said.err


def test_a_file_that_is_no_checkpoint_is_refused_before_lightning_reads_it(tmp_path: Path) -> None:
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        checked_checkpoint("test", str(text), {})


def test_fit_removes_the_leftovers_of_killed_writes(tmp_path: Path, capsys) -> None:
    from tests.test_files import killed_write

    checkpoints = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    left = killed_write(checkpoints / "last.ckpt")
    assert checked_checkpoint("fit", None, csv_logger(tmp_path / "runs")) is None
    assert not left.exists()
    assert f"attnx fit: removed {left}, left by a checkpoint write that was killed" in capsys.readouterr().err


def test_fit_refuses_a_checkpoint_of_weights_only_and_says_what_to_use(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    """An averaged checkpoint (or one save_model wrote) has no optimizer state: `fit --ckpt_path` with it ended in
    Lightning's KeyError. One line says to fine-tune from it with --init_from, or resume with --ckpt_path last;
    the decoding commands read it as before."""
    weights = tiny_checkpoint(corpus, tmp_path / "weights.ckpt")
    averaged = tmp_path / "averaged.ckpt"
    atomic_save(average_checkpoints([weights, weights]), averaged)
    for path, what in ((averaged, "an averaged checkpoint"), (weights, "a checkpoint of weights only")):
        with pytest.raises(ConfigError) as caught:
            checked_checkpoint("fit", str(path), csv_logger(tmp_path / "runs"))
        assert str(caught.value) == (
            f"--ckpt_path {path} is {what}: it holds weights only, no optimizer state, schedule or step to "
            f"resume; use --init_from {path} to fine-tune from it, or --ckpt_path last to resume the run"
        )
        assert checked_checkpoint("test", str(path), {}) == str(path)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert attnx(fit_args(corpus, "--ckpt_path", str(averaged))) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith(
        f"attnx fit: error: --ckpt_path {averaged} is an averaged checkpoint: it holds weights only"
    ), err


def test_last_and_best_of_a_run_dir_are_its_own(corpus: Path, tmp_path: Path, capsys) -> None:
    """`--ckpt_path last --run_dir DIR` looked among the loggers' runs/NAME/version_N and found no run there."""
    run = tmp_path / "lora_medical"
    (run / "checkpoints").mkdir(parents=True)
    last = tiny_checkpoint(corpus, run / "checkpoints" / "last.ckpt")
    assert checked_checkpoint("test", "last", csv_logger(tmp_path / "runs"), run) == str(last)
    assert capsys.readouterr().err == f"attnx test: --ckpt_path last is {last} (the run in {run})\n"
    with pytest.raises(CheckpointError) as caught:
        checked_checkpoint("test", "best", csv_logger(tmp_path / "runs"), run)
    assert str(caught.value) == (
        f"--ckpt_path best: {run} holds no checkpoints/best.ckpt; a run keeps one when trained with --best.metric "
        "bleu (or loss, ppl); pass a checkpoint's path"
    )


def test_a_missing_loose_checkpoint_names_the_config_s_newest_run_s_file(
    corpus: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnx test --ckpt_path averaged.ckpt` said ". holds no checkpoint", where the config's run has one."""
    monkeypatch.chdir(tmp_path)
    for version in (0, 1):
        (tmp_path / "runs" / "tiny" / f"version_{version}" / "checkpoints").mkdir(parents=True)
        tiny_checkpoint(
            corpus, tmp_path / "runs" / "tiny" / f"version_{version}" / "checkpoints" / "averaged.ckpt"
        )
    newest = Path("runs/tiny/version_1/checkpoints/averaged.ckpt")
    os.utime(newest, ns=(time.time_ns() + 10**9,) * 2)
    assert attnx(fit_args(corpus, "--ckpt_path", "averaged.ckpt", subcommand="test")) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"attnx test: error: checkpoint averaged.ckpt does not exist; the newest run of this config has {newest}"
    ]
