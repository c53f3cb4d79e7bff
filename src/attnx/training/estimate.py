"""What a run will need before it runs: memory per device and time per step and per run, estimated.

`attnx describe --config X --device h100` prints it for a device one does not have; `attnx fit` prints it in
its first lines for the device it runs on. Every figure is an estimate, said as one:

* memory per device: fp32 weights (4 bytes a parameter; Lightning's bf16-mixed keeps them in fp32 as well),
  their gradients (4), Adam's two moments (8), and the activations a training batch of `max_tokens` source and
  `max_tokens` target tokens keeps for the backward pass
  ([`activation_bytes`][attnx.training.activations.activation_bytes], counted for the config's components);
  under LoRA gradients and Adam's moments of the adapters alone;
* time: the batch's training FLOPs ([training_flops_per_token][attnx.model.builders.training_flops_per_token],
  padding included) over the device's peak in the precision that runs times a stated MFU (model FLOPs
  utilization). Peaks: [`GPU_PEAKS`][attnx.training.throughput.GPU_PEAKS] (data sheets) for GPUs, this CPU's
  matrix-product rate measured now for `cpu`.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any

import torch

from attnx.errors import ConfigError
from attnx.model import TransformerConfig
from attnx.model.builders import training_flops_per_token
from attnx.training.activations import activation_bytes
from attnx.training.capture import pool_bytes
from attnx.training.throughput import GPU_PEAKS, cpu_peak_flops, gpu_peak, precision_dtype

DEFAULT_MFU = 0.35
"""The MFU estimates on GPUs assume unless told otherwise: about what published Transformer training reaches
(fairseq's big model on one A100: ≈ 33%)."""

CPU_MFU = 0.65
"""The MFU estimates on a CPU in fp32 assume, over its matrix-product rate measured at start: what `attnx fit`
logs as `train/mfu` there, 2 threads (docs/gpu.md, "On a CPU"): 0.57-0.63 for configs/multi30k_cpu.yaml (d_model
256), 0.73-0.85 for base and big; a smaller model spends more of its step outside matrix products."""

GPU_HOST_SECONDS_PER_LAYER = 4.1e-3
"""Host time a training batch costs per layer on a GPU, forward and backward: launching its kernels one by one.
Measured on one H200 with its 16-core Xeon host (torch 2.11, bf16-mixed): 49-54 ms a batch for base's 12
layers at 3,125 and 12,500 tokens a side (docs/gpu.md, section 6). A step cannot take less than its batches'
host time, however fast the GPU: the floor of the time estimate on GPUs."""

DEVICES = {"h100": "h100", "h200": "h200", "a100": "a100"}
"""`--device` names → their [`GPU_PEAKS`][attnx.training.throughput.GPU_PEAKS] key (the SXM parts); `cpu` is this CPU."""


@dataclass(frozen=True)
class RunEstimate:
    """Memory per device and time per step and per run of one config on one device (estimates)."""

    device: str  # as printed: "NVIDIA H100 SXM5", "this CPU (16 threads)"
    precision: str
    peak_flops: float  # of one device, in the precision that runs
    peak_source: str
    mfu: float
    parameters: int
    activation_bytes: int
    device_memory_gib: float | None
    step_seconds: float  # the larger of the two below
    steps: int | None
    run_seconds: float | None
    bounded_by: str  # "max_steps", "max_time" or "" (neither: no end)
    compute_seconds: float = 0.0  # a step's FLOPs at the MFU
    host_seconds: float = 0.0  # a step's batches times the host's floor (GPUs; 0 on CPU)
    batches: int = 1  # a step's batches
    captured_bytes: int = 0  # the captured steps' graph pool (attnx.training.capture), where they capture
    unchecked_activation_bytes: int = 0  # with activation checkpointing: the activations without it
    resumed_at: int = 0  # the step a resumed run starts from (`steps` and `run_seconds` are what is left)
    trainable: int | None = None  # the parameters that train (LoRA: the adapters'); None: all of them

    @property
    def trained(self) -> int:
        return self.parameters if self.trainable is None else self.trainable

    @property
    def weight_bytes(self) -> int:
        return 4 * self.parameters

    @property
    def gradient_bytes(self) -> int:
        return 4 * self.trained

    @property
    def optimizer_bytes(self) -> int:
        return 8 * self.trained

    @property
    def memory_bytes(self) -> int:
        state = self.weight_bytes + self.gradient_bytes + self.optimizer_bytes
        return state + self.activation_bytes + self.captured_bytes

    def lines(self) -> list[str]:
        """The estimate in a few lines, each saying it is one."""
        memory = (
            f"estimated memory per device: {_size(self.memory_bytes)} (weights {_size(self.weight_bytes)}, "
            f"gradients {_size(self.gradient_bytes)}, Adam {_size(self.optimizer_bytes)}"
            + (
                f" of the {self.trained:,} trainable parameters of {self.parameters:,}"
                if self.trained != self.parameters
                else ""
            )
            + f", activations "
            f"{_size(self.activation_bytes)}"
            + (
                f" with activation checkpointing, {_size(self.unchecked_activation_bytes)} without"
                if self.unchecked_activation_bytes
                else ""
            )
            + (f", captured steps' graph pool {_size(self.captured_bytes)})" if self.captured_bytes else ")")
        )
        if self.device_memory_gib:
            fits = "fits" if self.memory_bytes / 2**30 < 0.9 * self.device_memory_gib else "does NOT fit"
            memory += f"; {fits} in {self.device_memory_gib:g} GiB"
        arithmetic = (
            f"at {self.mfu:.0%} MFU of {self.peak_flops / 1e12:,.3g} TFLOP/s ({self.precision} peak of "
            f"{self.device}: {self.peak_source})"
        )
        time = f"estimated time: {duration_text(self.step_seconds)} a step {arithmetic}"
        if self.host_seconds > self.compute_seconds:
            batches = f"{self.batches} batch{'es' * (self.batches > 1)}"
            time = (
                f"estimated time: {duration_text(self.step_seconds)} a step, the host's floor: {batches} x "
                f"{duration_text(self.host_seconds / self.batches)} of kernel launches (as measured on one H200's "
                f"host); the arithmetic alone, {duration_text(self.compute_seconds)} {arithmetic}"
            )
        if self.run_seconds is not None and self.steps is not None:
            left = f" after step {self.resumed_at:,}" if self.resumed_at else ""
            time += f", {duration_text(self.run_seconds)} for {self.steps:,} steps{left} ({self.bounded_by})"
        return [memory, time]


BUSY_BATCH_TOKENS = 12_500
"""Tokens per side of a batch that kept one H200 busy: at 3,125 the host, launching a layer's kernels one by
one, set the pace (docs/gpu.md, section 6)."""

MEASURED_ON_A_GPU = (
    "on one H200, 12,500 x 2 ran 4.6x (base) and 5.6x (big) the target tokens/s of 3,125 x 8; docs/gpu.md"
)

HEADROOM = 0.6
"""A suggested batch must fit in this share of the device's memory: the activation estimate was measured up to
a third off (tests/training/test_estimate.py's CUDA tolerance)."""


def larger_batches(
    estimate: RunEstimate,
    config: TransformerConfig,
    max_tokens: int,
    src_len: float = 25.0,
    tgt_len: float = 25.0,
    val_check_interval: Any = None,
) -> str | None:
    """On a GPU, the same tokens a step as `estimate`'s in fewer, larger batches: the options that put `k` of
    the step's batches of `max_tokens` into one, for the smallest `k` that reaches
    [`BUSY_BATCH_TOKENS`][attnx.training.estimate.BUSY_BATCH_TOKENS] (else the largest `k` that fits), as one
    line; None when the step is one batch already, or no larger batch fits in the device's memory with
    [`HEADROOM`][attnx.training.estimate.HEADROOM]."""
    accumulate, memory_gib = estimate.batches, estimate.device_memory_gib
    if accumulate < 2 or not memory_gib:
        return None
    state = estimate.weight_bytes + estimate.gradient_bytes + estimate.optimizer_bytes  # whatever the batch
    fitting = []
    for k in (k for k in range(2, accumulate + 1) if accumulate % k == 0):
        tokens = max_tokens * k
        activations = activation_bytes(config, tokens, tokens, estimate.precision, "cuda", src_len, tgt_len)
        memory = state + activations + (pool_bytes(activations) if estimate.captured_bytes else 0)
        if memory / 2**30 > HEADROOM * memory_gib:
            break
        fitting.append((k, memory))
        if tokens >= BUSY_BATCH_TOKENS:
            break
    if not fitting:
        return None
    k, memory = fitting[-1]
    options = f"--data.max_tokens {max_tokens * k} --trainer.accumulate_grad_batches {accumulate // k}"
    if isinstance(val_check_interval, int) and not isinstance(val_check_interval, bool):
        options += f" --trainer.val_check_interval {max(1, val_check_interval // k)}"  # it counts batches
    return (
        f"fewer, larger batches keep a GPU busier: {options} trains the same {max_tokens * accumulate:,} tokens "
        f"per side a step in an estimated {_size(memory)} ({MEASURED_ON_A_GPU})"
    )


def _size(count: int) -> str:
    if count < 2**20:  # LoRA's adapters: their gradients and moments may be a few hundred KiB
        return f"{count / 2**10:,.0f} KiB"
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    text = str(datetime.timedelta(seconds=round(seconds)))
    return text.replace(" days, ", " days ").replace(" day, ", " day ")


def device_peak(
    device: str, precision: str, threads: int | None = None
) -> tuple[float, str, str, float | None]:
    """(peak FLOP/s, where it comes from, device label, memory GiB) of a `--device` name in `precision`: a
    data-sheet figure for the GPUs of [`DEVICES`][attnx.training.estimate.DEVICES] (or any name
    [`GPU_PEAKS`][attnx.training.throughput.GPU_PEAKS] knows), the rate measured now for `cpu`."""
    dtype = precision_dtype(precision)
    if device == "cpu":
        threads = threads or torch.get_num_threads()
        return (
            cpu_peak_flops(dtype, threads),
            "measured now",
            f"this CPU ({threads} thread{'s' * (threads > 1)})",
            None,
        )
    peak = gpu_peak(DEVICES.get(device, device))
    if peak is None:
        names = ", ".join(["cpu", *DEVICES, *(p.key for p in GPU_PEAKS if p.key not in DEVICES)])
        raise ConfigError(f"--device {device}: no peak known for it; one of {names}")
    tflops = peak.tflops(dtype)
    if tflops is None:
        raise ConfigError(f"--device {device}: its data sheet gives no {dtype} figure; pick a bf16 precision")
    return tflops * 1e12, peak.source, peak.key.upper(), peak.memory_gib


def cpu_mfu(peak_flops: float, fp32_peak_flops: float) -> float:
    """The MFU of a CPU step whose matrix products run at `peak_flops` (bf16 units: several times
    `fp32_peak_flops`): in fp32 [`CPU_MFU`][attnx.training.estimate.CPU_MFU]; in another precision its matrix
    products speed up and the rest of the step (norms, softmax, dropout, Adam) keeps fp32's time."""
    rest = (1 / CPU_MFU - 1) * peak_flops / fp32_peak_flops  # in units of the matrix products' time
    return 1 / (1 + rest)


def estimate_run(
    config: TransformerConfig,
    parameters: int,
    max_tokens: int,
    precision: str,
    device: str,
    accumulate: int = 1,
    max_steps: int | None = None,
    max_time_seconds: float | None = None,
    mfu: float | None = None,
    src_len: float = 25.0,
    tgt_len: float = 25.0,
    peak: tuple[float, str, str, float | None] | None = None,
    host_seconds_per_batch: float | None = None,
    captured: bool = False,
    trainable: int | None = None,
) -> RunEstimate:
    """Memory and time of training `config` (`parameters` of them) in batches of `max_tokens` per side and
    device, `accumulate` batches a step, on `device` (`cpu`, `h100`, `h200`, `a100`, or a name from
    [`GPU_PEAKS`][attnx.training.throughput.GPU_PEAKS]) in `precision`, at `mfu` (default
    [`DEFAULT_MFU`][attnx.training.estimate.DEFAULT_MFU] on GPUs, [`cpu_mfu`][attnx.training.estimate.cpu_mfu]
    on the CPU).

    Time per step is that of one device: devices train side by side on their own batches, and on a GPU no
    less than its batches' host time (`host_seconds_per_batch`, default
    [`GPU_HOST_SECONDS_PER_LAYER`][attnx.training.estimate.GPU_HOST_SECONDS_PER_LAYER] per layer; none on CPU).
    The run ends at `max_steps` or after `max_time_seconds`, whichever comes first (neither given: no run time).
    `captured`: the steps are captured as CUDA graphs, whose pool holds a batch's memory once more
    ([`pool_bytes`][attnx.training.capture.pool_bytes]). `trainable`: the parameters that train, when not all
    of them do (LoRA's adapters): only they have gradients and Adam's moments.
    """
    if mfu is not None and not 0 < mfu <= 1:
        raise ConfigError(f"mfu must be in (0, 1], got {mfu}")
    peak_flops, source, label, memory = peak or device_peak(device, precision)
    if mfu is None and device == "cpu":
        fp32 = precision_dtype(precision) == torch.float32
        mfu = cpu_mfu(
            peak_flops, peak_flops if fp32 else cpu_peak_flops(torch.float32, torch.get_num_threads())
        )
    elif mfu is None:
        mfu = DEFAULT_MFU
    kind = "cpu" if device == "cpu" else "cuda"
    activations = activation_bytes(config, max_tokens, max_tokens, precision, kind, src_len, tgt_len)
    per_token = training_flops_per_token(
        config,
        src_len,
        tgt_len,
        frozen=trainable is not None and trainable < parameters,
        recomputed=config.activation_checkpointing,  # the layers' forward runs again in the backward
    )["per_token"]
    compute = per_token * 2 * max_tokens * accumulate / (peak_flops * mfu)
    if host_seconds_per_batch is None:
        layers = config.encoder_layers + config.decoder_layers
        host_seconds_per_batch = 0.0 if device == "cpu" else layers * GPU_HOST_SECONDS_PER_LAYER
    host = accumulate * host_seconds_per_batch
    step = max(compute, host)
    steps, run, bounded_by = None, None, ""
    if max_steps and max_steps > 0:
        steps, run, bounded_by = max_steps, max_steps * step, "max_steps"
    if max_time_seconds and (run is None or max_time_seconds < run):
        steps, run, bounded_by = int(max_time_seconds / step), max_time_seconds, "max_time"
    return RunEstimate(
        device=label,
        precision=precision,
        peak_flops=peak_flops,
        peak_source=source,
        mfu=mfu,
        parameters=parameters,
        trainable=trainable,
        activation_bytes=activations,
        device_memory_gib=memory,
        step_seconds=step,
        steps=steps,
        run_seconds=run,
        bounded_by=bounded_by,
        compute_seconds=compute,
        host_seconds=host,
        batches=accumulate,
        captured_bytes=pool_bytes(activations) if captured else 0,
        unchecked_activation_bytes=activation_bytes(
            dataclasses.replace(config, activation_checkpointing=False),
            max_tokens,
            max_tokens,
            precision,
            kind,
            src_len,
            tgt_len,
        )
        if config.activation_checkpointing
        else 0,
    )
