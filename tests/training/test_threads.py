"""AdaptiveThreads picks the thread count that trains fastest per token, and measures again later."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import attnx.training.threads as threads_module
from attnx.data.batch import collate
from attnx.training.threads import AdaptiveThreads


def test_picks_the_fastest_thread_count_and_remeasures(monkeypatch: pytest.MonkeyPatch) -> None:
    seconds_per_token = {1: 1.0, 2: 3.0}  # a second thread is slow: the other core is busy
    clock = [0.0]
    monkeypatch.setattr(threads_module.time, "perf_counter", lambda: clock[0])
    batch = collate([([5, 6, 7], [8, 9])])  # 4 source + 3 target tokens with EOS/BOS
    trainer = SimpleNamespace(global_step=0)
    logged = {}
    module = SimpleNamespace(log=lambda name, value: logged.__setitem__(name, value))
    callback = AdaptiveThreads(choices=[2, 1], every=10, probe=3)
    original = torch.get_num_threads()
    used = []
    try:
        for step in range(17):
            trainer.global_step = step
            callback.on_train_batch_start(trainer, module, batch, step)
            used.append(torch.get_num_threads())
            clock[0] += 7 * seconds_per_token[torch.get_num_threads()]
            callback.on_train_batch_end(trainer, module, None, batch, step)
            if step == 7:
                seconds_per_token = {1: 1.0, 2: 0.5}  # the other job finished
    finally:
        torch.set_num_threads(original)
    assert used[:6] == [2, 2, 2, 1, 1, 1]  # probing at step 0
    assert used[6:10] == [1, 1, 1, 1]  # the faster one
    assert used[10:] == [2, 2, 2, 1, 1, 1, 2]  # probing again at step 10; now 2 threads win
    assert callback.threads == 2 and logged["train/threads"] == 2.0


def test_a_resumed_run_measures_at_its_first_step_and_logs_the_count_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run resumed at step 147 of `every: 250` measures at once, and `train/threads` is in every row of
    metrics.csv, whichever steps Lightning writes (not only those of a measurement)."""
    monkeypatch.setattr(threads_module.time, "perf_counter", lambda: 0.0)
    batch = collate([([5, 6, 7], [8, 9])])
    trainer = SimpleNamespace(global_step=147)
    callback = AdaptiveThreads(choices=[2, 1], every=250, probe=2)
    callback.on_train_start(trainer, None)
    original = torch.get_num_threads()
    torch.set_num_threads(1)
    logged_at, used = [], []
    logged: dict[str, float] = {}
    module = SimpleNamespace(log=lambda name, value: logged.__setitem__(name, value))
    try:
        for step in range(147, 153):
            logged.clear()
            trainer.global_step = step
            callback.on_train_batch_start(trainer, module, batch, step)
            used.append(torch.get_num_threads())
            callback.on_train_batch_end(trainer, module, None, batch, step)
            logged_at.append(step if "train/threads" in logged else None)
    finally:
        torch.set_num_threads(original)
    assert used[:4] == [2, 2, 1, 1]  # probing at the resumed run's first step
    assert logged_at == list(range(147, 153))
