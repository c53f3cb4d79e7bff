"""The precision to train in on CPU, chosen from what the CPU has: bf16-mixed where it has bf16 units that pay,
fp32 elsewhere.

`attnx fit` with `trainer.precision` unset (`null`) on CPU asks [`choose_cpu_precision`][attnx.training.precision.choose_cpu_precision]
and prints its answer once, e.g. `precision: bf16-mixed (CPU has AMX)`; any explicit
`--trainer.precision` is kept as given (bf16 on a CPU without bf16 units with one warning line,
[`emulated_bf16_line`][attnx.training.precision.emulated_bf16_line]), and GPU runs are left to Lightning. The
rule:

* AMX (`lscpu` flags `amx_bf16` and `amx_tile`): bf16-mixed. bf16 matrix products run ~7× fp32 there.
* AVX512-BF16 without AMX (e.g. AMD Zen 4): bf16-mixed only if a short probe at start measures bf16 matrix
  products at least [`MIN_BF16_SPEEDUP`][attnx.training.precision.MIN_BF16_SPEEDUP] × fp32, fp32 otherwise.
* No bf16 units (AVX2 only): fp32. bf16 there is emulated and up to ~90× slower.

The probe's ratio is kept per machine kind ([`attnx.choices`][attnx.choices]): later runs, resumes and `attnx
describe` take the same precision, and with it the same shape buckets and batches, without timing again
([`kept_cpu_precision`][attnx.training.precision.kept_cpu_precision]).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import yaml

from attnx.choices import Remembered, machine_key
from attnx.inference.precision import (
    AMX_FLAGS,
    AVX512_BF16_FLAG,
    BF16,
    FP32,
    TRAINING_SHAPE,
    PrecisionChoice,
    bf16_matmul_speedup,
    choose_bf16,
    cpu_flags,
)

__all__ = [
    "AMX_FLAGS",
    "AVX512_BF16_FLAG",
    "BF16",
    "FP32",
    "MIN_BF16_SPEEDUP",
    "PrecisionChoice",
    "bf16_matmul_speedup",
    "choose_cpu_precision",
    "cpu_flags",
    "cpu_has_bf16_units",
    "emulated_bf16_line",
    "kept_cpu_precision",
    "recorded_precision",
    "resolve_cpu_precision",
    "trains_on_cpu",
]

MIN_BF16_SPEEDUP = 1.3
"""bf16 matrix products must run at least this many times fp32 for bf16-mixed to be chosen without AMX: a
training step also spends time outside matrix products (casts, softmax, dropout, the optimizer) that bf16 does
not speed up."""


def choose_cpu_precision(
    flags: Iterable[str], speedup: Callable[[], float] = bf16_matmul_speedup
) -> PrecisionChoice:
    """bf16-mixed with AMX; with AVX512-BF16 alone, bf16-mixed if `speedup()` (bf16 over fp32 matrix
    products of a training batch's shape, called only then) reaches
    [`MIN_BF16_SPEEDUP`][attnx.training.precision.MIN_BF16_SPEEDUP]; fp32 otherwise. The rule and the probe are
    decoding's ([`choose_bf16`][attnx.inference.precision.choose_bf16]) with training's shape and threshold."""
    return choose_bf16(flags, speedup, MIN_BF16_SPEEDUP)


def kept_cpu_precision(flags: Iterable[str] | None = None) -> PrecisionChoice:
    """[`choose_cpu_precision`][attnx.training.precision.choose_cpu_precision] for this CPU (`flags`: its
    flags), with the probe's ratio measured once per machine kind and kept ([`attnx.choices`][attnx.choices]);
    the reason says how it was settled."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    speedup = Remembered(
        machine_key("bf16 over fp32 training matrix products", TRAINING_SHAPE),
        bf16_matmul_speedup,
        "bf16 over fp32 matrix-product speed of a training batch (attnx fit, trainer.precision null)",
    )
    choice = choose_cpu_precision(flags, speedup)
    if speedup.busy:
        return PrecisionChoice(FP32, speedup.noted("CPU has AVX512-BF16, bf16 not measured"))
    return PrecisionChoice(choice.precision, speedup.noted(choice.reason))


def trains_on_cpu(accelerator: Any) -> bool:
    """Whether a Trainer with this `accelerator` setting runs on the CPU."""
    accelerator = str(accelerator or "auto")
    if accelerator == "cpu":
        return True
    return accelerator == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available()


def recorded_precision(log_dir: Path | None) -> str | None:
    """The precision a run trained in, as its folder's `config.yaml` records it (None where it records none)."""
    try:
        with open(Path(log_dir) / "config.yaml", encoding="utf-8") as f:
            trainer = (yaml.safe_load(f) or {}).get("trainer") or {}
    except (OSError, TypeError, AttributeError, yaml.YAMLError):
        return None
    precision = trainer.get("precision") if isinstance(trainer, dict) else None
    return str(precision) if precision not in (None, "auto") else None


def resolve_cpu_precision(trainer: Any, log_dir: Path | None = None) -> PrecisionChoice | None:
    """Set `trainer["precision"]` where it is unset and the run is on CPU: for a resumed run (`log_dir`, its
    folder) the precision it trained in, else the CPU's ([`kept_cpu_precision`][attnx.training.precision.kept_cpu_precision]);
    returns the choice made, or None where the config's own value (or Lightning's GPU default) stands."""
    if trainer.get("precision") is not None or not trains_on_cpu(trainer.get("accelerator")):
        return None
    recorded = recorded_precision(log_dir) if log_dir is not None else None
    if recorded is not None:
        choice = PrecisionChoice(
            recorded, f"the precision this run trained in, recorded in {log_dir}/config.yaml"
        )
    else:
        choice = kept_cpu_precision()
    trainer["precision"] = choice.precision
    return choice


def cpu_has_bf16_units() -> bool | None:
    """Whether this CPU computes bf16 in hardware: AVX512-BF16 or AMX among its flags (`/proc/cpuinfo`; torch's
    own `torch.backends.cpu.get_cpu_capability()` names the vector width only). None where the flags cannot be
    read (not Linux, or a CPU that lists them otherwise): unknown, never warned about."""
    flags = cpu_flags()
    if not flags:
        return None
    return AVX512_BF16_FLAG in flags or flags >= AMX_FLAGS


def emulated_bf16_line(trainer: Any) -> str | None:
    """The warning `attnx fit` prints where `trainer.precision` asks for bf16 (`bf16-mixed`, `bf16-true`) on a
    CPU without bf16 units ([`cpu_has_bf16_units`][attnx.training.precision.cpu_has_bf16_units]): every bf16
    product is emulated there, up to ~90x slower than fp32. None elsewhere."""
    precision = str(trainer.get("precision") or "")
    if not precision.startswith("bf16") or not trains_on_cpu(trainer.get("accelerator")):
        return None
    if cpu_has_bf16_units() is not False:
        return None
    return (
        f"trainer.precision {precision} on a CPU without bf16 units (no AVX512-BF16 or AMX): bf16 is emulated "
        "there and trains many times slower than fp32: use --trainer.precision 32-true"
    )
