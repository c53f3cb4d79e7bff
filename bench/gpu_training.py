"""The training rows of ``bench_gpu.py``: the paper's models, and each row's micro-batch step run in the one
timed loop (``gpu_timing.timed_steps``): ``plain`` (``TranslationTask``'s step without Lightning), ``fused``
(pointwise tails compiled), ``compiled`` (layers ``torch.compile``'d), and the captured rows: ``graphs``
(attnx's ``StepEngine``, what ``attnx fit`` runs) and ``compile`` (``torch.compile(mode="reduce-overhead")``),
every shape of the batches captured or compiled before the timed steps, its time reported apart."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from gpu_timing import Timed, adamw, autocast, sync, timed_steps
from torch import Tensor

from attnx.components.loss import translation_loss
from attnx.data.batch import Batch
from attnx.model import Transformer, TransformerConfig, build_transformer

LABEL_SMOOTHING = 0.1

CAPTURED = {"graphs": "captured (CUDA graphs)", "compile": "compiled (reduce-overhead)"}
"""``--capture`` choices and their rows' variant."""


@dataclass
class TrainResult:
    """One training row: what it ran (model, precision, batches) and what the timed loop counted."""

    model: str
    precision: str
    max_tokens: int
    accumulate: int
    variant: str
    timed: Timed = field(default_factory=Timed)
    peak_memory_gib: float | None = None
    graphs_compiled_while_timed: int | None = None
    capture_seconds: float | None = None  # captured rows: capturing or compiling every shape, before timing
    error: str | None = None

    def record(self, peak: float, info: dict[str, Any]) -> dict[str, Any]:
        """The row for ``--json``: its settings, counts and rates (none after an error), the machine."""
        own = {k: v for k, v in asdict(self).items() if k != "timed"}
        rates = {} if self.error else self.timed.rates(peak)
        return own | asdict(self.timed) | rates | {"machine": info}


def model_configs(names: str, vocab_size: int) -> dict[str, TransformerConfig]:
    presets = {
        "base": TransformerConfig.base(vocab_size=vocab_size),
        "big": TransformerConfig.big(vocab_size=vocab_size),
        "tiny": TransformerConfig(
            vocab_size=vocab_size, d_model=64, n_heads=4, d_ff=256, encoder_layers=2, decoder_layers=2
        ),
    }
    chosen = ["base", "big"] if names == "both" else [names]
    return {name: presets[name] for name in chosen}


def compile_layers(model: Transformer) -> None:
    """torch.compile each encoder and decoder layer in place (the loss stays eager: it is its own kernel)."""
    for layer in [*model.encoder_layers, *model.decoder_layers]:
        layer.compile(dynamic=True)  # every batch has other lengths: one graph for all


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def fresh_model(config: TransformerConfig, device: torch.device, result: TrainResult) -> Transformer:
    """The row's model, seeded alike for every row; the device's memory statistics start anew."""
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return build_transformer(config).to(device).train()


def finish(result: TrainResult, device: torch.device) -> TrainResult:
    if device.type == "cuda":
        result.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def train_plain(
    config: TransformerConfig,
    batches: list[Batch],
    result: TrainResult,
    device: torch.device,
    warmup: int,
    check_each_batch: bool = False,
    model: Transformer | None = None,
) -> TrainResult:
    """The ``plain``, ``fused`` and ``compiled`` rows (by ``result.variant``): ``TranslationTask``'s step
    without Lightning, of ``model`` where given (the profile's)."""
    if model is None:
        model = fresh_model(config, device, result)
    model.train()
    if result.variant == "fused":
        from attnx.training.fusion import fuse_pointwise

        fuse_pointwise(model)  # compiled during the warm-up steps
    elif result.variant == "compiled":
        compile_layers(model)
    scaler = torch.amp.GradScaler(device.type) if result.precision == "fp16-mixed" else None
    acc = result.accumulate

    def micro(batch: Batch) -> Tensor:
        with autocast(device, result.precision):
            loss = translation_loss(model, batch, LABEL_SMOOTHING).loss / batch.n_tgt_tokens
        (scaler.scale(loss / acc) if scaler else loss / acc).backward()
        return loss.detach()

    graphs = compiled_graphs()

    def timing_starts() -> None:
        nonlocal graphs
        graphs = compiled_graphs()

    timed_steps(result.timed, config, batches, acc, warmup, micro, adamw(model), device, scaler,
                check_each_batch=check_each_batch, timing_starts=timing_starts)  # fmt: skip
    if result.variant == "compiled":  # a new batch shape the guards reject recompiles inside the timed steps
        result.graphs_compiled_while_timed = compiled_graphs() - graphs
    return finish(result, device)


class CallAgain:
    """A CPU stand-in for CUDA graphs (smoke runs): a capture keeps the function, a replay calls it again."""

    def warm_up(self, fn, times: int) -> None:
        for _ in range(times):
            fn()

    def capture(self, fn):
        from types import SimpleNamespace

        return SimpleNamespace(replay=fn), 0

    def rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)


def every_position(batch: Batch) -> Batch:
    """``batch`` with all ``B·T`` target positions passed to the loss (padding counted out by its target): its
    shapes then depend on its padded lengths alone, as a graph needs."""
    positions = torch.arange(batch.tgt_out.numel(), device=batch.tgt_out.device)
    return Batch(batch.src, batch.tgt_in, batch.tgt_out, batch.src_mask, batch.tgt_mask, batch.n_src_tokens,
                 batch.n_tgt_tokens, tgt_positions=positions)  # fmt: skip


def per_token_loss(model: Transformer, src, tgt_in, tgt_out, src_mask, tgt_mask, positions):
    """The loss per counted target token and the (loss, NLL) sums, from tensors alone (what is compiled)."""
    batch = Batch(src, tgt_in, tgt_out, src_mask, tgt_mask, 0, 0, None, positions)
    sums = translation_loss(model, batch, LABEL_SMOOTHING)
    return sums.loss / sums.tokens, torch.stack([sums.loss, sums.nll]).detach()


def train_captured(
    config: TransformerConfig,
    batches: list[Batch],
    result: TrainResult,
    device: torch.device,
    warmup: int,
    how: str,
) -> TrainResult:
    """The captured rows: each micro-batch's forward and backward replayed (``how``: ``graphs``, attnx's
    ``StepEngine``; ``compile``, ``torch.compile(mode="reduce-overhead")``), every shape of ``batches``
    captured or compiled first (``result.capture_seconds``), under the same cache-free autocast as the
    timed steps."""
    import time

    from attnx.components.loss import LabelSmoothedLoss
    from attnx.training.capture import CudaGraphs, StepEngine

    model = fresh_model(config, device, result)
    scaler = torch.amp.GradScaler(device.type) if result.precision == "fp16-mixed" else None
    acc = result.accumulate
    firsts = {(b.src.shape[0], b.src.shape[1], b.tgt_in.shape[1]): b for b in reversed(batches)}
    start = time.perf_counter()
    if how == "graphs":
        backend = CudaGraphs(device) if device.type == "cuda" else CallAgain()
        engine = StepEngine(model, LabelSmoothedLoss(LABEL_SMOOTHING), backend, divisor=acc, scaler=scaler)
        with autocast(device, result.precision):
            engine.prepare(sorted(firsts))

        def micro(batch: Batch) -> Tensor:
            with autocast(device, result.precision):
                sums = engine.run(batch)
                if sums is None:  # a shape beyond the cap: eagerly, as attnx fit runs it
                    loss = translation_loss(model, batch, LABEL_SMOOTHING).loss / batch.n_tgt_tokens
            if sums is None:
                (scaler.scale(loss / acc) if scaler else loss / acc).backward()
                return loss.detach()
            return sums[0] / batch.n_tgt_tokens

    else:
        step = torch.compile(per_token_loss, mode="reduce-overhead")

        def micro(batch: Batch) -> Tensor:
            torch.compiler.cudagraph_mark_step_begin()
            b = every_position(batch)
            with autocast(device, result.precision):
                loss, sums = step(model, b.src, b.tgt_in, b.tgt_out, b.src_mask, b.tgt_mask, b.tgt_positions)
            (scaler.scale(loss / acc) if scaler else loss / acc).backward()
            return sums[0].clone() / batch.n_tgt_tokens

        for batch in firsts.values():  # compile and record every shape before timing
            micro(batch.to(device))
    optimizer = adamw(model)
    optimizer.zero_grad(set_to_none=False)
    sync(device)
    result.capture_seconds = time.perf_counter() - start
    graphs = compiled_graphs()

    def timing_starts() -> None:
        nonlocal graphs
        graphs = compiled_graphs()

    timed_steps(result.timed, config, batches, acc, warmup, micro, optimizer, device, scaler, keep_grads=True,
                timing_starts=timing_starts)  # fmt: skip
    if how == "compile":
        result.graphs_compiled_while_timed = compiled_graphs() - graphs
    return finish(result, device)


def failed(result: TrainResult, error: Exception) -> TrainResult:
    """A row that could not run (a precision or kernel the device lacks, out of memory): said in the row."""
    if isinstance(error, torch.OutOfMemoryError):
        result.error = f"out of memory: {str(error).splitlines()[0]}"
    else:
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return result
