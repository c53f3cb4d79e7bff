"""Whether this machine has the GPUs a config trains or decodes on: if not, one sentence with the overrides
that run the config here, on the GPUs it has (or, without any, on the CPU), with the config's tokens a step."""

from __future__ import annotations

from typing import Any

import torch

from attnx.errors import ConfigError

GPU_ACCELERATORS = ("gpu", "cuda")


def _requested_devices(devices: Any) -> int:
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str):
        if devices in ("auto", "-1"):
            return 1
        return len(devices.split(",")) if "," in devices else int(devices)
    return 1 if devices in (None, -1) else int(devices)


def _count(value: Any, default: int = 1) -> int:
    """A count from the config (`accumulate_grad_batches`), its default where unset."""
    return default if value is None else int(value)


def check_devices(trainer: dict[str, Any], available: int | None = None) -> None:
    """Fail in one sentence when the config asks for more GPUs than this machine has: the overrides that run
    it on the GPUs there are (the most that divide the config's, each batch accumulated over the missing
    ones) or, with none, on the CPU."""
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator not in GPU_ACCELERATORS:
        return
    wanted = _requested_devices(trainer.get("devices", "auto"))
    available = torch.cuda.device_count() if available is None else available
    if available >= wanted:
        return
    asked = (
        f"this config trains on {wanted} GPU{'s' * (wanted > 1)} (trainer.accelerator {accelerator}, "
        f"trainer.devices {trainer.get('devices')}) but this machine has {available}"
    )
    if available == 0:
        raise ConfigError(
            f"{asked}; to run it here add `--trainer.accelerator cpu --trainer.devices 1 --trainer.strategy auto "
            f"--trainer.precision 32-true` (and multiply --trainer.accumulate_grad_batches by {wanted} to keep "
            "the tokens per step)"
        )
    options, devices, factor = _on_gpus(trainer, wanted, available)
    if available == 1:
        where = "this GPU"
    else:
        where = f"its {available} GPUs" if devices == available else f"{devices} of its {available} GPUs"
    raise ConfigError(
        f"{asked}; to run it on {where} add `{options}` (the same "
        f"tokens per step, each GPU's gradients accumulated over {factor} batches; once running, attnx fit "
        "suggests the larger batches that fit its memory)"
    )


def _on_gpus(trainer: dict[str, Any], wanted: int, available: int) -> tuple[str, int, int]:
    """The overrides that train on `available` GPUs (the most that divide `wanted`) with the tokens a step of
    `wanted`: the batches of the missing devices accumulated, validation as often (it counts batches); with
    the devices they use and the factor the accumulation grew by."""
    devices = max(d for d in range(1, available + 1) if wanted % d == 0)
    factor = wanted // devices
    strategy = trainer.get("strategy", "auto")
    if devices == 1:
        strategy = "auto"  # one process: no DDP wrapper around the model
    options = [f"--trainer.devices {devices}"]
    if isinstance(strategy, str):
        options.append(f"--trainer.strategy {strategy}")
    options.append(
        f"--trainer.accumulate_grad_batches {_count(trainer.get('accumulate_grad_batches')) * factor}"
    )
    interval = trainer.get("val_check_interval")
    if isinstance(interval, int) and not isinstance(interval, bool):
        options.append(f"--trainer.val_check_interval {interval * factor}")
    return " ".join(options), devices, factor
