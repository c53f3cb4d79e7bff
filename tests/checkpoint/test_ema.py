"""What a checkpoint of a run with an EMA says about its weights, and what averaging keeps of it."""

from __future__ import annotations

from pathlib import Path

import torch

from attnx.checkpoint.ema import EMA_KEY, checkpoint_weights_line, weights_line, without_training_weights

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


def test_averaged_weights_drop_the_trained_ones_and_keep_the_marker() -> None:
    averaged = without_training_weights({"state_dict": {}, EMA_KEY: STATE, "averaged_from": ["a", "b"]})
    assert averaged[EMA_KEY] == {"decay": 0.999, "every": 1, "start": 0, "updates": 12}
    assert "training" in STATE  # the input is left as it was
    assert "(averaged over checkpoints)" in weights_line(averaged, "avg.ckpt", "translate")
    plain = {"state_dict": {}}
    assert without_training_weights(plain) is plain
