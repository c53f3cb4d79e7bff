"""Checkpoint writing survives kills; checkpoints of another model are refused with the difference named."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnx.checkpoint import CheckpointError
from attnx.training.checkpointing import AtomicCheckpointIO, PeriodicCheckpoint
from attnx.training.module import TranslationTask
from tests.conftest import tiny_config

WRITER = """
import sys, torch
from attnx.training.checkpointing import AtomicCheckpointIO, PeriodicCheckpoint
io, path, n = AtomicCheckpointIO(), sys.argv[1], 0
while True:
    n += 1
    io.save_checkpoint({"attnx": {"format_version": 1}, "state_dict": {"w": torch.full((4_000_000,), float(n))}}, path)
"""


def test_a_kill_during_saves_leaves_the_last_checkpoint_whole(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        deadline = (
            time.monotonic() + 600
        )  # a cold torch import on a loaded machine; waited out only on failure
        while not path.exists() and time.monotonic() < deadline:
            assert writer.poll() is None, f"the writer exited with {writer.returncode}"
            time.sleep(0.05)
        assert path.exists(), "the writer saved nothing in 600 s"
        time.sleep(
            0.3
        )  # later saves under way (how many does not matter: whichever is cut, last.ckpt is whole)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    state = AtomicCheckpointIO().load_checkpoint(path)["state_dict"]["w"]
    assert state.shape == (4_000_000,) and torch.all(state == state[0])


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("disk full")


def test_a_failed_save_keeps_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"attnx": {"format_version": 1}, "state_dict": {"w": torch.ones(3)}}, path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(10_000)}, "bad": Unpicklable()}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_loading_a_truncated_checkpoint_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "step=3.ckpt"
    path.write_bytes(b"PK\x03\x04 not a whole zip")
    with pytest.raises(CheckpointError, match=r"step=3\.ckpt cannot be read.*truncated"):
        AtomicCheckpointIO().load_checkpoint(path)


def test_checkpoint_of_another_model_is_refused_with_the_difference() -> None:
    ours = TranslationTask(tiny_config(vocab_size=300))
    theirs = tiny_config(vocab_size=300, d_ff=128).to_dict()
    with pytest.raises(CheckpointError, match="d_ff: checkpoint 128 vs config 64"):
        ours.on_load_checkpoint({"attnx": {"transformer": theirs}, "state_dict": {}})


@pytest.mark.parametrize(("ran", "due"), [(9 * 60, False), (10 * 60 + 1, True)])
def test_a_resumed_run_goes_on_counting_the_minutes_to_its_next_save(ran: float, due: bool) -> None:
    """A stop between two 10-minute saves records how long it had run since the last one; the resumed run saves
    when the 10 minutes are up, as the run that was never stopped would, not 10 minutes after the restart."""
    resumed = PeriodicCheckpoint(minutes=10)
    resumed.load_state_dict({"saved": [], "dirpath": None, "seconds_since_save": ran})
    resumed.start_clock(7)
    assert resumed._due(SimpleNamespace(global_step=8, is_global_zero=True)) is due


def test_a_run_stopped_at_its_last_step_and_resumed_keeps_that_steps_checkpoint(tmp_path: Path) -> None:
    """The stop's save wrote `last.ckpt` alone at step 3, the final one; resumed there, training ends at once,
    and the end's save adds `step=3.ckpt` to the kept (averaged) set, as in the run that was never stopped."""
    trainer = SimpleNamespace(
        global_step=3,
        is_global_zero=True,
        save_checkpoint=lambda path, weights_only: Path(path).write_bytes(b"weights"),
        strategy=SimpleNamespace(barrier=lambda name: None),
    )
    resumed = PeriodicCheckpoint(minutes=60, dirpath=str(tmp_path))
    resumed.load_state_dict({"saved": [], "dirpath": str(tmp_path), "seconds_since_save": 5.0})
    resumed.start_clock(3)
    resumed.on_train_end(trainer, None)
    assert resumed.saved == [str(tmp_path / "step=3.ckpt")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step=3.ckpt"]


def test_test_decodes_a_checkpoint_of_weights_only(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint written by attnx.checkpoint.save_model (a model built outside Lightning) records no Lightning
    version; `attnx test --ckpt_path` of one ended in Lightning's KeyError: 'pytorch-lightning_version'."""
    from attnx.cli import main as attnx
    from tests.checkpoints import tiny_checkpoint
    from tests.training.conftest import fit_args

    checkpoint = tiny_checkpoint(corpus, tmp_path / "weights.ckpt")
    assert "pytorch-lightning_version" not in torch.load(checkpoint, weights_only=True)
    monkeypatch.chdir(tmp_path)
    extra = ("--evaluation.search.max_len_b", "2", "--evaluation.search.beam", "1")
    assert attnx(fit_args(corpus, "--ckpt_path", str(checkpoint), *extra, subcommand="test")) == 0
    assert "translations written to" in capsys.readouterr().out


def test_a_short_run_s_average_is_one_calm_line_not_a_warning(tmp_path: Path, monkeypatch, recwarn) -> None:
    """A run that kept fewer checkpoints than `last` (a smoke test, the quickstart) averages those: nothing is
    wrong, so one line says what went in, and no warning."""
    from attnx.training import checkpointing

    monkeypatch.setattr(checkpointing, "average_checkpoints", lambda paths: {"averaged": list(paths)})
    monkeypatch.setattr(checkpointing, "atomic_save", lambda value, path: Path(path).write_text(str(value)))
    periodic = PeriodicCheckpoint.__new__(PeriodicCheckpoint)
    trainer = SimpleNamespace(
        callbacks=[periodic], is_global_zero=True, strategy=SimpleNamespace(barrier=lambda name: None)
    )
    lines: list[str] = []  # what it says, whatever logging handlers earlier tests left on Lightning's loggers
    monkeypatch.setattr(checkpointing, "rank_zero_info", lines.append)
    for saved in (["step=2.ckpt"], ["step=2.ckpt", "step=4.ckpt"], [f"step={i}.ckpt" for i in range(6)]):
        periodic.saved = [str(tmp_path / name) for name in saved]
        checkpointing.AverageCheckpoints(last=5).on_fit_end(trainer, None)
    assert lines == [
        f"{tmp_path / 'averaged.ckpt'} holds the weights of the run's one checkpoint, step=2.ckpt (nothing to average)",
        f"averaged 2 checkpoints (all the run kept; 5 in a longer run) into {tmp_path / 'averaged.ckpt'}",
        f"averaged 5 checkpoints into {tmp_path / 'averaged.ckpt'}",
    ]
    assert not [w for w in recwarn if "AverageCheckpoints" in str(w.message)]
