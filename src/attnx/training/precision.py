"""The precision to train in on CPU, chosen from what the CPU has: bf16-mixed where it has bf16 units that pay,
fp32 elsewhere.

`attnx fit` with `trainer.precision` unset (`null`) on CPU asks [`choose_cpu_precision`][attnx.training.precision.choose_cpu_precision]
and prints its answer once, e.g. `precision: bf16-mixed (CPU has AMX)`; any explicit
`--trainer.precision` is kept as given, and GPU runs are left to Lightning. The rule:

* AMX (`lscpu` flags `amx_bf16` and `amx_tile`): bf16-mixed. bf16 matrix products run ~7× fp32 there.
* AVX512-BF16 without AMX (e.g. AMD Zen 4): bf16-mixed only if a short probe at start measures bf16 matrix
  products at least [`MIN_BF16_SPEEDUP`][attnx.training.precision.MIN_BF16_SPEEDUP] × fp32, fp32 otherwise.
* No bf16 units (AVX2 only): fp32. bf16 there is emulated and up to ~90× slower.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

AMX_FLAGS = frozenset({"amx_bf16", "amx_tile"})
AVX512_BF16_FLAG = "avx512_bf16"
MIN_BF16_SPEEDUP = 1.3
"""bf16 matrix products must run at least this many times fp32 for bf16-mixed to be chosen without AMX: a
training step also spends time outside matrix products (casts, softmax, dropout, the optimizer) that bf16 does
not speed up."""

FP32 = "32-true"
BF16 = "bf16-mixed"


@dataclass(frozen=True)
class PrecisionChoice:
    """A Lightning precision and why it was chosen."""

    precision: str
    reason: str

    def line(self) -> str:
        return f"precision: {self.precision} ({self.reason})"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as `lscpu` lists them (Linux); empty where they cannot be read."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def bf16_matmul_speedup(seconds: float = 0.15) -> float:
    """bf16 over fp32 matrix-product rate now, on a Transformer-shaped product `(2048, 256) @ (256, 1024)`,
    with the threads PyTorch uses; the two dtypes alternate so that a busy machine slows both alike."""
    generator = torch.Generator().manual_seed(0)  # leaves the global random state alone
    a = torch.randn(2048, 256, generator=generator)
    b = torch.randn(256, 1024, generator=generator)
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = {dtype: float("inf") for dtype in pairs}
    for x, y in pairs.values():
        x @ y  # warm-up: thread pool, oneDNN kernel selection
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or any(t == float("inf") for t in best.values()):
        for dtype, (x, y) in pairs.items():
            start = time.perf_counter()
            x @ y
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def choose_cpu_precision(
    flags: Iterable[str], speedup: Callable[[], float] = bf16_matmul_speedup
) -> PrecisionChoice:
    """bf16-mixed with AMX; with AVX512-BF16 alone, bf16-mixed if `speedup()` (bf16 over fp32 matrix
    products, called only then) reaches [`MIN_BF16_SPEEDUP`][attnx.training.precision.MIN_BF16_SPEEDUP]; fp32 otherwise."""
    flags = frozenset(flags)
    if flags >= AMX_FLAGS:
        return PrecisionChoice(BF16, "CPU has AMX")
    if AVX512_BF16_FLAG in flags:
        ratio = speedup()
        if ratio >= MIN_BF16_SPEEDUP:
            return PrecisionChoice(
                BF16, f"CPU has AVX512-BF16; bf16 matrix products measured {ratio:.1f}x fp32"
            )
        return PrecisionChoice(
            FP32, f"CPU has AVX512-BF16 but bf16 matrix products measured only {ratio:.1f}x fp32"
        )
    return PrecisionChoice(FP32, "CPU has no bf16 units")


def trains_on_cpu(accelerator: Any) -> bool:
    """Whether a Trainer with this `accelerator` setting runs on the CPU."""
    accelerator = str(accelerator or "auto")
    if accelerator == "cpu":
        return True
    return accelerator == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available()


def resolve_cpu_precision(trainer: Any) -> PrecisionChoice | None:
    """Set `trainer["precision"]` from the CPU where it is unset and the run is on CPU; returns the choice
    made, or None where the config's own value (or Lightning's GPU default) stands."""
    if trainer.get("precision") is not None or not trains_on_cpu(trainer.get("accelerator")):
        return None
    choice = choose_cpu_precision(cpu_flags())
    trainer["precision"] = choice.precision
    return choice
