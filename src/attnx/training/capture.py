"""Captured training steps: a batch shape's forward and backward recorded once as a CUDA graph, then replayed.

At the paper's batch (3,125 tokens a side per GPU) the GPU waits for the host, which launches a step's
kernels one by one; a CUDA graph launches all of a micro-batch's forward and backward in one call. A graph
replays fixed memory with fixed shapes, which shape buckets (`data.shape_buckets`) provide: an epoch's batches
come in a few dozen `(pairs, source length, target length)` shapes. [`StepEngine`][attnx.training.capture.StepEngine]
is the one place that captures; the layers are plain PyTorch that runs the same eagerly or captured.

- **Shape key** ([`ShapeKey`][attnx.training.capture.ShapeKey]): the batch's padded shape and everything else
  the graph bakes in: training mode, the autocast dtype, the accumulation divisor, loss scaling.
- **One graph per key**, captured before it is needed (`prepare`: `attnx fit` passes every shape of the
  training batches' plan before the first step) or the first time the key appears, after warm-up iterations
  on the capture stream with the gradients and the random state put back afterwards, so that the batch itself
  then replays like every later one. All graphs share **one memory pool**: no graph keeps a tensor of the
  pool alive between replays (inputs are static buffers outside it, the gradients are the parameters' own
  `.grad`, the loss sums are copied into a buffer outside it), so each graph's scratch memory is the next one's.
- **Eager fallback**: a key beyond [`MAX_GRAPHS`][attnx.training.capture.MAX_GRAPHS] graphs, and a batch
  whose gradients must be all-reduced now (DDP, below), run eagerly; `run` then returns None.
- **Gradient accumulation**: the graph adds into the parameters' `.grad` tensors, which must stay the same
  tensors for as long as the graphs live (zeroed in place, `zero_grad(set_to_none=False)`, wherever the run
  clears them: `TranslationTask` does so at every step, before Lightning's validation and at the start of
  fit). The engine checks them at every batch, before it replays or captures anything, and refuses to go on
  with a [`CaptureError`][attnx.training.capture.CaptureError] where one was replaced: a replay would add
  into memory no parameter reads, and a shape captured after the replacement would pass any later check
  while the older graphs kept writing into freed memory.
- **Precision**: autocast is captured as it runs, without its cast cache (`cache_enabled=False`, as
  Lightning's mixed-precision plugin runs it): with the cache on, the weights' casts made by the warm-up
  would be read by every replay, a forward pass frozen at the weights of the capture, from memory freed when
  the autocast exits. `capture` refuses that case, as `torch.cuda.make_graphed_callables` does. With loss
  scaling (`16-mixed`) the graph multiplies by the `GradScaler`'s scale tensor, which the scaler updates in
  place, so each replay reads the current scale.
- **Dropout**: the graph's random draws take the CUDA generator's seed and offset at each replay (PyTorch
  registers the default generator with every capture), so the masks of a replay after `torch.manual_seed(s)`
  follow from `s`: fresh at every step (the module reseeds each batch), and the same again where a resumed
  run replays that step.
- **DDP**: a graph holds no all-reduce. Batches inside `no_sync` (all but the last of each accumulation
  window) replay; the last runs eagerly through DDP, whose reducer all-reduces the accumulated gradients,
  overlapped with that batch's backward. Capturing DDP's reducer itself would need NCCL work inside the
  graph and its host-side bucket bookkeeping to be captured, which it is not made for.
- **The optimizer step stays outside**: fused AdamW is a handful of kernel launches a step, against the
  hundreds of a micro-batch, and outside the graph Lightning's gradient clipping, its GradScaler step (which
  skips a step on an infinite gradient) and Eq. 3's Python learning rate keep working unchanged.

What a captured region may not do is the host-sync rule (tests/training/test_host_syncs.py): no read of a
device value, no shape that depends on the data. The loss therefore scores all `B·T` target positions of a
captured batch, padding counted out by its target (`Batch.tgt_positions`), where an eager step selects the
counted ones: the vocabulary projection also runs on the padded rows (the padding share of the target side).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from attnx.components.loss import LossSums
from attnx.data.batch import BOS_ID, EOS_ID, Batch
from attnx.errors import AttnxError

MAX_GRAPHS = 64
"""Graphs one run keeps at most: an epoch of the news corpus has 28-47 shapes with `data.shape_buckets` 8.
Further shapes run eagerly (their memory is shared, but each graph holds the launch data of its kernels)."""

WARMUP = 2
"""Eager iterations on the capture stream before a shape is captured: they load its kernels and let cuBLAS
and the autograd engine set up their per-stream state, none of which may happen during a capture."""

OVER_CAP = "over the cap"
SYNCING = "all-reducing gradients"


class CaptureError(AttnxError, RuntimeError):
    """What a captured graph depends on was changed under it (its gradient tensors replaced), or a capture was
    asked in a state it cannot record faithfully (autocast with its cast cache on): training stops, since the
    step would go on computing something else than it says."""


POOL_SEGMENTS = 22 * 2**20
"""The least a memory pool reserves once used: one 2 MiB segment for small tensors, one 20 MiB for large."""


def pool_bytes(activation_bytes: int) -> int:
    """The estimated memory of the captured shapes' shared pool: what the largest batch's step allocates and
    frees (its activations and the loss's share: `activation_bytes`, the estimate of
    [attnx.training.estimate][]), held by the pool for good, beside the eager steps' own memory; at least its
    first segments."""
    return activation_bytes + POOL_SEGMENTS


class ShapeKey(NamedTuple):
    """What a captured graph bakes in: the batch's shapes and the state the same Python code reads."""

    pairs: int
    src_len: int
    tgt_len: int
    training: bool
    autocast: str  # the autocast dtype, or "off"
    divisor: int  # the loss is divided by it: Lightning's accumulate_grad_batches
    scaled: bool  # multiplied by a GradScaler's scale before backward


class Replayable(Protocol):
    def replay(self) -> None: ...


class CaptureBackend(Protocol):
    """How graphs are made: [`CudaGraphs`][attnx.training.capture.CudaGraphs] on a GPU; the tests inject a
    backend that replays by calling the function again, so the engine's logic runs on a CPU."""

    def warm_up(self, fn: Callable[[], None], times: int) -> None: ...

    def capture(self, fn: Callable[[], None]) -> tuple[Replayable, int]:
        """A graph of `fn`, and the bytes its capture added to the shared pool."""
        ...

    def rng_state(self) -> Tensor: ...

    def set_rng_state(self, state: Tensor) -> None: ...


class CudaGraphs:
    """`torch.cuda.CUDAGraph` captures on one device, all into one memory pool and from one side stream.

    `capture_error_mode="thread_local"`: the DataLoader's pinning thread and NCCL's watchdog call CUDA while a
    capture runs, which the default mode would refuse.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def warm_up(self, fn: Callable[[], None], times: int) -> None:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            for _ in range(times):
                fn()
        current.wait_stream(self.stream)

    def capture(self, fn: Callable[[], None]) -> tuple[Replayable, int]:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # what torch.cuda.graph does too; the reserved memory then grows by the pool
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            fn()
        return graph, max(0, torch.cuda.memory_reserved(self.device) - before)

    def rng_state(self) -> Tensor:
        return torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: Tensor) -> None:
        torch.cuda.set_rng_state(state, self.device)


def static_batch(pairs: int, src_len: int, tgt_len: int, device: torch.device) -> Batch:
    """A batch of the shape `(pairs, src_len, tgt_len)` on `device` to capture with, every target position
    passed to the loss (`tgt_positions` = all `B·T`): its contents are overwritten before each replay."""
    src = torch.full((pairs, src_len), EOS_ID, dtype=torch.long, device=device)
    tgt_in = torch.full((pairs, tgt_len), BOS_ID, dtype=torch.long, device=device)
    tgt_out = torch.full((pairs, tgt_len), EOS_ID, dtype=torch.long, device=device)
    return Batch(
        src=src,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        src_mask=torch.ones_like(src, dtype=torch.bool),
        tgt_mask=torch.ones_like(tgt_out, dtype=torch.bool),
        n_src_tokens=pairs * src_len,
        n_tgt_tokens=pairs * tgt_len,
        tgt_positions=torch.arange(pairs * tgt_len, device=device),
    )


@dataclass
class Captured:
    """One shape's graph, the static batch it reads and the `(2,)` loss and NLL sums it writes."""

    graph: Replayable
    batch: Batch
    sums: Tensor

    def load(self, batch: Batch) -> None:
        """Copy `batch` (already on the device) into the static buffers: device-to-device, queued."""
        for name in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask"):
            getattr(self.batch, name).copy_(getattr(batch, name), non_blocking=True)


@dataclass
class CaptureStats:
    """What the engine did, for the lines `attnx fit` prints."""

    captured: int = 0
    bytes: int = 0
    seconds: float = 0.0
    replays: int = 0
    eager: collections.Counter[str] = field(default_factory=collections.Counter)
    over_cap: set[ShapeKey] = field(default_factory=set)

    def line(self) -> str:
        """`captured steps: 37 shapes in 41.2 s, 1.92 GiB of graph memory; 1,234 batches replayed, ...`."""
        shapes = f"{self.captured} shape{'s' * (self.captured != 1)} captured in {self.seconds:.1f} s"
        text = f"captured steps: {shapes}, {size_text(self.bytes)} of graph memory; {self.replays:,} batches replayed"
        eager = ", ".join(f"{n:,} {reason}" for reason, n in sorted(self.eager.items()) if n)
        if eager:
            text += f", eager: {eager}"
        if self.over_cap:
            text += f" ({len(self.over_cap)} shape{'s' * (len(self.over_cap) != 1)} beyond the cap of {MAX_GRAPHS})"
        return text


def size_text(count: int) -> str:
    """`1.92 GiB` or `40 MiB`."""
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


class StepEngine:
    """Forward and backward of a training batch, replayed from its shape's CUDA graph (see the module).

    Args:
        model: The model whose parameters' `.grad` the graphs add into.
        loss: The loss component, called as `loss(model, batch) -> LossSums`.
        backend: How graphs are captured and replayed.
        divisor: The loss of a batch is divided by it before backward (Lightning's accumulate_grad_batches).
        scaler: The GradScaler of `16-mixed`, whose scale tensor the graphs read; None otherwise.
        max_graphs: Graphs kept at most; further shapes run eagerly.
        warmup: Eager iterations before each capture.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: Callable[[nn.Module, Batch], LossSums],
        backend: CaptureBackend,
        divisor: int = 1,
        scaler: Any = None,
        max_graphs: int = MAX_GRAPHS,
        warmup: int = WARMUP,
    ) -> None:
        self.model = model
        self.loss = loss
        self.backend = backend
        self.divisor = divisor
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.max_graphs = max_graphs
        self.warmup = warmup
        self.graphs: dict[ShapeKey, Captured] = {}
        self.stats = CaptureStats()
        self._named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._params = [p for _, p in self._named]
        self._grads: list[Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self._params[0].device

    def key(self, pairs: int, src_len: int, tgt_len: int) -> ShapeKey:
        """The key of a batch of this shape now: the model's mode and autocast state are read as they are."""
        kind = self.device.type
        autocast = str(torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else "off"
        return ShapeKey(
            pairs, src_len, tgt_len, self.model.training, autocast, self.divisor, self.scaler is not None
        )

    def batch_key(self, batch: Batch) -> ShapeKey:
        return self.key(batch.src.shape[0], batch.src.shape[1], batch.tgt_in.shape[1])

    # --------------------------------------------------------------------------------------------- running

    def run(self, batch: Batch, syncing: bool = False) -> Tensor | None:
        """Add `batch`'s gradients into `.grad` from its shape's graph and return its `(2,)` loss and NLL sums
        (a new tensor); None where the caller must run the batch eagerly: `syncing` (its gradients are
        all-reduced by this backward) or its shape beyond the cap. Raises
        [`CaptureError`][attnx.training.capture.CaptureError] where the gradients the graphs add into were
        replaced since they were captured."""
        self.check_grads()
        if syncing:
            return self._eager(SYNCING)
        key = self.batch_key(batch)
        captured = self.graphs.get(key)
        if captured is None:
            if len(self.graphs) >= self.max_graphs:
                self.stats.over_cap.add(key)
                return self._eager(OVER_CAP)
            captured = self.capture(key, batch)
        captured.load(batch)
        captured.graph.replay()
        self.stats.replays += 1
        return captured.sums.clone()  # the next replay overwrites the static sums

    def _eager(self, reason: str) -> None:
        self.stats.eager[reason] += 1
        return None

    def prepare(self, shapes: Iterable[tuple[int, int, int]]) -> None:
        """Capture these `(pairs, source length, target length)` shapes now, in order, up to the cap (the most
        frequent first is the caller's choice): every batch of them then replays, from the first."""
        self.check_grads()
        for pairs, src_len, tgt_len in shapes:
            key = self.key(int(pairs), int(src_len), int(tgt_len))
            if key in self.graphs:
                continue
            if len(self.graphs) >= self.max_graphs:
                self.stats.over_cap.add(key)
                continue
            self.capture(key, None)

    # ------------------------------------------------------------------------------------------- capturing

    def capture(self, key: ShapeKey, batch: Batch | None) -> Captured:
        """Warm up and capture `key`'s graph (with `batch`'s contents where given), leaving the gradients and
        the random state as they were. Refuses an autocast with its cast cache on (see the module)."""
        kind = self.device.type
        if torch.is_autocast_enabled(kind) and torch.is_autocast_cache_enabled():
            raise CaptureError(
                f"captured steps: autocast on {kind} has its cast cache on; a graph captured so would replay the "
                "weights' casts of its warm-up at every step (a forward pass frozen at those weights, read from "
                f"freed memory): enter it as torch.autocast({kind!r}, ..., cache_enabled=False), as "
                "Lightning's mixed precision does"
            )
        self.check_grads()
        start = time.perf_counter()
        static = static_batch(key.pairs, key.src_len, key.tgt_len, self.device)
        dtype = torch.promote_types(torch.float32, self._params[0].dtype)  # fp32 at least; a float64 model's
        sums = torch.zeros(2, dtype=dtype, device=self.device)
        captured = Captured(graph=_NotYet(), batch=static, sums=sums)
        if batch is not None:
            captured.load(batch)
        grads = self._static_grads()
        if self.scaler is not None:
            self.scaler.scale(torch.ones((), device=self.device))  # its scale tensor exists before capture
        state = self.backend.rng_state()
        saved = [g.clone() for g in grads]
        self.backend.warm_up(lambda: self._forward_backward(static, sums), self.warmup)
        for grad, value in zip(grads, saved, strict=True):
            grad.copy_(value)
        del saved
        captured.graph, added = self.backend.capture(lambda: self._forward_backward(static, sums))
        self.backend.set_rng_state(state)
        self.graphs[key] = captured
        self.stats.captured += 1
        self.stats.bytes += added
        self.stats.seconds += time.perf_counter() - start
        return captured

    def _forward_backward(self, batch: Batch, out: Tensor) -> None:
        """What a graph holds: the loss of `batch` per target token (the tokens counted on the device),
        divided and scaled as Lightning does before its backward, backward into `.grad`, the sums into `out`.
        Nothing computed here outlives the call: the pool's memory is free again once it returns."""
        sums = self.loss(self.model, batch)
        loss = sums.loss / sums.tokens / self.divisor
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()
        out.copy_(torch.stack([sums.loss, sums.nll]).detach())

    def _static_grads(self) -> list[Tensor]:
        """The parameters' `.grad` tensors (zeros where none exists yet), which every graph adds into: read once
        for the first graph, kept for all later ones."""
        if self._grads is None:
            for p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self._grads = [p.grad for p in self._params]
        return self._grads

    def check_grads(self) -> None:
        """Refuse to go on where a graph exists and a parameter's `.grad` is no longer the tensor it was
        captured with: its replays would add into memory no parameter reads."""
        if self._grads is None or not self.graphs:
            return
        for (name, p), grad in zip(self._named, self._grads, strict=True):
            if p.grad is grad:
                continue
            now = "None" if p.grad is None else "another tensor"
            raise CaptureError(
                f"captured steps: the gradient of {name} is {now} since its graphs were captured "
                f"({len(self.graphs)} shapes), by zero_grad(set_to_none=True) or code that assigns .grad; the "
                "graphs add into the tensors they were captured with. Clear gradients in place "
                "(zero_grad(set_to_none=False)) while steps are captured, or train with --cuda_graphs false"
            )

    def release(self) -> None:
        """Drop every graph (their pool's memory goes back to PyTorch's allocator); the next capture reads
        the parameters' `.grad` tensors anew."""
        self.graphs.clear()
        self._grads = None


class _NotYet:
    """The graph slot of a shape being captured."""

    def replay(self) -> None:
        raise RuntimeError("replayed before its capture finished")
