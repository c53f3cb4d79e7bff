"""A config that asks for more GPUs than the machine has is one sentence with the overrides that run it here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from attnx.cli import main as attnx
from attnx.commands.devices import check_devices
from attnx.errors import ConfigError


@pytest.mark.parametrize("devices", [2, "2", "0,1", [0, 1]])
def test_enough_gpus_pass_in_every_spelling(devices) -> None:
    check_devices({"accelerator": "gpu", "devices": devices}, available=2)


def test_a_cpu_config_is_not_checked() -> None:
    check_devices({"accelerator": "cpu", "devices": 8}, available=0)
    check_devices({"devices": 8}, available=0)  # accelerator auto: Lightning picks what there is


def test_no_gpu_says_the_cpu_overrides_and_the_accumulation() -> None:
    with pytest.raises(ConfigError) as raised:
        check_devices({"accelerator": "cuda", "devices": "0,1,2,3"}, available=0)
    message = str(raised.value)
    assert (
        message.startswith("this config trains on 4 GPUs (trainer.accelerator cuda") and "has 0;" in message
    )
    assert "--trainer.accelerator cpu --trainer.devices 1" in message
    assert "multiply --trainer.accumulate_grad_batches by 4" in message
    assert raised.value.exit_code == 2


CONFIG = Path(__file__).resolve().parents[2] / "configs" / "big.yaml"


def fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("gpus", "advice"),
    [
        (
            0,
            "to run it here add `--trainer.accelerator cpu --trainer.devices 1 --trainer.strategy auto "
            "--trainer.precision 32-true` (and multiply --trainer.accumulate_grad_batches by 8",
        ),
        (
            1,
            "to run it on this GPU add `--trainer.devices 1 --trainer.strategy auto "
            "--trainer.accumulate_grad_batches 8 --trainer.val_check_interval 40000` (the same tokens per step",
        ),
        (
            4,
            "to run it on its 4 GPUs add `--trainer.devices 4 --trainer.strategy ddp "
            "--trainer.accumulate_grad_batches 2 --trainer.val_check_interval 10000` (the same tokens per step",
        ),
        (
            3,
            "to run it on 2 of its 3 GPUs add `--trainer.devices 2 --trainer.strategy ddp "
            "--trainer.accumulate_grad_batches 4 --trainer.val_check_interval 20000`",
        ),
    ],
)
def test_the_paper_s_config_on_fewer_gpus_gets_the_gpu_s_advice(monkeypatch, gpus, advice) -> None:
    """configs/big.yaml as written (8 GPUs x 3,125 tokens): a GPU machine is told how to train on its GPUs
    with the same 25,000 tokens a step, a machine without one how to train on the CPU."""
    fake_gpus(monkeypatch, gpus)
    trainer = yaml.safe_load(CONFIG.read_text())["trainer"]
    with pytest.raises(ConfigError) as raised:
        check_devices(trainer)
    assert (
        f"this config trains on 8 GPUs (trainer.accelerator gpu, trainer.devices 8) but this machine has {gpus}; "
        in str(raised.value)
    )
    assert advice in str(raised.value)


def test_the_advice_parses_and_passes_the_check(corpus: Path, monkeypatch, capsys) -> None:
    """The options `attnx fit --config configs/big.yaml` prints on a one-GPU machine are valid for its parser,
    and the config with them trains on that GPU with 8 x 3,125 tokens a step."""
    fake_gpus(monkeypatch, 1)
    argv = ["fit", "--config", str(CONFIG), "--data.data_dir", str(corpus)]
    assert attnx(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    options = re.search(r"add `([^`]*)`", line)[1].split()
    with pytest.raises(SystemExit) as printed:
        attnx([*argv, *options, "--print_config"])
    assert printed.value.code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    check_devices(config["trainer"])  # one GPU: enough now
    assert config["trainer"]["accumulate_grad_batches"] * config["data"]["max_tokens"] == 25_000
