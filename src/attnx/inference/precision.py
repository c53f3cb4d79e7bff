"""What a checkpoint decodes in: `auto`, every decoding entry point's default, chosen once per process for
each model and device from a probe of the model itself; or the precision given.

`auto` decodes in bf16-mixed where the model's own beam-search steps run faster in bf16 on this device, else in
32-true, and says which on standard error in one line, e.g. `decoding in bf16-mixed: CPU has AVX512-BF16; this
model's beam-search steps measured 1.6x fp32 (--precision 32-true to override)`. The rule
([`choose_bf16`][attnx.inference.precision.choose_bf16]) is the one `attnx fit` trains by
([`attnx.training.precision`][attnx.training.precision]), with the probe of decoding
([`bf16_decoding_speedup`][attnx.inference.step_probe.bf16_decoding_speedup]):

* AMX (`lscpu` flags `amx_bf16` and `amx_tile`): bf16-mixed, without probing.
* AVX512-BF16 without AMX (e.g. AMD Zen 4 and 5): bf16-mixed only if the model's steps in bf16 run at least
  [`MIN_DECODE_BF16_SPEEDUP`][attnx.inference.precision.MIN_DECODE_BF16_SPEEDUP] × fp32's.
* No bf16 units (AVX2 only): 32-true; bf16 there is emulated and decodes several times slower.
* CUDA: bf16-mixed where the device computes bf16 and the same probe, run on it, reaches that ratio; 32-true
  elsewhere (a search step's products are small: on a GPU they are bound by launches, not arithmetic).

The probe's ratio is kept per machine kind, library versions and model shape ([`attnx.choices`][attnx.choices]):
every later command, a resumed translation included, decodes such a model in the same precision without
timing again, and a probe taken on a busy machine says so and is not kept. Within a process the choice is made
once for each device and model shape;
[`decoding_probe`][attnx.inference.precision.decoding_probe] replaces the probe (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnx.choices import Remembered, cpuinfo_field, machine_key
from attnx.inference.config import AUTO, check_precision
from attnx.inference.decoder import Decoder, as_decoder
from attnx.inference.probes import ProbeCache
from attnx.inference.step_probe import bf16_decoding_speedup, model_signature

AMX_FLAGS = frozenset({"amx_bf16", "amx_tile"})
AVX512_BF16_FLAG = "avx512_bf16"
FP32 = "32-true"
BF16 = "bf16-mixed"

TRAINING_SHAPE = (2048, 256, 1024)
"""`(M, K, N)` of the product `attnx fit`'s probe times: a training batch's tokens through a projection."""
MIN_DECODE_BF16_SPEEDUP = 1.15
"""The model's beam-search steps in bf16-mixed must run at least this many times fp32's for `auto` to decode in
bf16 without AMX: bf16 rounds the products, so it is taken only where it pays, with a margin for a probe that a
busy machine slows unevenly."""


@dataclass(frozen=True)
class PrecisionChoice:
    """A precision and why it was chosen."""

    precision: str
    reason: str

    def line(self) -> str:
        return f"precision: {self.precision} ({self.reason})"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as `lscpu` lists them (Linux); empty where they cannot be read."""
    return frozenset((cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (`/proc/cpuinfo`), or `unknown CPU` where it cannot be read."""
    found = cpuinfo_field("model name", cpuinfo)
    return found if found is not None else "unknown CPU"


def bf16_matmul_speedup(
    seconds: float = 0.15,
    shape: tuple[int, int, int] = TRAINING_SHAPE,
    device: str | torch.device = "cpu",
) -> float:
    """bf16 over fp32 matrix-product rate now, on `(M, K) @ (K, N)` of `shape`, with the threads PyTorch uses;
    the two dtypes alternate so that a busy machine slows both alike."""
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)  # leaves the global random state alone
    m, k, n = shape
    a = torch.randn(m, k, generator=generator).to(device)  # (M, K)
    b = torch.randn(k, n, generator=generator).to(device)  # (K, N)
    a16, b16 = a.bfloat16(), b.bfloat16()
    runs: dict[torch.dtype, Callable[[], torch.Tensor]] = {
        torch.float32: lambda: a @ b,
        torch.bfloat16: lambda: a16 @ b16,
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = {dtype: float("inf") for dtype in runs}
    for run in runs.values():
        run()  # warm-up: thread pool, oneDNN kernel selection
    sync()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or any(t == float("inf") for t in best.values()):
        for dtype, run in runs.items():
            start = time.perf_counter()
            run()
            sync()
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def choose_bf16(
    flags: Iterable[str], speedup: Callable[[], float], minimum: float, what: str = "bf16 matrix products"
) -> PrecisionChoice:
    """bf16-mixed with AMX; with AVX512-BF16 alone, bf16-mixed if `speedup()` (bf16 over fp32, called only
    then) reaches `minimum`; 32-true otherwise. `what` names what `speedup` measures, in the reason."""
    flags = frozenset(flags)
    if flags >= AMX_FLAGS:
        return PrecisionChoice(BF16, "CPU has AMX")
    if AVX512_BF16_FLAG in flags:
        ratio = speedup()
        if ratio >= minimum:
            return PrecisionChoice(BF16, f"CPU has AVX512-BF16; {what} measured {ratio:.1f}x fp32")
        return PrecisionChoice(
            FP32, f"CPU has AVX512-BF16 but {what} measured only {ratio:.1f}x fp32 (below {minimum}x)"
        )
    return PrecisionChoice(FP32, "CPU has no bf16 units")


def kept_decoding_speedup(decoder: Decoder, device: torch.device) -> Remembered[float]:
    """[`bf16_decoding_speedup`][attnx.inference.step_probe.bf16_decoding_speedup] of `decoder` on `device`,
    measured once per machine kind and model shape and kept ([`attnx.choices`][attnx.choices])."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return Remembered(
        machine_key("bf16 over fp32 decoding steps", name, model_signature(decoder)),
        lambda: bf16_decoding_speedup(decoder, device),
        f"bf16-mixed over 32-true beam-search step speed of a model, {name} (decoding --precision auto)",
    )


def probe_device(device: torch.device, decoder: Decoder) -> PrecisionChoice:
    """The precision `auto` decodes `decoder` in on `device` (`cpu` or `cuda[:N]`, where its models are):
    from its probe's ratio, kept per machine kind and model shape (measured where none is kept)."""
    what = "this model's beam-search steps"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if not torch.cuda.is_bf16_supported():
            return PrecisionChoice(FP32, f"{name} has no bf16 units")
        speedup = kept_decoding_speedup(decoder, device)
        ratio = speedup()
        if speedup.busy:
            return PrecisionChoice(FP32, speedup.noted(f"{name} has bf16 units, bf16 not measured"))
        if ratio >= MIN_DECODE_BF16_SPEEDUP:
            return PrecisionChoice(BF16, speedup.noted(f"{what} measured {ratio:.1f}x fp32 on {name}"))
        return PrecisionChoice(
            FP32,
            speedup.noted(
                f"{what} measured only {ratio:.1f}x fp32 on {name} (below {MIN_DECODE_BF16_SPEEDUP}x)"
            ),
        )
    if device.type != "cpu":
        return PrecisionChoice(FP32, f"no probe for {device.type} devices")
    speedup = kept_decoding_speedup(decoder, device)
    choice = choose_bf16(cpu_flags(), speedup, MIN_DECODE_BF16_SPEEDUP, what)
    if speedup.busy:
        return PrecisionChoice(FP32, speedup.noted("CPU has AVX512-BF16, bf16 not measured"))
    return PrecisionChoice(choice.precision, speedup.noted(choice.reason))


Probe = Callable[[torch.device, Decoder], PrecisionChoice]
"""What `auto` asks: the precision to decode a model (behind its decoder) in on a device, and why."""


def announcement(choice: PrecisionChoice) -> str:
    """The line `auto` prints: what decoding runs in, why, and how to choose otherwise."""
    other = FP32 if choice.precision == BF16 else BF16
    return f"decoding in {choice.precision}: {choice.reason} (--precision {other} to override)"


_probe: ProbeCache[Probe, PrecisionChoice] = ProbeCache(probe_device, announcement)


def decoding_probe(probe: Probe, say: bool = True) -> contextlib.AbstractContextManager:
    """Within the block, `auto` asks `probe` (measured afresh, cached for the block) instead of the model;
    without `say`, nothing is said in the block (a test process whose other tests count output lines)."""
    return _probe.replaced(probe, say)


def auto_precision(decoder: Decoder | nn.Module, say: bool = True) -> PrecisionChoice:
    """What `auto` decodes `decoder` (or a model) in on its models' device: probed on the first call for that
    device (its CUDA index) and model shape, then the same answer for the rest of the process. With `say`, its
    line goes to standard error, once per process (a command that resolves `auto` before decoding says it once
    the model has loaded)."""
    decoder = as_decoder(decoder)
    device = next(decoder.models[0].parameters()).device
    key = (str(device) if device.type == "cuda" else device.type, model_signature(decoder))
    return _probe.choice(key, device, decoder, say=say)


def resolve_precision(precision: str | None, decoder: Decoder | nn.Module, say: bool = True) -> str:
    """The precision `decoder` (or a model) decodes in on its device: `precision` itself, checked, or for `auto`
    (and None) [`auto_precision`][attnx.inference.precision.auto_precision]'s choice (said with `say`)."""
    decoder = as_decoder(decoder)
    if precision is None or precision == AUTO:
        return auto_precision(decoder, say).precision
    check_precision(precision, next(decoder.models[0].parameters()).device.type)
    return precision
