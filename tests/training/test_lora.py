"""`--lora.rank`: a run from `--init_from` trains its adapters only, writes merged weights every reader takes,
resumes exactly, and a LoRA checkpoint resumed without LoRA is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnx.checkpoint import average_checkpoints, load_model, read_checkpoint
from attnx.cli import main as attnx
from attnx.training.lora import LORA_KEY
from tests.training.conftest import fit_args
from tests.training.test_resume import fit

LORA = ("--lora.rank", "2", "--lora.layers", "[decoder_layers.*]")


def test_adapters_train_alone_merge_and_resume_exactly(corpus: Path, tmp_path: Path, capsys) -> None:
    start = fit(corpus, tmp_path, "start", "--trainer.max_steps", "2") / "checkpoints" / "last.ckpt"
    init = ("--init_from", str(start))
    whole = fit(corpus, tmp_path, "whole", "--trainer.max_steps", "6", *init, *LORA)
    first = fit(corpus, tmp_path, "first", "--trainer.max_steps", "3", *init, *LORA)
    rest = fit(
        corpus,
        tmp_path,
        "rest",
        "--trainer.max_steps",
        "6",
        "--ckpt_path",
        str(first / "checkpoints" / "last.ckpt"),
        *LORA,
    )
    assert "lora: rank 2, alpha 16 on 8 projections" in capsys.readouterr().out
    base, tuned, resumed = (
        read_checkpoint(p)
        for p in (start, whole / "checkpoints" / "last.ckpt", rest / "checkpoints" / "last.ckpt")
    )
    assert tuned["state_dict"].keys() == base["state_dict"].keys()  # merged: the plain model's weights
    adapted = set(tuned[LORA_KEY]["base"])
    assert adapted and all(k.startswith("model.decoder_layers.") for k in adapted)
    for key, value in base["state_dict"].items():
        if key in adapted:
            assert not torch.equal(tuned["state_dict"][key], value), key  # the adapter moved it
            assert torch.equal(tuned[LORA_KEY]["base"][key], value), key  # over the frozen weight
        else:
            assert torch.equal(tuned["state_dict"][key], value), key  # frozen
    for key, value in tuned["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=1e-6, atol=1e-6, msg=key)
    # decoded, averaged and resumed-without-adapters like any checkpoint
    load_model(whole / "checkpoints" / "last.ckpt")
    averaged = average_checkpoints(
        [whole / "checkpoints" / "step=5.ckpt", whole / "checkpoints" / "step=6.ckpt"]
    )
    assert LORA_KEY not in averaged and averaged["state_dict"].keys() == base["state_dict"].keys()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path / "rest")
        ckpt = str(rest / "checkpoints" / "last.ckpt")
        assert attnx(fit_args(corpus, "--trainer.max_steps", "8", "--ckpt_path", ckpt)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is of a LoRA run (rank 2)" in err[0], err
