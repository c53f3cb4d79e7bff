"""What a checkpoint of a run with an EMA says about its weights, and what averaging keeps of it; a file that is
no checkpoint is left to the command's reader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnx.checkpoint.ema import EMA_KEY, checkpoint_weights_line, weights_line, without_training_weights
from attnx.cli import main as attnx
from tests.checkpoint.test_format import unreadable_files
from tests.checkpoints import tiny_checkpoint
from tests.conftest import free_port

STATE = {"decay": 0.999, "every": 1, "start": 0, "updates": 12, "training": {"w": torch.ones(2)}}


def test_a_checkpoint_with_an_ema_says_so_in_one_line(tmp_path: Path) -> None:
    with_ema, plain = tmp_path / "ema.ckpt", tmp_path / "plain.ckpt"
    torch.save({"state_dict": {"model.w": torch.zeros(2)}, EMA_KEY: STATE}, with_ema)
    torch.save({"state_dict": {"model.w": torch.zeros(2)}}, plain)
    assert weights_line({EMA_KEY: STATE}, "a.ckpt", "test") == (
        "attnx test: the EMA weights of a.ckpt (decay 0.999, 12 updates)"
    )
    assert checkpoint_weights_line(str(plain), "translate") is None
    assert checkpoint_weights_line(tmp_path, "translate") is None  # an exported model's folder
    line = checkpoint_weights_line([plain, with_ema], "translate")
    assert line == f"attnx translate: the EMA weights of {with_ema} (decay 0.999, 12 updates)"


def test_a_checkpoint_read_whole_says_its_line_without_being_read_again(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read_checkpoint` keeps what the line needs (a command reads its model, then says which weights it
    holds: one read of a training checkpoint, not two); a file written since is read again."""
    from attnx.checkpoint import read_checkpoint

    path = tmp_path / "ema.ckpt"
    written = torch.load(tiny_checkpoint(corpus, tmp_path / "plain.ckpt"), weights_only=True)
    torch.save({**written, EMA_KEY: STATE, "averaged_from": ["a", "b"]}, path)
    read_checkpoint(path)
    monkeypatch.setattr(torch, "load", lambda *a, **kw: pytest.fail("read again"))
    assert checkpoint_weights_line(path, "translate") == (
        f"attnx translate: the EMA weights of {path} (averaged over checkpoints) (decay 0.999, 12 updates)"
    )
    monkeypatch.undo()
    torch.save({**written, EMA_KEY: {**STATE, "updates": 13}}, path)  # another file under the same name
    assert checkpoint_weights_line(path, "translate") == (
        f"attnx translate: the EMA weights of {path} (decay 0.999, 13 updates)"
    )


def test_averaged_weights_drop_the_trained_ones_and_keep_the_marker() -> None:
    averaged = without_training_weights({"state_dict": {}, EMA_KEY: STATE, "averaged_from": ["a", "b"]})
    assert averaged[EMA_KEY] == {"decay": 0.999, "every": 1, "start": 0, "updates": 12}
    assert "training" in STATE  # the input is left as it was
    assert "(averaged over checkpoints)" in weights_line(averaged, "avg.ckpt", "translate")
    plain = {"state_dict": {}}
    assert without_training_weights(plain) is plain


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["export", "--format", "ctranslate2", "--output", "{out}/ct2", "--ckpt_path"], "ctranslate2"),
        (["export", "--format", "huggingface", "--output", "{out}/hf", "--ckpt_path"], "transformers"),
        (["serve", "--port", "{port}", "--model"], "litserve"),
    ],
    ids=["export ctranslate2", "export huggingface", "serve"],
)
def test_a_checkpoint_carrying_a_payload_is_the_readers_one_line_and_never_runs(
    argv: list[str], extra: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The EMA line maps the file before the command's reader reads it: a pickle payload is refused by the
    reader in its own line (exit 1), never an `UnpicklingError` traceback, and never runs."""
    pytest.importorskip(extra)
    payload = unreadable_files(tmp_path / "bad")["payload"]
    command = [a.format(out=tmp_path, port=free_port()) for a in argv]
    assert attnx([*command, str(payload)]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "EMA" not in out, err
    assert lines[0].startswith(f"attnx {argv[0]}: error: checkpoint {payload} holds Python objects"), lines
    assert "weights_only" not in lines[0]
    assert not (tmp_path / "bad" / "ran").exists()
