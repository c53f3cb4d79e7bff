"""The command line around LightningCLI: packaged config names, a checkpoint's model for the decoding
commands, and the command that resumes an interrupted run."""

from __future__ import annotations

import json
from pathlib import Path

from attnx.checkpoint import read_checkpoint
from attnx.commands.lightning_argv import checkpoint_override, resolve_configs, resume_command
from tests.conftest import REPO


def test_a_packaged_config_name_becomes_its_path_and_a_file_stays(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("trainer: {}\n")
    argv = resolve_configs(["fit", "--config", "tiny", "--config=mine.yaml", "--trainer.max_steps", "3"])
    assert Path(argv[2]).read_bytes() == (REPO / "configs" / "tiny.yaml").read_bytes()
    assert argv[3] == "--config=mine.yaml" and argv[4:] == ["--trainer.max_steps", "3"]


def test_a_decoding_command_takes_the_model_of_its_checkpoint(checkpoint: Path) -> None:
    argv = ["test", "--config", "tiny", "--ckpt_path", str(checkpoint)]
    *same, option, value = checkpoint_override(argv)
    transformer = dict(read_checkpoint(checkpoint)["attnx"]["transformer"])
    del transformer["vocab_size"]  # linked from the data
    assert same == argv and option == "--model.transformer" and json.loads(value) == transformer
    for keyword in ("last", "best", "null"):  # resolved later, or by Lightning
        assert checkpoint_override(["test", f"--ckpt_path={keyword}"]) == ["test", f"--ckpt_path={keyword}"]


def test_the_resume_hint_of_a_fine_tuning_run_drops_init_from() -> None:
    """Resuming a run started with --init_from continues it: the hint must not be the refused pair."""
    argv = ["fit", "--config", "tiny", "--init_from", "base.ckpt", "--trainer.max_steps", "5"]
    assert resume_command(argv, Path("runs/tiny/version_0/checkpoints/last.ckpt")) == (
        "attnx fit --config tiny --trainer.max_steps 5 --ckpt_path runs/tiny/version_0/checkpoints/last.ckpt"
    )


def test_a_missing_checkpoint_is_left_for_the_command_to_name(tmp_path: Path) -> None:
    """The model override read the checkpoint first, and its one line could not name the config's runs."""
    argv = ["test", "--config", "tiny", "--ckpt_path", str(tmp_path / "averaged.ckpt")]
    assert checkpoint_override(argv) == argv
