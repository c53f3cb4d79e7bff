"""A config that asks for more GPUs than the machine has is one sentence with the overrides that run it here."""

from __future__ import annotations

import pytest

from attnx.commands.devices import check_devices
from attnx.errors import ConfigError


@pytest.mark.parametrize("devices", [2, "2", "0,1", [0, 1]])
def test_enough_gpus_pass_in_every_spelling(devices) -> None:
    check_devices({"accelerator": "gpu", "devices": devices}, available=2)


def test_a_cpu_config_is_not_checked() -> None:
    check_devices({"accelerator": "cpu", "devices": 8}, available=0)
    check_devices({"devices": 8}, available=0)  # accelerator auto: Lightning picks what there is


def test_too_few_gpus_say_the_overrides_and_the_accumulation() -> None:
    with pytest.raises(ConfigError) as raised:
        check_devices({"accelerator": "cuda", "devices": "0,1,2,3"}, available=1)
    message = str(raised.value)
    assert (
        message.startswith("this config trains on 4 GPUs (trainer.accelerator cuda") and "has 1;" in message
    )
    assert "--trainer.accelerator cpu --trainer.devices 1" in message
    assert "multiply --trainer.accumulate_grad_batches by 4" in message
    assert raised.value.exit_code == 2
