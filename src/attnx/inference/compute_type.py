"""The CTranslate2 compute type an export decodes in: `auto` (every entry point's default) takes the fastest of
those CTranslate2 supports on the device, timed by a short probe of the model itself; a precision given takes
its matching type ([`COMPUTE_TYPES`][attnx.inference.compute_type.COMPUTE_TYPES]).

The probe loads the export in each supported type and times a beam search of a fixed batch (16 sentences of 20
pieces, 16 output tokens each, ends forbidden until then, so every type does the same work), the types in
turns, best of [`PROBE_REPEATS`][attnx.inference.compute_type.PROBE_REPEATS]. Which type wins depends on the CPU: CTranslate2's
int8 needs fast integer dot products (AVX512-VNNI, AMX) to beat its float32, and on some CPUs with them it
still does not. The choice is said on standard error in one line. The timings are kept per machine kind,
CTranslate2 version, device, thread count and model shape ([`attnx.choices`][attnx.choices]), so every later
command decodes such an export in the same type; within a process it is settled once for each export, device and
thread count; [`compute_type_probe`][attnx.inference.compute_type.compute_type_probe] replaces
the timing (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnx.checkpoint.digests import check_digests
from attnx.choices import Remembered, machine_key
from attnx.data.batch import EOS_ID
from attnx.data.tokenizer import Tokenizer
from attnx.inference.config import AUTO, check_precision
from attnx.inference.ctranslate2 import METADATA, SPM_MODEL, import_ctranslate2, read_metadata
from attnx.inference.probes import ProbeCache

COMPUTE_TYPES = {"32-true": "float32", "bf16-mixed": "bfloat16", "16-mixed": "float16"}
"""The CTranslate2 compute type an export is loaded with for each precision a checkpoint decodes in."""
PROBE_SENTENCES = 16
PROBE_SOURCE_PIECES = 20
PROBE_TARGET_TOKENS = 16
PROBE_BEAM = 4
PROBE_REPEATS = 3
"""Timed searches per compute type (after a warm-up); the fastest counts, as a busy machine slows some runs."""

Timer = Callable[[Path, torch.device, int, Sequence[str]], dict[str, float]]
"""Seconds each compute type takes on the probe batch: `(directory, device, threads, types)` → by type."""


@dataclass(frozen=True)
class ComputeTypeChoice:
    """A CTranslate2 compute type and why it was chosen."""

    compute_type: str
    reason: str

    def line(self) -> str:
        return (
            f"decoding in CTranslate2 {self.compute_type}: {self.reason} "
            "(--precision 32-true to decode in float32)"
        )


def supported_compute_types(device: torch.device) -> list[str]:
    """The compute types CTranslate2 runs on `device`, float32 first, then by name."""
    ct2 = import_ctranslate2()
    types = set(ct2.get_supported_compute_types(device.type, device.index or 0))
    return sorted(types, key=lambda t: (t != "float32", t))


def probe_batch(vocab_size: int) -> list[list[int]]:
    """The probe's source ids: fixed pseudo-random pieces (no special ones), the same on every call."""
    draw = random.Random(0)
    return [
        [draw.randrange(4, vocab_size) for _ in range(PROBE_SOURCE_PIECES)] for _ in range(PROBE_SENTENCES)
    ]


def time_compute_types(
    directory: Path, device: torch.device, threads: int, types: Sequence[str]
) -> dict[str, float]:
    """Seconds a beam search of the probe batch takes with the export loaded in each of `types`: every type
    loaded and warmed up first, then timed in turns (so a busy machine, or a cost the process pays once,
    slows all alike), the best of [`PROBE_REPEATS`][attnx.inference.compute_type.PROBE_REPEATS] each."""
    ct2 = import_ctranslate2()
    meta = read_metadata(directory) or {}
    tokenizer = Tokenizer.load(directory / meta.get("tokenizer", SPM_MODEL))
    sp = tokenizer.sp
    end = sp.id_to_piece(EOS_ID)
    sources = [[sp.id_to_piece(i) for i in ids] + [end] for ids in probe_batch(tokenizer.vocab_size)]
    options: dict[str, Any] = dict(
        beam_size=PROBE_BEAM,
        max_decoding_length=PROBE_TARGET_TOKENS,
        min_decoding_length=PROBE_TARGET_TOKENS,  # the same work in every type: no sentence ends early
        max_input_length=0,
    )
    translators = {
        t: ct2.Translator(
            str(directory),
            device=device.type,
            device_index=device.index or 0,
            compute_type=t,
            intra_threads=threads,
        )
        for t in types
    }
    for translator in translators.values():
        translator.translate_batch(sources, **options)  # warm-up: thread pool, kernel selection
    best = dict.fromkeys(types, float("inf"))
    for _ in range(PROBE_REPEATS):
        for t, translator in translators.items():
            start = time.perf_counter()
            translator.translate_batch(sources, **options)
            best[t] = min(best[t], time.perf_counter() - start)
    return best


def fastest(seconds: dict[str, float]) -> ComputeTypeChoice:
    """The fastest compute type of `seconds` (each type's probe time), with the reason that names the others
    as multiples of its speed."""
    best = min(seconds, key=lambda t: (seconds[t], t != "float32"))
    others = [f"{t} {seconds[best] / s:.2f}x" for t, s in seconds.items() if t != best]
    if not others:
        return ComputeTypeChoice(best, "the only compute type CTranslate2 supports on this device")
    return ComputeTypeChoice(best, f"the fastest here by a probe ({', '.join(others)} its speed)")


def measured_by(timer: Timer, keep: bool = False) -> Callable[..., ComputeTypeChoice]:
    """What measures `auto`'s choice for an export with `timer`: its files checked first (a damaged model.bin
    is not timed), then the fastest of the candidates (default: those CTranslate2 supports on the device).
    With `keep`, the timings are kept per machine kind, CTranslate2 version, device, threads and model shape
    ([`attnx.choices`][attnx.choices]) and read back by later commands instead of timing again."""

    def measure(
        directory: Path, device: torch.device, threads: int, types: Sequence[str] | None
    ) -> ComputeTypeChoice:
        meta = read_metadata(directory) or {}
        check_digests(directory, meta, METADATA)
        candidates = list(types) if types is not None else supported_compute_types(device)
        if not keep:
            return fastest(timer(directory, device, threads, candidates))
        seconds = Remembered(
            machine_key(
                "ctranslate2 compute types",
                import_ctranslate2().__version__,
                device,
                threads,
                candidates,
                meta.get("transformer"),
                meta.get("quantization"),
            ),
            lambda: timer(directory, device, threads, candidates),
            f"seconds of a CTranslate2 beam search in each compute type, {device} (decoding an export, auto)",
        )
        choice = fastest(seconds())
        if seconds.busy:  # the type the export was written in
            own = str(meta.get("quantization") or "float32")
            own = own if own in candidates else "float32"
            return ComputeTypeChoice(own, seconds.noted(f"the export's own type, {own}"))
        return ComputeTypeChoice(choice.compute_type, seconds.noted(choice.reason))

    return measure


_probe: ProbeCache[Callable[..., ComputeTypeChoice], ComputeTypeChoice] = ProbeCache(
    measured_by(time_compute_types, keep=True), ComputeTypeChoice.line
)


def compute_type_probe(timer: Timer, say: bool = True) -> contextlib.AbstractContextManager:
    """Within the block, `auto` times compute types with `timer` (afresh, cached for the block); without
    `say`, nothing is said in the block."""
    return _probe.replaced(measured_by(timer), say)


def auto_compute_type(
    directory: str | Path,
    device: str | torch.device,
    threads: int = 0,
    types: Sequence[str] | None = None,
    say: bool = True,
) -> ComputeTypeChoice:
    """What `auto` decodes the export `directory` in on `device`: probed on the first call for this export,
    device and thread count, then the same answer for the rest of the process; with `say`, its line goes to
    standard error once. `types`: the candidates (default: those CTranslate2 supports on `device`)."""
    directory, device = Path(directory), torch.device(device)
    key = (str(directory.resolve()), str(device), threads)
    return _probe.choice(key, directory, device, threads, types, say=say)


def resolve_compute_type(precision: str | None, device: str | torch.device) -> str:
    """The compute type an export decodes in: the one matching `precision`, or `auto` for `auto` (and None),
    which [`auto_compute_type`][attnx.inference.compute_type.auto_compute_type] then measures."""
    if precision is None or precision == AUTO:
        return AUTO
    check_precision(precision, torch.device(device).type)
    return COMPUTE_TYPES[precision]
