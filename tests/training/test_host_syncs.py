"""Between two optimizer steps a training run reads nothing back from the device but one NaN check a step.

A read-back (`.item()`, `bool(t)`, `.tolist()`, selecting with a boolean mask, `nonzero`) makes the host wait
until the GPU has run everything queued; at every batch of a step that leaves the GPU idle while the host
prepares the next one; so does logging a Python number (`self.log("train/lr", 0.5)` copies it to the device).
The CPU tests count, in a real ``attnx fit`` with gradient accumulation, the operations that would wait on a
GPU as PyTorch dispatches them and the numbers logged; the GPU test turns PyTorch's own check on for the whole
of training and counts every wait by the line that caused it.
"""

from __future__ import annotations

import collections
import functools
import math
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnx.cli import main as attnx
from attnx.components.loss import LabelSmoothedLoss
from attnx.training.module import TranslationTask
from tests.training.conftest import fit_args
from tests.training.test_capture import engine_and_model, pairs

aten = torch.ops.aten
READ_BACKS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}
"""Operations whose result's size or value the host needs: on a GPU each waits for the queue to drain."""
BOOLEAN_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}
"""`x[mask]` and `x[mask] = v`: a `nonzero` inside when an index is a boolean tensor."""
STEP_HOOKS = ("training_step", "backward", "optimizer_step")
"""What Lightning runs for a batch and its update (the NaN check runs inside `optimizer_step`)."""


def is_read_back(func: Any, args: tuple[Any, ...]) -> bool:
    if func in READ_BACKS:
        return True
    return func in BOOLEAN_INDEXING and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ()
    )


def calling_site() -> str:
    """`path:line code` of the innermost attnx or Lightning frame that asked."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if ("/attnx/" in path or "/lightning/" in path) and "/tests/" not in path:
            return (
                f"{path.rsplit('/site-packages/', 1)[-1].rsplit('/src/', 1)[-1]}:{frame.lineno} {frame.line}"
            )
    return "elsewhere"


class ReadBacks(TorchDispatchMode):
    """Counts the read-backs dispatched while it is active, by the line that asked."""

    def __init__(self, sites: collections.Counter[str]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_read_back(func, args):
            self.sites[calling_site()] += 1
        return func(*args, **(kwargs or {}))


def counted(
    method: Callable[..., Any], sites: collections.Counter[str], depth: list[int]
) -> Callable[..., Any]:
    """`method` run under [ReadBacks][] (once, where hooks nest: optimizer_step runs the last batch's
    training_step and backward inside), with `Tensor.tolist` counted too (it reads back without dispatching)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return method(*args, **kwargs)
        depth[0] += 1
        tolist = torch.Tensor.tolist

        def counted_tolist(self: torch.Tensor) -> Any:
            sites[calling_site()] += 1
            return tolist(self)

        torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
        try:
            with ReadBacks(sites):
                return method(*args, **kwargs)
        finally:
            torch.Tensor.tolist = tolist  # type: ignore[method-assign]
            depth[0] -= 1

    return wrapper


def count_read_backs(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Count read-backs in TranslationTask's step hooks from now on (the test's monkeypatch undoes it)."""
    sites: collections.Counter[str] = collections.Counter()
    depth = [0]
    for hook in STEP_HOOKS:
        method = getattr(TranslationTask, hook)
        monkeypatch.setattr(TranslationTask, hook, counted(method, sites, depth))
    return sites


STEPS, ACCUMULATE = 3, 4
QUIET = [
    "--trainer.max_steps",
    str(STEPS),
    "--trainer.accumulate_grad_batches",
    str(ACCUMULATE),
    "--trainer.log_every_n_steps",
    "100",  # as configs/base.yaml and big.yaml: Lightning reads the logged values back when it logs
    "--trainer.callbacks",
    "null",
    "--trainer.enable_checkpointing",
    "false",
    "--trainer.limit_val_batches",
    "0",
    "--evaluation.bleu_samples",
    "0",
]


def test_the_counter_sees_each_kind_of_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    sites: collections.Counter[str] = collections.Counter()
    x = torch.randn(4, 3)
    mask = x[:, 0] > 0
    with ReadBacks(sites):
        float(x.sum())
        x[mask]
        x.nonzero()
        x.index_select(0, torch.tensor([0, 2]))  # not a read-back
    assert sum(sites.values()) == 3


def test_what_a_captured_graph_holds_reads_nothing_back() -> None:
    """The step engine's warm-up, capture and replay of a batch, loss scaling included: no read-back (on a GPU
    a capture would fail at one, and a replay could not make it); `attnx fit`'s captured steps are counted
    like the eager ones in tests/training/test_captured_steps.py."""

    class Scaler:
        scale_tensor = torch.tensor(4.0)

        def is_enabled(self) -> bool:
            return True

        def scale(self, loss: torch.Tensor) -> torch.Tensor:
            return loss * self.scale_tensor

    engine, _, backend = engine_and_model(scaler=Scaler(), divisor=2)
    sites: collections.Counter[str] = collections.Counter()
    first, second = pairs(3, 5, 6, seed=1), pairs(2, 4, 4, seed=2)  # built on the host, as loaders do
    with ReadBacks(sites):
        engine.prepare([(3, 6, 7)])
        sums = engine.run(first)
        engine.run(second)  # captured on first sight, then replayed
    assert sums is not None and engine.stats.replays == 2 and backend.calls.count("capture") == 2
    assert not sites, dict(sites)


def test_a_training_step_reads_back_once_per_optimizer_step_on_cpu(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = count_read_backs(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert attnx(fit_args(corpus, *QUIET)) == 0
    checks = {site: n for site, n in sites.items() if "training/module.py" in site}
    assert list(checks.values()) == [STEPS], sites  # the NaN check: one line, once a step, not once a batch
    others = {site: n for site, n in sites.items() if site not in checks}
    assert not others, f"read back from the device during training steps: {others}"


def test_training_logs_the_steps_losses_from_the_host_once_per_optimizer_step(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every value logged while training goes through `log_host` (a CPU tensor: `self.log(name, 0.5)` would
    copy it to the device, and a device tensor logged with `prog_bar=True` is read back at every batch), once a
    step: the loss, NLL, perplexity, learning rate and token rates. `train/loss` and `train/nll` of a step are
    the sums over its batches divided by their target tokens."""
    calls: collections.Counter[str] = collections.Counter()
    elsewhere: list[str] = []
    logged: dict[str, list[float]] = collections.defaultdict(list)
    batches: list[tuple[int, float, float]] = []
    log, loss = pl.LightningModule.log, LabelSmoothedLoss.__call__

    def recorded_log(self: pl.LightningModule, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        site = calling_site()
        calls[name] += 1
        if (
            "training/host_syncs.py" not in site
            or not isinstance(value, torch.Tensor)
            or value.device.type != "cpu"
        ):
            elsewhere.append(f"{name} from {site}")
        logged[name].append(float(value))
        log(self, name, value, *args, **kwargs)

    def recorded_loss(self: LabelSmoothedLoss, model: Any, batch: Any) -> Any:
        sums = loss(self, model, batch)
        batches.append((batch.n_tgt_tokens, float(sums.loss), float(sums.nll)))
        return sums

    monkeypatch.setattr(pl.LightningModule, "log", recorded_log)
    monkeypatch.setattr(LabelSmoothedLoss, "__call__", recorded_loss)
    monkeypatch.chdir(tmp_path)
    assert attnx(fit_args(corpus, *QUIET)) == 0
    assert {"train/loss", "train/nll", "train/ppl", "train/lr"} <= set(calls), calls
    assert not elsewhere, elsewhere
    assert max(calls.values()) <= STEPS, f"logged more often than once a step: {dict(calls)}"
    assert len(batches) == STEPS * ACCUMULATE
    for step in range(STEPS):
        window = batches[step * ACCUMULATE : (step + 1) * ACCUMULATE]
        tokens = sum(n for n, _, _ in window)
        assert logged["train/loss"][step] == pytest.approx(sum(s for _, s, _ in window) / tokens, rel=1e-5)
        assert logged["train/nll"][step] == pytest.approx(sum(s for _, _, s in window) / tokens, rel=1e-5)
        assert logged["train/ppl"][step] == pytest.approx(math.exp(logged["train/nll"][step]), rel=1e-5)


def test_the_nan_check_still_names_the_batch(corpus: Path, tmp_path: Path, capsys) -> None:
    """Checked once a step, the first non-finite loss is still the one reported, before the step is taken."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        rc = attnx(fit_args(corpus, *QUIET, "--model.lr_factor", "1e30"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "training loss is nan at optimizer step 2 (batch 4 of epoch 0)" in err, err[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cuda_graphs", ["false", "true"])
def test_on_cuda_no_line_waits_for_the_gpu_at_every_batch(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, cuda_graphs: str
) -> None:
    """PyTorch's own check (`torch.cuda.set_sync_debug_mode("warn")`, a warning at the Python line of each
    operation that waits) and every `torch.cuda.synchronize`, from the start of training to its end: no line
    may wait at every batch (12 batches here), only once a step (3 steps). Eager steps and captured ones (the
    captures themselves, which wait once per shape before the first step, are not counted: counting starts
    at the module's `on_train_start`, after CapturedSteps' own)."""
    waits: collections.Counter[str] = collections.Counter()
    synchronize = torch.cuda.synchronize

    def counted_synchronize(device: Any = None) -> None:
        waits[f"synchronize from {calling_site()}"] += 1
        synchronize(device)

    def debug(hook: str, mode: str) -> None:
        method = getattr(TranslationTask, hook)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            torch.cuda.set_sync_debug_mode(mode)
            return method(*args, **kwargs)

        monkeypatch.setattr(TranslationTask, hook, wrapper)

    debug("on_train_start", "warn")
    debug("on_train_end", "default")  # Lightning then moves the weights back to the CPU: waits, once
    start = TranslationTask.on_train_start

    def counting_from_here(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(torch.cuda, "synchronize", counted_synchronize)
        return start(*args, **kwargs)

    monkeypatch.setattr(TranslationTask, "on_train_start", counting_from_here)
    monkeypatch.chdir(tmp_path)
    gpu = ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed"]
    gpu += ["--cuda_graphs", cuda_graphs, "--data.shape_buckets", "8"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert attnx(fit_args(corpus, *QUIET, *gpu)) == 0
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if "synchroniz" in str(warning.message):
            waits[f"{warning.filename}:{warning.lineno}"] += 1
    assert waits, "no wait seen at all: the NaN check waits once a step, so the check itself is broken"
    per_batch = {site: n for site, n in waits.items() if n > STEPS + 1}
    assert not per_batch, f"waits for the GPU at every batch: {per_batch}"
    if cuda_graphs == "true":
        assert f"{STEPS * ACCUMULATE:,} batches replayed" in capsys.readouterr().out
