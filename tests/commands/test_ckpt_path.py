"""`--ckpt_path` before Lightning reads it: `last` found among the config's runs, a bad file refused in one line,
killed writes cleaned up for `fit`."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.checkpoint import CheckpointError
from attnx.commands.ckpt_path import checked_checkpoint


def csv_logger(save_dir: Path) -> dict:
    return {"logger": [{"class_path": "CSVLogger", "init_args": {"save_dir": str(save_dir), "name": "tiny"}}]}


@pytest.mark.parametrize("ckpt_path", [None, "", "best", "hpc", "registry"])
def test_no_checkpoint_and_lightning_s_keywords_pass_unread(ckpt_path, tmp_path: Path) -> None:
    assert checked_checkpoint("fit", ckpt_path, csv_logger(tmp_path)) == ckpt_path


def test_last_without_a_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="--ckpt_path last: no last.ckpt in this config's runs"):
        checked_checkpoint("fit", "last", csv_logger(tmp_path / "runs"))


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
