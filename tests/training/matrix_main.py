"""The feature matrix's two pieces that run inside `attnx fit` (tests/training/test_feature_matrix.py):

- `python -m tests.training.matrix_main fit ...` is `attnx fit` with captured steps through the replaying CPU
  backend (tests/training/test_capture.py's `FakeGraphs`); DDP launches its ranks as this module again.
- [`HeldTensors`][], a callback (`--trainer.callbacks+=tests.training.matrix_main.HeldTensors`), writes
  down after the first optimizer step every tensor the module, the optimizer and each callback hold that is not
  on the module's device or in its dtype, into `held_tensors.rank{N}.json` of the working folder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from attnx.cli import main
from attnx.training import captured_steps
from tests.training.test_capture import FakeGraphs

SIXTEEN_BITS = (torch.bfloat16, torch.float16)


def held(value: Any, where: str, seen: set[int], depth: int = 0):
    """`(where, tensor)` of every tensor inside `value`: its attributes, dicts, lists and tuples, a few levels
    down (modules, the trainer and the module's own objects are the module's, checked apart)."""
    if id(value) in seen or depth > 4:
        return
    seen.add(id(value))
    if isinstance(value, Tensor):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from held(item, f"{where}[{key!r}]", seen, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from held(item, f"{where}[{i}]", seen, depth + 1)
    elif isinstance(value, (nn.Module, pl.Trainer, torch.optim.Optimizer)):
        return
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for key, item in vars(value).items():
            yield from held(item, f"{where}.{key}", seen, depth + 1)


class HeldTensors(Callback):
    """Where the tensors of a run live once the strategy has set the module up (see the module's docstring).

    A float tensor must be on the module's device in its parameters' dtype; a callback may keep fp32 beside
    16-bit weights (an average of them would round its updates away); an integer or boolean tensor, and a
    0-dimensional counter of the optimizer, only needs the device."""

    def __init__(self) -> None:
        self.done = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.done:
            return
        self.done = True
        device = trainer.strategy.root_device
        dtype = next(p.dtype for p in pl_module.parameters() if p.is_floating_point())
        seen: set[int] = set()
        found = [(f"module.{n}", t, False) for n, t in pl_module.named_parameters()]
        # positional tables and frequencies may stay float64, cast per call (exact for a float64 model)
        found += [
            (f"module.{n}", t, False)
            for n, t in pl_module.named_buffers()
            if not ("positional" in n and t.dtype == torch.float64)
        ]
        for i, optimizer in enumerate(trainer.optimizers):
            found += [(w, t, False) for w, t in held(list(optimizer.state.values()), f"optimizer{i}", seen)]
        for callback in trainer.callbacks:
            if callback is not self:
                found += [(w, t, True) for w, t in held(callback, type(callback).__name__, seen)]
        engine = getattr(pl_module, "step_engine", None)
        if engine is not None:
            found += [(w, t, True) for w, t in held(engine, "step_engine", seen)]
        wrong = []
        for where, tensor, kept in found:
            allowed = {dtype, torch.float32} if kept and dtype in SIXTEEN_BITS else {dtype}
            floating = tensor.is_floating_point() and tensor.dim() > 0
            if tensor.device != device or (floating and tensor.dtype not in allowed):
                wrong.append(f"{where}: {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}")
        report = {"device": str(device), "dtype": str(dtype), "checked": len(found), "wrong": wrong}
        rank = os.environ.get("LOCAL_RANK", "0")
        Path(f"held_tensors.rank{rank}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    captured_steps.BACKENDS = {"cpu": FakeGraphs}
    sys.exit(main(sys.argv[1:]))
