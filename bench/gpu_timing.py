"""The one timed loop of ``bench_gpu.py``'s training rows and of its peers: warm-up steps, then timed optimizer
steps of ``accumulate`` batches each, every figure counted from the batches themselves.

A row's micro-batch step is the only thing that differs between rows (``plain``, ``fused``, ``compiled``, the
captured ones, the peers): it runs a batch's forward and backward and returns its loss per target token. The
loop around it is the same for every row: the batch copied to the device inside the timed region, one
finite-loss check and read-back per optimizer step (``TranslationTask``'s check), fused AdamW (through the
``GradScaler`` in fp16), the gradients cleared, and the device synchronized only where timing starts and
ends. Autocast runs without its cast cache (``cache_enabled=False``), as Lightning's mixed precision runs it
for ``attnx fit``, and as a captured graph needs (the cache would replay the warm-up's casts of the weights).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from harness import batch_flops
from torch import Tensor

from attnx.data.batch import Batch
from attnx.model import TransformerConfig

PRECISIONS = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16, "fp32": None}
"""``--precision`` choices and their autocast dtypes."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast of ``precision`` without its cast cache (nothing in fp32)."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


@dataclass
class Timed:
    """What a timed run trained on and how long it took: the figures every row reports."""

    steps: int = 0
    seconds: float = math.nan
    warmup_seconds: float = math.nan
    tokens: int = 0
    target_tokens: int = 0
    padded_tokens: int = 0
    flops: float = 0.0
    losses: list[float] = field(default_factory=list)

    def count(self, config: TransformerConfig, batch: Batch) -> None:
        self.tokens += batch.n_src_tokens + batch.n_tgt_tokens
        self.target_tokens += batch.n_tgt_tokens
        self.padded_tokens += batch.src.numel() + batch.tgt_out.numel()
        self.flops += batch_flops(config, batch)

    def rates(self, peak: float) -> dict[str, float]:
        """Real source + target tokens/s, target tokens/s (fairseq's wps), ms a step, MFU over ``peak``, and
        the padded share of the timed batches."""
        return {
            "tokens_per_s": self.tokens / self.seconds,
            "target_tokens_per_s": self.target_tokens / self.seconds,
            "ms_per_step": 1000 * self.seconds / max(self.steps, 1),
            "mfu": self.flops / self.seconds / peak,
            "padding": 1 - self.tokens / max(self.padded_tokens, 1),
        }


MicroStep = Callable[[Batch], Tensor]
"""A batch (on the device) through forward and backward; returns its loss per target token, detached."""


def timed_steps(
    timed: Timed,
    config: TransformerConfig,
    batches: list[Batch],
    accumulate: int,
    warmup: int,
    micro: MicroStep,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    scaler: torch.amp.GradScaler | None = None,
    keep_grads: bool = False,
    check_each_batch: bool = False,
    timing_starts: Callable[[], None] | None = None,
) -> Timed:
    """``warmup`` untimed, then timed optimizer steps of ``accumulate`` batches each into ``timed``.

    ``keep_grads``: zero the gradients in place (captured steps add into those very tensors), else set them to
    None. ``check_each_batch``: read each batch's loss back (``--nan_check batch``: the host waits for the
    device at every batch) instead of once a step. ``timing_starts``: called where timing starts.
    """
    steps = len(batches) // accumulate
    start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            sync(device)
            timed.warmup_seconds = time.perf_counter() - start
            if timing_starts is not None:
                timing_starts()
            start = time.perf_counter()
        total = torch.zeros((), device=device)
        for batch in batches[step * accumulate : (step + 1) * accumulate]:
            batch = batch.to(device)
            loss = micro(batch)
            if check_each_batch and not torch.isfinite(loss):
                raise FloatingPointError(f"loss {float(loss)} at step {step}")
            total += loss
            if step >= warmup:
                timed.count(config, batch)
        if not torch.isfinite(total):  # TranslationTask's check: one read-back per optimizer step
            raise FloatingPointError(f"loss {float(total) / accumulate} at step {step}")
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=not keep_grads)
        timed.losses.append(float(total) / accumulate)
    sync(device)
    timed.seconds = time.perf_counter() - start
    timed.steps = steps - warmup
    return timed


def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """The paper's Adam (β 0.9, 0.98, ε 1e-9), fused, at a fixed small rate: every row and peer steps alike."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
