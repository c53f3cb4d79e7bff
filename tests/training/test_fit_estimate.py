"""fit's first lines: the estimate read off a trainer, a model and the data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from attnx.training.fit_estimate import fit_estimate_lines
from tests.conftest import tiny_config


def test_a_resumed_run_is_estimated_for_what_is_left_and_a_run_without_validation_says_so(
    corpus: Path,
) -> None:
    """Resumed at step 147 with 8 of its 30 minutes used (Lightning restores the timer only once training
    starts): the estimate is for the 22 minutes left. A run that ends before its first validation says so,
    with the option that changes it."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Timer

    from attnx.data.corpus import PreparedCorpus
    from attnx.model import build_transformer

    prepared = PreparedCorpus(corpus)
    config = tiny_config(vocab_size=prepared.vocab_size)
    module = SimpleNamespace(config=config, model=build_transformer(config))
    data = SimpleNamespace(corpus=prepared, train_split="train", max_tokens=512, eval_max_tokens=512)
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        precision="32-true",
        accumulate_grad_batches=1,
        max_steps=-1,
        callbacks=[Timer(duration="00:00:30:00")],
        val_check_interval=10**9,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        limit_val_batches=1.0,
    )
    lines = fit_estimate_lines(trainer, module, data, resumed_step=147, trained_seconds=480)
    assert ", 0:22:00 for " in lines[1] and " steps after step 147 (max_time)" in lines[1]
    assert lines[2].startswith("one validation in this run, when trainer.max_time stops it after about ")
    assert "would come at batch 1,000,000,000; --trainer.val_check_interval" in lines[2]
    trainer.val_check_interval = 4
    assert len(fit_estimate_lines(trainer, module, data)) == 2


def test_under_lora_only_the_adapters_have_gradients_and_adam_moments(corpus: Path) -> None:
    """fit estimates before LoRA's callback puts the adapters on: they are counted as the model will have them
    (its frozen weights once, the adapters' gradients and Adam's moments alone)."""
    import copy
    from types import SimpleNamespace

    from attnx.data.corpus import PreparedCorpus
    from attnx.model import build_transformer
    from attnx.model.lora import adapter_targets, add_adapters
    from attnx.training.lora import LowRankAdapters

    prepared = PreparedCorpus(corpus)
    config = tiny_config(vocab_size=prepared.vocab_size)
    module = SimpleNamespace(config=config, model=build_transformer(config))
    data = SimpleNamespace(corpus=prepared, train_split="train", max_tokens=512, eval_max_tokens=512)
    lora = LowRankAdapters(rank=4, projections=["in_proj", "w2"], layers=["decoder_layers.*"])
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        precision="32-true",
        accumulate_grad_batches=1,
        max_steps=10,
        callbacks=[lora],
        val_check_interval=4,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    adapted = copy.deepcopy(module.model)
    add_adapters(adapted, adapter_targets(adapted, lora.projections, lora.layers), 4, 16.0)
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    total = sum(p.numel() for p in adapted.parameters())
    assert 0 < trainable < total / 10
    memory = fit_estimate_lines(trainer, module, data)[0]
    assert f"of the {trainable:,} trainable parameters of {total:,}" in memory
    assert lora.parameters(adapted) == (total, trainable)  # the same once the adapters are on
    trainer.callbacks = []
    assert "trainable" not in fit_estimate_lines(trainer, module, data)[0]


def estimate_of(steps: int, bounded_by: str = "max_time", step_seconds: float = 16.0, resumed_at: int = 0):
    """A run's estimate as `undertrained_line` reads it: the steps it makes, what ends it, a step's time."""
    from attnx.training.estimate import RunEstimate

    return RunEstimate(
        device="this CPU (2 threads)",
        precision="32-true",
        peak_flops=1e10,
        peak_source="measured now",
        mfu=0.65,
        parameters=1,
        activation_bytes=1,
        device_memory_gib=None,
        step_seconds=step_seconds,
        steps=steps,
        run_seconds=steps * step_seconds,
        bounded_by=bounded_by,
        resumed_at=resumed_at,
    )


def test_a_time_budget_under_half_the_steps_its_config_was_written_for_is_said_undertrained() -> None:
    """multi30k_cpu's 3,000 steps in 30 minutes, on a machine estimated at 16 s a step: 112 steps in them, and
    the options that train the 3,000 instead, in 3,000 x 16 s = 13:20:00. Half of them or more says nothing, nor
    does a run its max_steps ends."""
    from attnx.training.fit_estimate import RecipePace, undertrained_line

    pace = RecipePace(steps=3000, minutes=30)
    line = undertrained_line(pace, estimate_of(112), 1800.0)
    assert line == (
        "warning: the model will be undertrained: this config was written for about 3,000 steps in its 0:30:00 "
        "of trainer.max_time, and this machine is estimated to make 112 in that time; --trainer.max_steps 3000 "
        "--trainer.max_time null trains the 3,000 steps, in an estimated 13:20:00"
    )
    assert undertrained_line(pace, estimate_of(1499), 1800.0) is not None
    assert undertrained_line(pace, estimate_of(1500), 1800.0) is None  # half: trained enough to say nothing
    assert undertrained_line(pace, estimate_of(112, bounded_by="max_steps"), 1800.0) is None
    # an override's 5 minutes (backtranslation/finetune): the pace's 500 steps of them
    short = undertrained_line(pace, estimate_of(200, step_seconds=1.5), 300.0)
    assert (
        short is not None
        and "about 500 steps in its 0:05:00 of trainer.max_time (3,000 in 30 minutes)" in short
    )
    assert (
        "--trainer.max_steps 500 --trainer.max_time null trains the 500 steps, in an estimated 0:12:30"
        in short
    )
    # fewer steps asked for than the pace makes: those are the steps meant
    asked = undertrained_line(pace, estimate_of(112), 1800.0, max_steps=1000)
    assert asked is not None and "this run asks for 1,000 steps (trainer.max_steps)" in asked
    assert "make 112 in its 0:30:00 of trainer.max_time; --trainer.max_steps 1000 " in asked
    # resumed at step 1,000 with 400 steps left: 1,400 of 3,000; the 2,000 still to train take 8:53:20
    resumed = undertrained_line(pace, estimate_of(400, resumed_at=1000), 1800.0)
    assert resumed is not None and "make 1,400 in that time" in resumed and "estimated 8:53:20" in resumed


@pytest.mark.parametrize(
    ("steps", "minutes"), [(0, 30), (1.5, 30), (True, 30), (3000, 0), (3000, float("nan"))]
)
def test_a_pace_that_is_no_pace_is_refused_naming_it(steps, minutes) -> None:
    from attnx.errors import ConfigError
    from attnx.training.fit_estimate import RecipePace

    with pytest.raises(ConfigError, match=r"^RecipePace \(trainer.callbacks\): (steps|minutes) must be"):
        RecipePace(steps=steps, minutes=minutes)


def paced_tiny(tmp_path: Path, steps: int, minutes: float) -> Path:
    """An override of configs/tiny.yaml: a RecipePace as its callbacks, no validation in the run."""
    override = tmp_path / f"paced_{steps}.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "val_check_interval": 10**6,
                    "callbacks": [
                        {
                            "class_path": "attnx.training.fit_estimate.RecipePace",
                            "init_args": {"steps": steps, "minutes": minutes},
                        }
                    ],
                }
            }
        ),
        encoding="utf-8",
    )
    return override


def test_fit_says_when_its_time_budget_will_leave_the_model_undertrained(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`attnx fit` with 2 seconds of `max_time`: a config written for a billion steps a minute says so in its first
    lines, with the options that train them; one written for a step every 3 seconds (which any machine makes
    with this model) says nothing."""
    from attnx.cli import main as attnx
    from tests.training.conftest import fit_args

    monkeypatch.chdir(tmp_path)
    budget = ["--trainer.max_steps", "-1", "--trainer.max_time", "00:00:00:02"]
    assert attnx(fit_args(corpus, "--config", str(paced_tiny(tmp_path, 10**9, 1)), *budget)) == 0
    printed = capsys.readouterr().out
    warnings = [
        line for line in printed.splitlines() if line.startswith("warning: the model will be undertrained")
    ]
    assert len(warnings) == 1, printed
    assert (
        "about 33,333,333 steps in its 2.0 s of trainer.max_time (1,000,000,000 in 1 minute)" in warnings[0]
    )
    assert "--trainer.max_steps 33333333 --trainer.max_time null trains the 33,333,333 steps" in warnings[0]
    assert printed.index("estimated time: ") < printed.index(warnings[0])  # beside the time estimate
    assert attnx(fit_args(corpus, "--config", str(paced_tiny(tmp_path, 1, 0.05)), *budget)) == 0
    assert "undertrained" not in capsys.readouterr().out


def test_describe_says_it_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`attnx describe --device` reads the pace off the config's callbacks: the same line among its estimate."""
    from attnx.cli import main as attnx
    from tests.training.conftest import TINY

    paced = paced_tiny(tmp_path, 10**9, 30)
    timed = tmp_path / "timed.yaml"
    timed.write_text("trainer: {max_steps: -1, max_time: '00:00:30:00'}\n", encoding="utf-8")
    argv = [
        "describe",
        "--config",
        str(TINY),
        "--config",
        str(paced),
        "--config",
        str(timed),
        "--device",
        "h100",
    ]
    assert attnx(argv) == 0
    assert (
        "  warning: the model will be undertrained: this config was written for about 1,000,000,000 steps"
        in (capsys.readouterr().out)
    )
    assert attnx(argv[:5] + ["--device", "h100"]) == 0  # max_steps 8: the steps asked for are what it trains
    assert "undertrained" not in capsys.readouterr().out
