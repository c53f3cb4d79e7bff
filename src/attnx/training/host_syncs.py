"""Logging without making the host wait for the GPU.

Two things Lightning does with a logged value wait until the GPU has run everything queued:

- `self.log(name, 0.5)` turns a Python number into a tensor on the module's device: a copy to the device,
  which waits;
- a value logged with `prog_bar=True` is read back (`.item()`) at the end of every batch while it is kept,
  to refresh the progress bar's numbers, whether a bar is shown or not: a tensor computed on the GPU waits.

So training logs its numbers once per optimizer step, as tensors on the host ([log_host][]): neither copy
happens, and the progress bar reads host memory.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch


def log_host(module: pl.LightningModule, name: str, value: float, **kwargs: Any) -> None:
    """`module.log(name, value, **kwargs)` with `value` kept on the host (a CPU tensor), never copied to the
    device."""
    module.log(name, torch.tensor(float(value)), **kwargs)
