"""The step engine's own logic on a CPU, with a capture backend that replays by calling the captured function
again (what a CUDA graph's replay computes); the GPU tests below run the real graphs."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from attnx.components.loss import LabelSmoothedLoss
from attnx.data.batch import Batch, collate
from attnx.model import TransformerConfig, build_transformer
from attnx.training.capture import (
    MAX_GRAPHS,
    OVER_CAP,
    SYNCING,
    CaptureError,
    CaptureStats,
    StepEngine,
    pool_bytes,
    static_batch,
)

CONFIG = TransformerConfig(
    vocab_size=40, d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.3
)


class FakeGraph:
    def __init__(self, fn: Callable[[], None], calls: list) -> None:
        self.fn, self.calls = fn, calls

    def replay(self) -> None:
        self.calls.append("replay")
        self.fn()


class FakeGraphs:
    """A capture backend for CPUs: capturing records the function (it runs nothing, as a CUDA capture runs no
    kernel), a replay calls it again; each capture reports `pool` bytes."""

    def __init__(self, device: torch.device | None = None, pool: int = 3 * 2**20) -> None:
        self.calls: list = []
        self.pool = pool

    def warm_up(self, fn: Callable[[], None], times: int) -> None:
        self.calls.append(("warm_up", times))
        for _ in range(times):
            fn()

    def capture(self, fn: Callable[[], None]) -> tuple[FakeGraph, int]:
        self.calls.append("capture")
        return FakeGraph(fn, self.calls), self.pool

    def rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)


def pairs(n: int, src_len: int, tgt_len: int, seed: int) -> Batch:
    """`n` pairs of random lengths up to these, padded to exactly (n, src_len + 1, tgt_len + 1)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        s = src_len if i == 0 else int(torch.randint(1, src_len + 1, (), generator=g))
        t = tgt_len if i == 0 else int(torch.randint(1, tgt_len + 1, (), generator=g))
        items.append((torch.randint(4, 40, (s,), generator=g), torch.randint(4, 40, (t,), generator=g)))
    return collate(items)


def engine_and_model(**kwargs) -> tuple[StepEngine, torch.nn.Module, FakeGraphs]:
    torch.manual_seed(0)
    model = build_transformer(CONFIG).train()
    backend = FakeGraphs()
    return StepEngine(model, LabelSmoothedLoss(0.1), backend, **kwargs), model, backend


def eager_step(model: torch.nn.Module, batch: Batch, divisor: int) -> torch.Tensor:
    """What the module's eager path and Lightning's closure do with a batch."""
    sums = LabelSmoothedLoss(0.1)(model, batch)
    (sums.loss / batch.n_tgt_tokens / divisor).backward()
    return torch.stack([sums.loss, sums.nll]).detach()


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_a_replayed_window_of_batches_equals_the_eager_one_dropout_included() -> None:
    """Two accumulated batches of two shapes, each replayed after the same reseed as the eager steps: the same
    sums and the same accumulated gradients (dropout 0.3: the same masks), captured lazily on first sight."""
    engine, model, backend = engine_and_model(divisor=2)
    reference = copy.deepcopy(model)
    batches = [pairs(3, 5, 6, seed=1), pairs(2, 7, 4, seed=2)]
    for i, batch in enumerate(batches):
        torch.manual_seed(100 + i)
        expected = eager_step(reference, batch, divisor=2)
        torch.manual_seed(100 + i)
        got = engine.run(batch)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for got, expected in zip(grads(model), grads(reference), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert backend.calls.count("capture") == 2 and backend.calls.count("replay") == 2
    assert engine.stats.captured == 2 and engine.stats.replays == 2 and not engine.stats.eager


def test_a_shape_is_captured_once_and_replays_the_new_contents_after() -> None:
    engine, model, backend = engine_and_model()
    first, second = pairs(3, 5, 6, seed=1), pairs(3, 5, 6, seed=9)  # one shape, other tokens
    assert engine.batch_key(first) == engine.batch_key(second)
    engine.run(first)
    reference = copy.deepcopy(model)
    for p in reference.parameters():
        p.grad = None
    torch.manual_seed(5)
    got = engine.run(second)
    torch.manual_seed(5)
    expected = eager_step(reference, second, divisor=1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert backend.calls.count("capture") == 1 and engine.stats.replays == 2


def test_capturing_leaves_the_gradients_and_the_random_state_as_they_were() -> None:
    """The warm-up iterations run forward and backward for real: the gradients accumulated so far in the
    step, and the random state the step was seeded with, are put back."""
    engine, model, backend = engine_and_model()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    state = torch.get_rng_state()
    engine.prepare([(3, 6, 7), (2, 8, 5)])
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), state)
    assert backend.calls == [("warm_up", 2), "capture", ("warm_up", 2), "capture"]
    assert engine.stats.replays == 0 and engine.stats.bytes == 2 * backend.pool


def test_the_shape_key_holds_what_the_graph_bakes_in() -> None:
    engine, model, _ = engine_and_model(divisor=4)
    key = engine.key(3, 6, 7)
    assert (key.pairs, key.src_len, key.tgt_len, key.training, key.divisor) == (3, 6, 7, True, 4)
    assert key.autocast == "off" and not key.scaled
    model.eval()
    assert engine.key(3, 6, 7) != key  # dropout off: another graph
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert engine.key(3, 6, 7).autocast == "torch.bfloat16"
    assert engine.key(3, 6, 8) != key and engine.key(4, 6, 7) != key


def test_shapes_beyond_the_cap_run_eagerly_and_are_counted() -> None:
    engine, _, backend = engine_and_model(max_graphs=2)
    engine.prepare([(3, 6, 7), (2, 8, 5), (4, 2, 3)])  # the third is beyond the cap
    assert engine.stats.captured == 2 and len(engine.stats.over_cap) == 1
    assert (
        engine.run(pairs(3, 2, 1, seed=3)) is None
    )  # (3, 3, 2) after EOS/BOS: a third shape, beyond the cap
    assert engine.run(pairs(3, 5, 6, seed=3)) is not None  # (3, 6, 7): replayed
    assert engine.stats.eager == {OVER_CAP: 1} and engine.stats.replays == 1
    assert backend.calls.count("capture") == 2


def test_a_batch_whose_gradients_are_all_reduced_runs_eagerly() -> None:
    engine, _, backend = engine_and_model()
    assert engine.run(pairs(3, 5, 6, seed=1), syncing=True) is None
    assert engine.stats.eager == {SYNCING: 1} and not backend.calls


def test_replaced_gradients_stop_the_run_with_one_error_naming_a_parameter() -> None:
    """A replay adds into the `.grad` tensors it was captured with: once they are replaced (set to None by
    zero_grad(set_to_none=True)), replaying would write where no parameter reads. No eager fallback either:
    the error says what to do."""
    engine, model, backend = engine_and_model()
    batch = pairs(3, 5, 6, seed=1)
    assert engine.run(batch) is not None
    model.zero_grad(set_to_none=True)
    with pytest.raises(CaptureError, match=r"the gradient of \S+ is None since its graphs were captured"):
        engine.run(batch)
    with pytest.raises(CaptureError, match="zero_grad\\(set_to_none=False\\)"):
        engine.run(batch, syncing=True)  # an eager batch too: the next replay would add into the old tensors
    assert backend.calls.count("replay") == 1


def test_a_shape_first_seen_after_the_gradients_were_replaced_is_refused_not_captured() -> None:
    """The latent path: a new shape captured after the replacement would take the new `.grad` tensors while
    the older graphs kept adding into the replaced ones."""
    engine, model, backend = engine_and_model()
    assert engine.run(pairs(3, 5, 6, seed=1)) is not None
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # replaced, not cleared
    with pytest.raises(CaptureError, match="is another tensor since its graphs were captured \\(1 shapes\\)"):
        engine.run(pairs(2, 7, 4, seed=2))
    with pytest.raises(CaptureError):
        engine.prepare([(4, 3, 3)])
    assert backend.calls.count("capture") == 1 and len(engine.graphs) == 1


def test_gradients_zeroed_in_place_keep_every_graph_replaying() -> None:
    engine, model, backend = engine_and_model()
    batch = pairs(3, 5, 6, seed=1)
    engine.run(batch)
    model.zero_grad(set_to_none=False)
    assert engine.run(batch) is not None and engine.run(pairs(2, 7, 4, seed=2)) is not None
    engine.release()  # no graph left: the next capture reads the gradients anew
    model.zero_grad(set_to_none=True)
    assert engine.run(batch) is not None and engine.stats.replays == 4


def test_a_capture_under_an_autocast_with_its_cast_cache_on_is_refused() -> None:
    """What torch.cuda.make_graphed_callables refuses too: the warm-up's casts of the weights would be
    replayed at every step. Without the cache (as Lightning's mixed precision runs it) the capture goes on."""
    engine, _, backend = engine_and_model()
    batch = pairs(3, 5, 6, seed=1)
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(CaptureError, match="cache_enabled=False"),
    ):
        engine.run(batch)
    with pytest.raises(CaptureError, match="cast cache on"), torch.autocast("cpu", dtype=torch.bfloat16):
        engine.prepare([(2, 8, 5)])
    assert "capture" not in backend.calls and not engine.graphs
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        assert engine.run(batch) is not None
    assert engine.stats.captured == 1


def test_the_loss_scale_is_read_inside_the_graph_not_baked_in() -> None:
    """16-mixed: the graph multiplies by the scaler's scale tensor, which the scaler updates in place, so a
    replay after a change of scale gives gradients scaled by the new one."""

    class Scaler:  # GradScaler's public surface the engine uses, on a CPU tensor
        def __init__(self) -> None:
            self.scale_tensor = torch.tensor(8.0)

        def is_enabled(self) -> bool:
            return True

        def scale(self, loss: torch.Tensor) -> torch.Tensor:
            return loss * self.scale_tensor

    scaler = Scaler()
    engine, model, _ = engine_and_model(scaler=scaler)
    assert engine.key(3, 6, 7).scaled
    batch = pairs(3, 5, 6, seed=1)
    torch.manual_seed(3)
    engine.run(batch)
    at_8 = grads(model)
    model.zero_grad(set_to_none=False)
    scaler.scale_tensor.fill_(2.0)  # in place, as GradScaler.update does
    torch.manual_seed(3)
    engine.run(batch)
    for a, b in zip(grads(model), at_8, strict=True):
        torch.testing.assert_close(a * 4, b, rtol=1e-5, atol=1e-6)


def test_a_static_batch_passes_every_position_and_the_loss_counts_only_real_targets() -> None:
    """The captured loss scores all B·T target positions, padding counted out by its target: the same sums
    as the eager loss over the counted positions alone."""
    torch.manual_seed(0)
    model = build_transformer(CONFIG).eval()
    batch = pairs(3, 5, 6, seed=4)
    static = static_batch(3, 6, 7, torch.device("cpu"))
    for name in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask"):
        getattr(static, name).copy_(getattr(batch, name))
    assert len(static.tgt_positions) == 3 * 7 > batch.n_tgt_tokens
    loss = LabelSmoothedLoss(0.1)
    eager, captured = loss(model, batch), loss(model, static)
    assert int(captured.tokens) == batch.n_tgt_tokens
    torch.testing.assert_close(captured.loss, eager.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(captured.nll, eager.nll, rtol=1e-5, atol=1e-5)


def test_the_accounting_line_says_shapes_memory_time_and_eager_batches() -> None:
    stats = CaptureStats(captured=3, bytes=3 * 2**30 // 2, seconds=12.34, replays=1234)
    stats.eager[OVER_CAP] = 5
    stats.over_cap.add(("a",))  # type: ignore[arg-type]
    line = stats.line()
    assert line == (
        "captured steps: 3 shapes captured in 12.3 s, 1.50 GiB of graph memory; 1,234 batches replayed, "
        f"eager: 5 over the cap (1 shape beyond the cap of {MAX_GRAPHS})"
    )


def test_the_pool_estimate_is_a_batch_s_memory_once_more_and_at_least_its_first_segments() -> None:
    assert pool_bytes(0) == 22 * 2**20
    assert pool_bytes(10 * 2**30) == 10 * 2**30 + 22 * 2**20


# ------------------------------------------------------------------------------------------------------ GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda_engine(config: TransformerConfig, divisor: int = 1) -> tuple[StepEngine, torch.nn.Module]:
    from attnx.training.capture import CudaGraphs

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build_transformer(config).to(device).train()
    return StepEngine(model, LabelSmoothedLoss(0.1), CudaGraphs(device), divisor=divisor), model


@pytest.mark.gpu
@cuda
def test_on_cuda_captured_and_eager_steps_agree_over_several_steps_and_shapes() -> None:
    """bf16 autocast, no dropout (its masks come from the generator's offsets, which need not line up between a
    graph and eager kernels), two accumulated batches a step, four steps over three shapes, fused AdamW after
    each: the losses and the gradients of the captured steps stay within bf16 tolerance of the eager ones."""
    config = dataclasses_replace(CONFIG, dropout=0.0)
    engine, model = cuda_engine(config, divisor=2)
    reference = copy.deepcopy(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True) for m in (model, reference)]
    shapes = [(3, 5, 6), (2, 7, 4), (3, 5, 6), (4, 3, 3)]
    for step in range(4):
        for micro in range(2):
            batch = pairs(*shapes[(step + micro) % 4], seed=10 * step + micro).to("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                got = engine.run(batch)
                expected = eager_step(reference, batch, divisor=2)
            torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=5e-2, atol=5e-3)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    assert engine.stats.captured == 3 and engine.stats.replays == 8 and engine.stats.bytes > 0


@pytest.mark.gpu
@cuda
def test_on_cuda_dropout_draws_fresh_masks_at_each_replay_and_the_same_after_the_same_seed() -> None:
    engine, model = cuda_engine(dataclasses_replace(CONFIG, dropout=0.3))
    batch = pairs(3, 5, 6, seed=1).to("cuda")
    torch.manual_seed(1)
    first = engine.run(batch)
    second = engine.run(batch)  # the generator moved on: other masks
    torch.manual_seed(1)
    again = engine.run(batch)  # reseeded: the first replay's masks
    assert not torch.equal(first, second)
    assert torch.equal(first, again)
    assert engine.stats.captured == 1 and engine.stats.replays == 3


@pytest.mark.gpu
@cuda
def test_on_cuda_the_pool_holds_no_tensor_between_replays_and_stays_within_the_estimate() -> None:
    """Everything a graph allocates is freed by the end of its capture: outside the static batches, the memory
    allocated is what it was, so all shapes share one pool; its size stays within the estimate's
    `pool_bytes` for the largest batch."""
    from attnx.training.estimate import activation_bytes

    engine, model = cuda_engine(CONFIG)
    engine.run(pairs(4, 7, 7, seed=1).to("cuda"))  # the gradients exist from here on
    allocated = torch.cuda.memory_allocated()
    shapes = [(64, 64, 64), (32, 64, 64), (128, 32, 32)]
    engine.prepare(shapes)
    static = sum(
        t.nbytes
        for key, captured in engine.graphs.items()
        if (key.pairs, key.src_len, key.tgt_len) in shapes
        for t in (*vars(captured.batch).values(), captured.sums)
        if isinstance(t, torch.Tensor)
    )
    assert torch.cuda.memory_allocated() - allocated <= static + 2**19  # block rounding, nothing more
    estimate = pool_bytes(activation_bytes(CONFIG, 64 * 64, 64 * 64, "32-true", "cuda", 64, 64))
    assert 0 < engine.stats.bytes <= estimate, (engine.stats.bytes, estimate)


def dataclasses_replace(config: TransformerConfig, **changes) -> TransformerConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)
