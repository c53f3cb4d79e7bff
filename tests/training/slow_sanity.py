"""A callback that stands for a long sanity check (a big validation set, a slow first BLEU): it says when the check
begins, then takes twenty minutes (a test that stops it waits for the command to end, which
it does at once, and would wait out the check only where the stop failed). Added to a real ``attnx fit`` with
``--trainer.callbacks+=tests.training.slow_sanity.SlowSanityCheck``."""

from __future__ import annotations

import time

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

BEGINS = "sanity check begins"


class SlowSanityCheck(Callback):
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        print(BEGINS, flush=True)
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            time.sleep(0.05)
