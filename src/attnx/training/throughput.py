"""Training speed: tokens/s and model FLOPs utilization (MFU), over a sliding window of batches.

Counted tokens are real (non-padding) tokens. `train/tokens_per_s` counts source + target tokens,
`train/tgt_tokens_per_s` target tokens only (fairseq's `wps`, what published figures count); both are
over all devices. `train/mfu` divides the model FLOPs of the real tokens
([training_flops_per_token][attnx.model.builders.training_flops_per_token]) by the peak of the device at hand:
on GPUs Lightning's table for the precision trained in, on CPU a matmul rate measured once per run on this
machine with the threads PyTorch uses.
"""

from __future__ import annotations

import time
from collections import deque

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.callbacks import Callback

from attnx.data.batch import Batch
from attnx.model.builders import training_flops_per_token

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}

DENSE_BF16_TFLOPS = [  # (substring of the lower-cased device name, dense bf16 tensor-core TFLOP/s)
    ("h200 nvl", 835.5),
    ("h200", 989.4),
    ("gh200", 989.4),
    ("h100 nvl", 835.5),
    ("h100 pcie", 756.0),
    ("h100", 989.4),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("a100", 312.0),
    ("l40s", 362.1),
    ("a10g", 70.0),
    ("a10", 125.0),
    ("l4", 121.0),
]
"""NVIDIA data-sheet figures without the 2:4-sparsity doubling (fp16 runs at the same rate). Lightning's own
table mixes dense and sparse figures (H200: 2.0e15, twice the dense rate) and lacks some names, so it is only
the fallback for devices not listed here."""


def measure_matmul_flops(size: int = 1024, seconds: float = 0.3, device: str | torch.device = "cpu") -> float:
    """fp32 matrix-multiply FLOP/s of `device` now, with the threads PyTorch uses: the CPU's practical peak."""
    generator = torch.Generator(device).manual_seed(0)  # leaves the global random state alone
    a = torch.randn(size, size, device=device, generator=generator)
    b = torch.randn(size, size, device=device, generator=generator)
    a @ b  # warm-up: thread pool start, page faults
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or runs < 2:
        a @ b
        runs += 1
    return 2 * size**3 * runs / elapsed


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one `device` for `precision`: measured on CPU; on GPUs the dense data-sheet figure
    for bf16/fp16 ([`DENSE_BF16_TFLOPS`][attnx.training.throughput.DENSE_BF16_TFLOPS]), else Lightning's table, else a matmul measured now."""
    if device.type == "cpu":
        return measure_matmul_flops()
    dtype = PRECISION_DTYPES.get(precision.split("-")[0], torch.float32)
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        name = torch.cuda.get_device_name(device).lower()
        for key, tflops in DENSE_BF16_TFLOPS:
            if key in name:
                return tflops * 1e12
    return get_available_flops(device, dtype) or measure_matmul_flops(4096, device=device)


class TokenThroughput(Callback):
    """Log `train/tokens_per_s`, `train/tgt_tokens_per_s` and `train/mfu` every training batch.

    Rates are over the last `window` batches (from the second batch on); the time spent validating and
    starting an epoch is not counted. They are per-device rates times the device count: token-budget batches
    keep the ranks equally loaded.
    """

    def __init__(self, window: int = 20, peak_flops: float | None = None) -> None:
        """
        Args:
            window: Training batches the rates are averaged over.
            peak_flops: Peak FLOP/s of one device, the denominator of `train/mfu`; None looks it up (GPU)
                or measures it once at the start of training (CPU).
        """
        if window < 1:
            raise ValueError(f"TokenThroughput needs window >= 1, got {window}")
        self.window = window
        self.peak_flops = peak_flops
        self._window: deque[tuple[float, int, int, float]] = deque(
            maxlen=window + 1
        )  # time, tokens, tgt, flops

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.peak_flops is None:
            self.peak_flops = device_peak_flops(pl_module.device, str(trainer.precision))
        self._window.clear()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.clear()  # the loader's start is not training time

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.clear()  # nor is validation

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Batch, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        n = batch.size
        per_token = training_flops_per_token(pl_module.config, batch.n_src_tokens / n, batch.n_tgt_tokens / n)
        tokens = batch.n_src_tokens + batch.n_tgt_tokens
        self._window.append(
            (time.perf_counter(), tokens, batch.n_tgt_tokens, per_token["per_token"] * tokens)
        )
        if len(self._window) < 2:
            return
        elapsed = self._window[-1][0] - self._window[0][0]
        done = list(self._window)[1:]  # the work between the first and the last timestamp
        world = trainer.world_size  # token-budget batches keep the ranks equally loaded
        pl_module.log("train/tokens_per_s", sum(w[1] for w in done) / elapsed * world, prog_bar=True)
        pl_module.log("train/tgt_tokens_per_s", sum(w[2] for w in done) / elapsed * world)
        if self.peak_flops:
            pl_module.log("train/mfu", sum(w[3] for w in done) / elapsed / self.peak_flops)
