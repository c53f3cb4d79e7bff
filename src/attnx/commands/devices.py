"""Whether this machine has the GPUs a config trains or decodes on: if not, one sentence with the overrides
that run the config here."""

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


def check_devices(trainer: dict[str, Any], available: int | None = None) -> None:
    """Fail in one sentence when the config asks for more GPUs than this machine has."""
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator not in GPU_ACCELERATORS:
        return
    wanted = _requested_devices(trainer.get("devices", "auto"))
    available = torch.cuda.device_count() if available is None else available
    if available >= wanted:
        return
    raise ConfigError(
        f"this config trains on {wanted} GPU{'s' * (wanted > 1)} (trainer.accelerator {accelerator}, "
        f"trainer.devices {trainer.get('devices')}) but this machine has {available}; to run it here add "
        "`--trainer.accelerator cpu --trainer.devices 1 --trainer.strategy auto --trainer.precision 32-true` "
        f"(and multiply --trainer.accumulate_grad_batches by {wanted} to keep the tokens per step)"
    )
