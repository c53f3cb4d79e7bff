"""What a checkpoint decodes in: `auto`, every decoding entry point's default, chosen once per process from a
probe of the device; or the precision given.

`auto` decodes in bf16-mixed where the device's bf16 units make decoding faster, else in 32-true, and says
which on standard error in one line, e.g. `decoding in bf16-mixed: CPU has AVX512-BF16; bf16 decoding-shaped
matrix products measured 3.1x fp32 (--precision 32-true to override)`. The rule
([`choose_bf16`][attnx.inference.precision.choose_bf16]) is the one `attnx fit` trains by
([`attnx.training.precision`][attnx.training.precision]), with a probe shaped like a search step:

* AMX (`lscpu` flags `amx_bf16` and `amx_tile`): bf16-mixed, without probing.
* AVX512-BF16 without AMX (e.g. AMD Zen 4): bf16-mixed only if bf16 products of a beam-search step's shape,
  the cast of their fp32 input included, run at least
  [`MIN_DECODE_BF16_SPEEDUP`][attnx.inference.precision.MIN_DECODE_BF16_SPEEDUP] × fp32's.
* No bf16 units (AVX2 only): 32-true; bf16 there is emulated and decodes several times slower.
* CUDA: bf16-mixed where the device computes bf16 and the same probe, run on it, reaches that ratio; 32-true
  elsewhere (a search step's products are small: on a GPU they are bound by launches, not arithmetic).

The probe is measured once per process and device kind; [`decoding_probe`][attnx.inference.precision.decoding_probe]
replaces it (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from attnx.inference.config import AUTO, check_precision

AMX_FLAGS = frozenset({"amx_bf16", "amx_tile"})
AVX512_BF16_FLAG = "avx512_bf16"
FP32 = "32-true"
BF16 = "bf16-mixed"

TRAINING_SHAPE = (2048, 256, 1024)
"""`(M, K, N)` of the product `attnx fit`'s probe times: a training batch's tokens through a projection."""
DECODING_SHAPE = (256, 512, 2048)
"""`(M, K, N)` of the product the decoding probe times: one beam-search step of 64 sentences × beam 4 through a
base model's feed-forward layer. Decoding runs products this small at every step, where a bf16 unit gains less
than on training's large ones."""
MIN_DECODE_BF16_SPEEDUP = 1.3
"""bf16 decoding-shaped products (their input's cast included) must run at least this many times fp32's for
`auto` to decode in bf16-mixed without AMX. The cast is in the ratio already, so any ratio above 1 shortens the
products; the margin is for what the probe leaves out (autocast's bookkeeping on each small product of a
search step) and for a probe that a busy machine slows unevenly."""
DECODE_PROBE_SECONDS = 0.3
"""How long the decoding probe times products: twice training's, as its products are smaller and a busy
machine's noise weighs more on each."""


@dataclass(frozen=True)
class PrecisionChoice:
    """A precision and why it was chosen."""

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


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (`/proc/cpuinfo`), or `unknown CPU` where it cannot be read."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"


def bf16_matmul_speedup(
    seconds: float = 0.15,
    shape: tuple[int, int, int] = TRAINING_SHAPE,
    cast_input: bool = False,
    device: str | torch.device = "cpu",
) -> float:
    """bf16 over fp32 matrix-product rate now, on `(M, K) @ (K, N)` of `shape`, with the threads PyTorch uses;
    the two dtypes alternate so that a busy machine slows both alike. `cast_input`: the bf16 side casts its
    fp32 left operand first, as autocast does to every activation (the weight's cast is cached)."""
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)  # leaves the global random state alone
    m, k, n = shape
    a = torch.randn(m, k, generator=generator).to(device)  # (M, K)
    b = torch.randn(k, n, generator=generator).to(device)  # (K, N)
    a16, b16 = a.bfloat16(), b.bfloat16()
    runs: dict[torch.dtype, Callable[[], torch.Tensor]] = {
        torch.float32: lambda: a @ b,
        torch.bfloat16: (lambda: a.bfloat16() @ b16) if cast_input else (lambda: a16 @ b16),
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


def decoding_speedup(device: str | torch.device = "cpu") -> float:
    """bf16 over fp32 rate of decoding-shaped products on `device`, their input's cast included."""
    return bf16_matmul_speedup(DECODE_PROBE_SECONDS, DECODING_SHAPE, cast_input=True, device=device)


def probe_device(device: torch.device) -> PrecisionChoice:
    """The precision `auto` decodes in on `device` (`cpu` or `cuda[:N]`), measured now."""
    what = "bf16 decoding-shaped matrix products"
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            return PrecisionChoice(FP32, f"{torch.cuda.get_device_name(device)} has no bf16 units")
        ratio = decoding_speedup(device)
        name = torch.cuda.get_device_name(device)
        if ratio >= MIN_DECODE_BF16_SPEEDUP:
            return PrecisionChoice(BF16, f"{what} measured {ratio:.1f}x fp32 on {name}")
        return PrecisionChoice(
            FP32, f"{what} measured only {ratio:.1f}x fp32 on {name} (below {MIN_DECODE_BF16_SPEEDUP}x)"
        )
    if device.type != "cpu":
        return PrecisionChoice(FP32, f"no probe for {device.type} devices")
    return choose_bf16(cpu_flags(), decoding_speedup, MIN_DECODE_BF16_SPEEDUP, what)


Probe = Callable[[torch.device], PrecisionChoice]
"""What `auto` asks: the precision to decode in on a device, and why."""

_probe: Probe = probe_device
_chosen: dict[str, PrecisionChoice] = {}
_quiet = False
_said: set[str] = set()


@contextlib.contextmanager
def decoding_probe(probe: Probe, say: bool = True) -> Iterator[None]:
    """Within the block, `auto` asks `probe` (measured afresh, cached for the block) instead of this device; without
    `say`, nothing is said in the block (a test process whose other tests count output lines)."""
    global _probe, _quiet
    saved, cached, said = _probe, dict(_chosen), set(_said)
    _probe = probe
    _chosen.clear()
    _said.clear()
    quiet, _quiet = _quiet, not say
    try:
        yield
    finally:
        _probe = saved
        _chosen.clear()
        _chosen.update(cached)
        _said.clear()
        _said.update(said)
        _quiet = quiet


def auto_precision(device: str | torch.device, say: bool = True) -> PrecisionChoice:
    """What `auto` decodes in on `device`: probed on the first call for its kind (and CUDA index), then the
    same answer for the rest of the process. With `say`, its line goes to standard error, once per process
    (a command that resolves `auto` before loading says it once the model has loaded)."""
    device = torch.device(device)
    key = str(device) if device.type == "cuda" else device.type
    if key not in _chosen:
        _chosen[key] = _probe(device)
    if say and not _quiet and key not in _said:
        _said.add(key)
        print(announcement(_chosen[key]), file=sys.stderr, flush=True)
    return _chosen[key]


def announcement(choice: PrecisionChoice) -> str:
    """The line `auto` prints: what decoding runs in, why, and how to choose otherwise."""
    other = FP32 if choice.precision == BF16 else BF16
    return f"decoding in {choice.precision}: {choice.reason} (--precision {other} to override)"


def resolve_precision(precision: str | None, device: str | torch.device, say: bool = True) -> str:
    """The precision a checkpoint decodes in on `device`: `precision` itself, checked, or for `auto` (and
    None) [`auto_precision`][attnx.inference.precision.auto_precision]'s choice (said with `say`)."""
    device = torch.device(device)
    if precision is None or precision == AUTO:
        return auto_precision(device, say).precision
    check_precision(precision, device.type)
    return precision
