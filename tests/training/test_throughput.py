"""Tokens/s and MFU: counted over real tokens, target-only beside source+target, peak measured here."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from attnx.data.batch import collate
from attnx.model.builders import training_flops_per_token
from attnx.training import throughput
from attnx.training.throughput import TokenThroughput, device_peak_flops, gpu_peak, measure_matmul_flops
from tests.conftest import tiny_config


class Recorder:
    """Stands in for the LightningModule's ``log`` (the callback's only output)."""

    def __init__(self) -> None:
        self.config = tiny_config()
        self.device = torch.device("cpu")
        self.logged: dict[str, float] = {}

    def log(self, name: str, value: float, **_: object) -> None:
        self.logged[name] = float(value)


class Trainer(SimpleNamespace):
    """What the callback reads of the Trainer: the device count and the optimizer step."""

    def __init__(self, world_size: int = 1) -> None:
        super().__init__(world_size=world_size, global_step=0)


def steps(callback: TokenThroughput, trainer: Trainer, module: Recorder, batch, n: int, accumulate: int = 1):
    """`n` optimizer steps of `accumulate` batches each, as Lightning calls the callback."""
    for _ in range(n):
        for micro in range(accumulate):
            if micro == accumulate - 1:
                trainer.global_step += 1  # the step is taken before the last batch's on_train_batch_end
            callback.on_train_batch_end(trainer, module, None, batch, 0)


def test_rates_count_real_tokens_over_the_window(monkeypatch) -> None:
    clock = iter([0.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    batch = collate([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])])  # 6 source + 8 target real tokens
    module, trainer = Recorder(), Trainer(world_size=2)
    callback = TokenThroughput(window=2, peak_flops=1e9)
    steps(callback, trainer, module, batch, 3)
    # window of 2 steps over 2 s, times 2 devices
    assert module.logged["train/tokens_per_s"] == pytest.approx(2 * 14 / 2 * 2)
    assert module.logged["train/tgt_tokens_per_s"] == pytest.approx(2 * 8 / 2 * 2)
    flops = training_flops_per_token(module.config, 3.0, 4.0)["per_token"] * 14
    assert module.logged["train/mfu"] == pytest.approx(2 * flops / 2 / 1e9)


def test_mfu_of_a_lora_run_counts_no_weight_gradients_of_the_frozen_matrices(monkeypatch) -> None:
    """With the model's matrices frozen (LoRA), their backward computes no weight gradients: ~2/3 the FLOPs."""
    clock = iter([0.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    batch = collate([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])])
    module, trainer = Recorder(), Trainer()
    frozen, adapter = (
        torch.nn.Parameter(torch.ones(2), requires_grad=False),
        torch.nn.Parameter(torch.ones(2)),
    )
    module.parameters = lambda: iter([frozen, adapter])
    callback = TokenThroughput(window=2, peak_flops=1e9)
    callback.on_fit_start(trainer, module)
    steps(callback, trainer, module, batch, 3)
    flops = training_flops_per_token(module.config, 3.0, 4.0, frozen=True)["per_token"] * 14
    assert module.logged["train/mfu"] == pytest.approx(flops / 1e9)


def test_accumulated_batches_are_one_step_timed_once(monkeypatch) -> None:
    """With gradient accumulation the clock is read, and the GPU waited for, once per optimizer step."""
    clock = iter([0.0, 1.0, 2.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    waits: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waits.append)
    batch = collate([([5, 6], [7, 8])])  # 3 + 3 real tokens
    module, trainer = Recorder(), Trainer()
    module.device = torch.device("cuda")
    callback = TokenThroughput(window=5, peak_flops=None)
    steps(callback, trainer, module, batch, 3, accumulate=4)
    assert len(waits) == 3
    assert module.logged["train/tokens_per_s"] == pytest.approx(2 * 4 * 6 / 2.0)  # 2 steps of 4 batches, 2 s


def test_validation_time_is_not_counted(monkeypatch) -> None:
    clock = iter([0.0, 1.0, 100.0, 101.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    batch = collate([([5, 6], [7, 8])])
    module, trainer = Recorder(), Trainer()
    callback = TokenThroughput(window=5, peak_flops=None)
    steps(callback, trainer, module, batch, 2)
    callback.on_validation_start(trainer, module)  # 99 s of validation follow
    steps(callback, trainer, module, batch, 2)
    assert module.logged["train/tokens_per_s"] == pytest.approx(6 / 1.0)
    assert "train/mfu" not in module.logged  # no peak known: no MFU rather than a wrong one


def test_cpu_peak_is_measured_and_plausible() -> None:
    peak = measure_matmul_flops(size=256, seconds=0.05)
    assert 1e8 < peak < 1e14
    assert device_peak_flops(torch.device("cpu"), "32-true") > 1e8


def test_mfu_divides_by_the_peak_of_the_precision_that_runs(monkeypatch) -> None:
    """Under bf16-mixed on CPU the fp32 peak made `train/mfu` read 1.58: bf16 has its own units and peak."""
    measured: list[torch.dtype] = []

    def fake(size=1024, seconds=0.3, device="cpu", dtype=torch.float32):
        measured.append(dtype)
        return {torch.float32: 1e11, torch.bfloat16: 7e11}[dtype]

    monkeypatch.setattr(throughput, "measure_matmul_flops", fake)
    throughput.cpu_peak_flops.cache_clear()
    try:
        assert device_peak_flops(torch.device("cpu"), "bf16-mixed") == 7e11
        assert device_peak_flops(torch.device("cpu"), "32-true") == 1e11
        assert device_peak_flops(torch.device("cpu"), "bf16-mixed") == 7e11  # measured once per process
        assert measured == [torch.bfloat16, torch.float32]
    finally:
        throughput.cpu_peak_flops.cache_clear()


@pytest.mark.parametrize(
    ("name", "key", "bf16", "fp32"),
    [
        ("NVIDIA H100 80GB HBM3", "h100", 989.4, 67.0),
        ("NVIDIA H100 PCIe", "h100 pcie", 756.0, 51.0),
        ("NVIDIA H200", "h200", 989.4, 67.0),
        ("NVIDIA H200 NVL", "h200 nvl", 835.5, 60.0),
        ("NVIDIA A100-SXM4-80GB", "a100", 312.0, 19.5),
    ],
)
def test_gpu_peaks_are_the_dense_data_sheet_figures_by_precision(name, key, bf16, fp32) -> None:
    peak = gpu_peak(name)
    assert peak.key == key and peak.tflops(torch.bfloat16) == peak.tflops(torch.float16) == bf16
    assert peak.tflops(torch.float32) == fp32 and peak.source
    assert gpu_peak("Tesla P100") is None
