"""Training speed: tokens/s and model FLOPs utilization (MFU), over a sliding window of batches.

Counted tokens are real (non-padding) tokens. `train/tokens_per_s` counts source + target tokens,
`train/tgt_tokens_per_s` target tokens only (fairseq's `wps`, what published figures count); both are
over all devices. `train/mfu` divides the model FLOPs of the real tokens
([training_flops_per_token][attnx.model.builders.training_flops_per_token]) by the peak of the device at hand
in the precision that runs (bf16-mixed: the bf16 peak, 32-true: the fp32 one): on GPUs the data-sheet figure,
on CPU a matmul rate in that precision measured once per run on this machine with the threads PyTorch uses.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.callbacks import Callback

from attnx.data.batch import Batch
from attnx.errors import ConfigError
from attnx.model.builders import training_flops_per_token
from attnx.training.host_syncs import log_host
from attnx.training.precision import AMX_FLAGS, AVX512_BF16_FLAG, cpu_flags

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype a Lightning precision runs its matrix products in: `bf16-mixed` → bfloat16, `16-mixed` →
    float16, `32-true` (and anything else) → float32."""
    return PRECISION_DTYPES.get(str(precision).split("-")[0], torch.float32)


@dataclass(frozen=True)
class GpuPeak:
    """One GPU's data-sheet figures: dense peaks without the 2:4-sparsity doubling, and its memory."""

    key: str  # substring of the lower-cased `torch.cuda.get_device_name`
    bf16_tflops: float  # tensor cores, dense; fp16 runs at the same rate on every GPU listed
    fp32_tflops: (
        float | None
    )  # without tensor cores: Lightning's 32-true (PyTorch leaves TF32 off for matmuls)
    memory_gib: float
    source: str

    def tflops(self, dtype: torch.dtype) -> float | None:
        return self.bf16_tflops if dtype in (torch.bfloat16, torch.float16) else self.fp32_tflops


GPU_PEAKS = (  # the first key found in the device name wins: specific variants before their family
    GpuPeak("h200 nvl", 835.5, 60.0, 141, "NVIDIA H200 NVL data sheet"),
    GpuPeak("gh200", 989.4, 67.0, 96, "NVIDIA GH200 Grace Hopper data sheet"),
    GpuPeak("h200", 989.4, 67.0, 141, "NVIDIA H200 SXM data sheet (1,979 TFLOPS bf16 with sparsity)"),
    GpuPeak("h100 nvl", 835.5, 60.0, 94, "NVIDIA H100 NVL data sheet"),
    GpuPeak("h100 pcie", 756.0, 51.0, 80, "NVIDIA H100 PCIe data sheet"),
    GpuPeak("h100", 989.4, 67.0, 80, "NVIDIA H100 SXM5 data sheet (1,979 TFLOPS bf16 with sparsity)"),
    GpuPeak("a100", 312.0, 19.5, 80, "NVIDIA A100 data sheet (80 GB; the 40 GB part computes alike)"),
    GpuPeak("l40s", 362.1, 91.6, 48, "NVIDIA L40S data sheet"),
    GpuPeak("a10g", 70.0, None, 24, "AWS G5 (A10G) specification"),
    GpuPeak("a10", 125.0, 31.2, 24, "NVIDIA A10 data sheet"),
    GpuPeak("l4", 121.0, 30.3, 24, "NVIDIA L4 data sheet"),
)
"""Data-sheet peaks that `train/mfu`, `attnx describe --device` and bench/bench_gpu.py divide by. Lightning's own
table mixes dense and sparse figures (H200: 2.0e15, twice the dense rate) and lacks some names, so it is only
the fallback for devices not listed here."""


def gpu_peak(name: str) -> GpuPeak | None:
    """The [`GPU_PEAKS`][attnx.training.throughput.GPU_PEAKS] entry of a device name (`NVIDIA H100 80GB HBM3`)."""
    name = name.lower()
    return next((peak for peak in GPU_PEAKS if peak.key in name), None)


def measure_matmul_flops(
    size: int = 1024,
    seconds: float = 0.3,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> float:
    """Matrix-multiply FLOP/s of `device` in `dtype` now, with the threads PyTorch uses: the CPU's practical
    peak for that precision."""
    generator = torch.Generator(device).manual_seed(0)  # leaves the global random state alone
    a = torch.randn(size, size, device=device, generator=generator).to(dtype)
    b = torch.randn(size, size, device=device, generator=generator).to(dtype)
    a @ b  # warm-up: thread pool start, page faults, kernel selection
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or runs < 2:
        a @ b
        runs += 1
    return 2 * size**3 * runs / elapsed


@functools.lru_cache(maxsize=8)
def cpu_peak_flops(dtype: torch.dtype = torch.float32, threads: int | None = None) -> float:
    """This CPU's matrix-product peak in `dtype` with the threads PyTorch uses (pass their count as `threads`:
    it keys the cache), measured once per process and thread count: bf16 runs on other units than fp32 (AMX, AVX512-BF16), or emulated ~90× slower without them,
    so each precision has its own peak. Without bf16 units a smaller product keeps the measurement short."""
    size = 1024 if dtype == torch.float32 or bf16_units() else 256
    return measure_matmul_flops(size, dtype=dtype)


def bf16_units() -> bool:
    """Whether the CPU has bf16 matrix units (AMX or AVX512-BF16)."""
    flags = cpu_flags()
    return flags >= AMX_FLAGS or AVX512_BF16_FLAG in flags


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one `device` in the precision that runs (`precision`'s matrix-product dtype): measured
    on CPU ([`cpu_peak_flops`][attnx.training.throughput.cpu_peak_flops]); on GPUs the dense data-sheet figure
    ([`GPU_PEAKS`][attnx.training.throughput.GPU_PEAKS]), else Lightning's table, else a matmul measured now."""
    dtype = precision_dtype(precision)
    if device.type == "cpu":
        return cpu_peak_flops(dtype, torch.get_num_threads())
    if device.type == "cuda":
        peak = gpu_peak(torch.cuda.get_device_name(device))
        if peak is not None and peak.tflops(dtype):
            return peak.tflops(dtype) * 1e12
    return get_available_flops(device, dtype) or measure_matmul_flops(4096, device=device, dtype=dtype)


class TokenThroughput(Callback):
    """Log `train/tokens_per_s`, `train/tgt_tokens_per_s` and `train/mfu` at every optimizer step.

    Rates are over the last `window` optimizer steps (from the second step on); the time spent validating and
    starting an epoch is not counted. They are per-device rates times the device count: token-budget batches
    keep the ranks equally loaded. The clock is read once a step, after waiting for the GPU: waiting at every
    batch would leave the GPU idle while the host prepares the next one.
    """

    def __init__(self, window: int = 20, peak_flops: float | None = None) -> None:
        """
        Args:
            window: Optimizer steps the rates are averaged over.
            peak_flops: Peak FLOP/s of one device, the denominator of `train/mfu`; None looks it up (GPU)
                or measures it once at the start of training (CPU).
        """
        if window < 1:
            raise ConfigError(f"TokenThroughput needs window >= 1, got {window}")
        self.window = window
        self.peak_flops = peak_flops
        self._window: deque[tuple[float, int, int, float]] = deque(
            maxlen=window + 1
        )  # time, tokens, tgt, flops of each step
        self._pending = [0, 0, 0.0]  # tokens, tgt, flops of the batches since the last step
        self._step = 0  # the optimizer step seen last (on_fit_start: the step a run resumes at)
        self._frozen = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # LoRA: the model's matrices are frozen, their weight gradients are not computed (nor counted)
        self._frozen = any(not p.requires_grad for p in pl_module.parameters())
        if self.peak_flops is None:
            self.peak_flops = device_peak_flops(pl_module.device, str(trainer.precision))
        self._restart(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restart(trainer)  # the loader's start is not training time

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restart(trainer)  # nor is validation

    def _restart(self, trainer: pl.Trainer) -> None:
        self._window.clear()
        self._pending = [0, 0, 0.0]
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Batch, batch_idx: int) -> None:
        n = batch.size
        per_token = training_flops_per_token(
            pl_module.config, batch.n_src_tokens / n, batch.n_tgt_tokens / n, frozen=self._frozen
        )
        tokens = batch.n_src_tokens + batch.n_tgt_tokens
        self._pending[0] += tokens
        self._pending[1] += batch.n_tgt_tokens
        self._pending[2] += per_token["per_token"] * tokens
        if trainer.global_step == self._step:
            return  # within an optimizer step's batches (gradient accumulation)
        self._step = trainer.global_step
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        tokens, tgt, flops = self._pending
        self._pending = [0, 0, 0.0]
        self._window.append((time.perf_counter(), tokens, tgt, flops))
        if len(self._window) < 2:
            return
        elapsed = self._window[-1][0] - self._window[0][0]
        done = list(self._window)[1:]  # the work between the first and the last timestamp
        world = trainer.world_size  # token-budget batches keep the ranks equally loaded
        log_host(pl_module, "train/tokens_per_s", sum(w[1] for w in done) / elapsed * world, prog_bar=True)
        log_host(pl_module, "train/tgt_tokens_per_s", sum(w[2] for w in done) / elapsed * world)
        if self.peak_flops:
            log_host(pl_module, "train/mfu", sum(w[3] for w in done) / elapsed / self.peak_flops)
