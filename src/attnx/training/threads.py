"""CPU threads for a machine shared with other jobs."""

from __future__ import annotations

import time
from collections import defaultdict

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from attnx.data.batch import Batch
from attnx.errors import ConfigError
from attnx.training.host_syncs import log_host


class AdaptiveThreads(Callback):
    """Every `every` optimizer steps, time a few training batches with each thread count in `choices` and
    train with the fastest (per token) until the next measurement.

    On an idle 2-core CPU two threads are fastest; while another job keeps one core busy, a second thread
    makes every kernel wait for the descheduled one and a step takes 2-3× longer than with one thread
    (`docs/benchmarks.md`). The load on a shared machine changes during a run, so the choice is re-made.
    A resumed run measures at its first step (the load of the machine it restarts on is not that of the run it
    continues). The count in use is logged as `train/threads` at every step. Thread counts change float
    summation order, so runs using this callback are not bit-for-bit repeatable.
    """

    def __init__(self, choices: list[int] | None = None, every: int = 200, probe: int = 4) -> None:
        """
        Args:
            choices: Thread counts to try; default 1 up to the number of cores.
            every: Optimizer steps between two measurements.
            probe: Training batches timed per thread count (the first of each is not counted).
        """
        if every < 1 or probe < 2:
            raise ConfigError(f"AdaptiveThreads needs every >= 1 and probe >= 2, got {every} and {probe}")
        self.choices = choices or list(range(1, torch.get_num_threads() + 1))
        self.every = every
        self.probe = probe
        self.threads = torch.get_num_threads()
        self._queue: list[tuple[int, bool]] = []  # (threads, counted) for the next batches
        self._cost: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])  # threads -> [seconds, tokens]
        self._start = 0.0
        self._measured_at = -1
        self._first_batch = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_batch = True

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Batch, _
    ) -> None:
        step = trainer.global_step
        due = step % self.every == 0 or self._first_batch
        self._first_batch = False
        if not self._queue and due and step != self._measured_at:
            self._measured_at = step
            self._cost.clear()
            self._queue = [(n, i > 0) for n in self.choices for i in range(self.probe)]
        if self._queue:
            torch.set_num_threads(self._queue[0][0])
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, _, batch: Batch, __
    ) -> None:
        if self._queue:
            threads, counted = self._queue.pop(0)
            if counted:
                cost = self._cost[threads]
                cost[0] += time.perf_counter() - self._start
                cost[1] += batch.n_src_tokens + batch.n_tgt_tokens
            if not self._queue:
                self.threads = min(self._cost, key=lambda n: self._cost[n][0] / self._cost[n][1])
                torch.set_num_threads(self.threads)
        log_host(pl_module, "train/threads", self.threads)
