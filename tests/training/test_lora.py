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


def test_a_resume_asking_for_other_projections_than_the_checkpoint_s_is_one_line(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    """It was `KeyError: 'model.encoder_layers.0.ffn.w1.weight'`; a LoRA run from --init_from, and its resume as
    it was trained, say no warning."""
    start = fit(corpus, tmp_path, "start", "--trainer.max_steps", "1") / "checkpoints" / "last.ckpt"
    adapters = ("--lora.rank", "2", "--lora.projections", "[in_proj]", "--lora.layers", "[encoder_layers.*]")
    first = fit(corpus, tmp_path, "first", "--trainer.max_steps", "1", "--init_from", str(start), *adapters)
    assert "warning" not in capsys.readouterr().err
    ckpt = str(first / "checkpoints" / "last.ckpt")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path / "first")
        more = fit_args(
            corpus, "--trainer.max_steps", "2", "--ckpt_path", ckpt, *adapters, "--lora.projections+", "w1"
        )
        assert attnx(more) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert (
        f"--ckpt_path {ckpt}: its adapters are on in_proj of encoder_layers.0, encoder_layers.1 (2 projections), "
        "this run asks for in_proj, w1 of encoder_layers.0, encoder_layers.1 (4 projections): resume with the "
        "run's lora.projections and lora.layers, or start a new LoRA run from its merged weights with --init_from"
    ) in err[0]


def test_adapters_over_a_random_model_warn_in_one_line_and_a_rank_too_large_is_refused(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    """`--lora.rank` without `--init_from` trained adapters over a frozen random model without a word (the memory
    benchmark's LoRA arm does so knowingly); a rank of 10**9 was an allocation traceback."""
    fit(corpus, tmp_path, "random", "--trainer.max_steps", "1", "--lora.rank", "2")
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert err == [
        "attnx fit: warning: lora.rank 2 without --init_from: the adapters train over a frozen, randomly "
        "initialised model; pass --init_from CHECKPOINT to fine-tune trained weights"
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path / "random")
        assert attnx(fit_args(corpus, "--trainer.max_steps", "1", "--lora.rank", str(10**9))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"attnx fit: error: lora.rank {10**9} exceeds the smaller side of projection "
        "encoder_layers.0.self_attn.in_proj (96 x 32): a rank is at most min(in, out) features, here 32"
    ]
