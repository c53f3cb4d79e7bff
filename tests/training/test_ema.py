"""The EMA of the weights (`--ema.decay`): the update rule, validation and test on it, checkpoints that hold it,
an exact resume, and a decay outside (0, 1) refused in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from attnx.checkpoint import average_checkpoints, read_checkpoint
from attnx.checkpoint.ema import EMA_KEY
from attnx.cli import main as attnx
from attnx.errors import ConfigError
from attnx.training.ema import WeightEMA
from tests.training.conftest import fit_args, read_metrics
from tests.training.test_resume import fit


def fake_trainer(step: int = 0, fn: str = "fit", **plan) -> SimpleNamespace:
    """A trainer at optimizer step `step`; `plan`: its max_steps, max_epochs and callbacks (default: none)."""
    plan = {"max_steps": -1, "max_epochs": -1, "callbacks": [], "is_global_zero": False} | plan
    return SimpleNamespace(global_step=step, state=SimpleNamespace(fn=fn), ckpt_path=None, **plan)


def test_the_average_follows_the_rule_from_start_every_n_steps() -> None:
    module = nn.Linear(2, 1, bias=False)
    ema = WeightEMA(decay=0.5, every=2, start=1)
    trainer = fake_trainer()
    ema.on_fit_start(trainer, module)
    expected = module.weight.detach().clone()
    for step, value in enumerate([1.0, 3.0, 5.0, 7.0, 9.0, 11.0], start=1):
        with torch.no_grad():
            module.weight.fill_(value)
        trainer.global_step = step
        ema.on_train_batch_end(trainer, module, None, None, 0)
        ema.on_train_batch_end(trainer, module, None, None, 1)  # the same step's next micro-batch: no update
        if step <= 1:
            expected = torch.full_like(expected, value)  # before `start`: a copy
        elif (step - 1) % 2 == 0:
            expected = 0.5 * expected + 0.5 * value
    # steps 1 (copy: 1), 3 (0.5·1 + 0.5·5 = 3) and 5 (0.5·3 + 0.5·9 = 6)
    assert torch.equal(expected, torch.full((1, 2), 6.0))
    assert torch.equal(ema.ema_weights()["weight"], expected)
    assert ema.updates == 3
    assert torch.equal(module.weight, torch.full((1, 2), 11.0))  # the trained weights are left alone


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.1, 1.5])
def test_a_decay_outside_0_1_is_refused_naming_the_option(decay: float) -> None:
    with pytest.raises(ConfigError, match=r"^ema\.decay must be in \(0, 1\)"):
        WeightEMA(decay=decay)


def test_fit_refuses_a_decay_of_1_in_one_line(corpus: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert attnx(fit_args(corpus, "--ema.decay", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ema.decay must be in (0, 1)" in err[0], err


def averaged_over(ema: WeightEMA, trainer: SimpleNamespace, steps: int, after: int = 0) -> float:
    """The share of the average the starting weights (0) still hold after `steps` optimizer steps that set the
    weights to 1 from step `after` + 1 on."""
    module = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.zero_()
    ema.on_fit_start(trainer, module)
    for step in range(1, steps + 1):
        with torch.no_grad():
            module.weight.fill_(float(step > after))
        trainer.global_step = step
        ema.on_train_batch_end(trainer, module, None, None, 0)
    return 1.0 - float(ema.ema_weights()["weight"])


def test_a_run_too_short_for_its_decay_says_so_as_it_starts_with_a_decay_that_suits_it(capsys) -> None:
    """0.999 over 40 steps: 96% of the average is the initial weights (0.999^40), as the average itself shows."""
    trainer = fake_trainer(max_steps=40, is_global_zero=True)
    left = averaged_over(WeightEMA(decay=0.999), trainer, 40)
    assert left == pytest.approx(0.999**40)
    warning = capsys.readouterr().out.splitlines()[1]
    assert warning == (
        "ema: warning: 96% of the average will still be the initial weights at the end: this run's 40 optimizer "
        "steps (trainer.max_steps) make 40 updates at decay 0.999 (0.999^40); --ema.decay 0.89 suits 40 "
        "updates (leaves them 1%)"
    )
    assert averaged_over(WeightEMA(decay=0.89), fake_trainer(max_steps=40), 40) == pytest.approx(
        0.01, abs=0.002
    )
    # ema.start copies the weights for 30 steps; every 2nd step of the 10 after it averages: 5 updates
    trainer = fake_trainer(max_steps=40, is_global_zero=True)
    left = averaged_over(WeightEMA(decay=0.8, every=2, start=30), trainer, 40, after=30)
    assert "33% of the average will still be the weights of step 30 (ema.start)" in capsys.readouterr().out
    assert left == pytest.approx(0.8**5)  # the weights of step 29, the last copy, were those of step 30
    trainer = fake_trainer(max_steps=40, is_global_zero=True)
    WeightEMA(decay=0.9, start=40).on_fit_start(trainer, nn.Linear(1, 1))
    assert "this run's 40 optimizer steps (trainer.max_steps) end within ema.start 40: the average only " in (
        capsys.readouterr().out
    )


def test_a_run_long_enough_for_its_decay_says_nothing_of_it(capsys) -> None:
    for ema, steps in ((WeightEMA(decay=0.6), 8), (WeightEMA(decay=0.999), 3000)):
        trainer = fake_trainer(max_steps=steps, is_global_zero=True)
        ema.on_fit_start(trainer, nn.Linear(1, 1))
        trainer.global_step = steps
        ema.on_fit_end(trainer, nn.Linear(1, 1))
        assert "warning" not in capsys.readouterr().out


def test_a_run_that_stops_early_says_where_it_left_the_average(capsys) -> None:
    """max_time: the steps are known only when it stops; a plan of 10,000 steps stopped at 40 says so too."""
    from lightning.pytorch.callbacks import Timer

    for plan in ({"callbacks": [Timer(duration="00:00:10:00")]}, {"max_steps": 10_000}):
        trainer, ema = fake_trainer(is_global_zero=True, **plan), WeightEMA(decay=0.999)
        assert averaged_over(ema, trainer, 40) == pytest.approx(0.999**40)
        assert "warning" not in capsys.readouterr().out  # nothing said as it starts
        ema.on_fit_end(trainer, nn.Linear(1, 1))
        assert capsys.readouterr().out.splitlines()[-1] == (
            "ema: warning: 96% of the average is still the initial weights: training stopped at step 40, after 40 "
            "updates at decay 0.999 (0.999^40); --ema.decay 0.89 suits 40 updates (leaves them 1%); "
            "--ema.evaluate training scores the checkpoints' trained weights"
        )


def test_a_run_planned_by_epochs_counts_the_steps_of_its_epochs(capsys) -> None:
    trainer = fake_trainer(max_epochs=2, estimated_stepping_batches=30, is_global_zero=True)
    WeightEMA(decay=0.99).on_fit_start(trainer, nn.Linear(1, 1))
    assert "this run's 30 optimizer steps (trainer.max_epochs) make 30 updates" in capsys.readouterr().out


EMA = ("--ema.decay", "0.6")  # far from 1: after a few steps the average differs clearly from the weights


def run_validations(run: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["val/loss"]) for r in read_metrics(run) if r.get("val/loss")}


def test_resumed_ema_run_repeats_the_uninterrupted_one(corpus: Path, tmp_path: Path) -> None:
    whole = fit(corpus, tmp_path, "whole", "--trainer.max_steps", "8", *EMA)
    first = fit(corpus, tmp_path, "first", "--trainer.max_steps", "4", *EMA)
    rest = fit(
        corpus,
        tmp_path,
        "rest",
        "--trainer.max_steps",
        "8",
        "--ckpt_path",
        str(first / "checkpoints" / "last.ckpt"),
        *EMA,
    )
    expected, resumed = (read_checkpoint(r / "checkpoints" / "last.ckpt") for r in (whole, rest))
    assert expected[EMA_KEY]["updates"] == resumed[EMA_KEY]["updates"] == 8
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=1e-6, atol=1e-6, msg=key)
    for key, value in expected[EMA_KEY]["training"].items():
        torch.testing.assert_close(resumed[EMA_KEY]["training"][key], value, rtol=1e-6, atol=1e-6, msg=key)
    # the checkpoint's model weights are the average, not the trained weights
    trained = expected[EMA_KEY]["training"]
    assert any(not torch.equal(expected["state_dict"][k], trained[k]) for k in trained)
    validations = run_validations(whole)
    for step, loss in run_validations(rest).items():
        assert loss == pytest.approx(validations[step], rel=1e-6), step

    # averaged.ckpt averages the EMA weights and carries no trained weights
    averaged = read_checkpoint(whole / "checkpoints" / "averaged.ckpt")
    assert "training" not in averaged[EMA_KEY] and averaged[EMA_KEY]["decay"] == 0.6
    again = average_checkpoints([whole.parents[2] / p for p in averaged["averaged_from"]])  # fit's cwd
    for key, value in again["state_dict"].items():
        torch.testing.assert_close(averaged["state_dict"][key], value)


def validate_loss(corpus: Path, cwd: Path, ckpt: Path, capsys, *extra: str) -> tuple[float, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        capsys.readouterr()
        args = fit_args(corpus, "--ckpt_path", str(ckpt), "--evaluation.bleu_samples", "0", *extra)
        assert attnx(["validate", *args[1:]]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "val/loss" in line)
    return float(line.replace("│", " ").split()[-1]), out


def test_validation_and_validate_score_the_ema_weights_unless_asked(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    run = fit(corpus, tmp_path, "run", "--trainer.max_steps", "8", *EMA)
    fit_loss = run_validations(run)[5]  # the validation after step 6, in fit
    ckpt = run / "checkpoints" / "step=6.ckpt"
    ema_loss, out = validate_loss(corpus, tmp_path, ckpt, capsys)
    assert f"attnx validate: the EMA weights of {ckpt} (decay 0.6, 6 updates" in out
    trained_loss, out = validate_loss(corpus, tmp_path, ckpt, capsys, "--ema.evaluate", "training")
    assert f"attnx validate: the trained weights of {ckpt}" in out
    assert ema_loss == pytest.approx(fit_loss, rel=1e-5)
    assert abs(trained_loss - ema_loss) > 1e-3

    source = tmp_path / "source.txt"
    source.write_text("A man rides a bike.\n", encoding="utf-8")
    translated = tmp_path / "out.txt"
    argv = ["translate", "--model", str(ckpt), "--input", str(source), "--output", str(translated)]
    assert attnx([*argv, "--search.beam", "1", "--search.max_len_b", "5"]) == 0
    assert f"attnx translate: the EMA weights of {ckpt} (decay 0.6, 6 updates)" in capsys.readouterr().err

    output = tmp_path / "avg.ckpt"
    assert attnx(["average", "--checkpoints", f"[{ckpt}]", "--output", str(output)]) == 0
    assert f"attnx average: the EMA weights of {ckpt} (decay 0.6, 6 updates)" in capsys.readouterr().out
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        args = ["validate", *fit_args(corpus, "--ckpt_path", str(output), "--ema.evaluate", "training")[1:]]
        assert attnx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds only EMA weights" in err[0], err
