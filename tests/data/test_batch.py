"""The Batch seam: padding by ``collate``, moving to a device, pinning for asynchronous copies to a GPU."""

from __future__ import annotations

import pytest
import torch

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch, collate

FIELDS = ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask", "tgt_positions")


def pinning_works() -> bool:
    try:
        return torch.zeros(1).pin_memory().is_pinned()
    except RuntimeError:  # "Cannot access accelerator device when none is available."
        return False


needs_pinning = pytest.mark.skipif(
    not pinning_works(), reason="pinned memory needs an accelerator (none here)"
)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def sample() -> Batch:
    return collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])], index=[4, 2])


def assert_same(a: Batch, b: Batch) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu()), name
    assert (a.n_src_tokens, a.n_tgt_tokens) == (b.n_src_tokens, b.n_tgt_tokens)
    assert torch.equal(a.index, b.index)


def test_collate_pads_and_shifts_the_target() -> None:
    batch = sample()
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens, batch.size) == (6, 8, 2)


def test_pin_memory_pins_every_model_input_and_keeps_the_rest(monkeypatch) -> None:
    """Runs without an accelerator: ``Tensor.pin_memory`` is replaced by a recording copy."""
    pinned: list[torch.Tensor] = []

    def fake_pin(tensor: torch.Tensor) -> torch.Tensor:
        pinned.append(tensor.clone())
        return pinned[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    batch = sample()
    out = batch.pin_memory()
    assert isinstance(out, Batch) and out is not batch
    assert_same(out, batch)
    assert [id(getattr(out, name)) for name in FIELDS] == [id(t) for t in pinned]
    assert out.index is batch.index  # read on the host only (restoring corpus order): never copied


@needs_pinning
def test_pin_memory_returns_the_same_values_in_page_locked_memory() -> None:
    batch = sample()
    out = batch.pin_memory()
    assert_same(out, batch)
    assert all(getattr(out, name).is_pinned() for name in FIELDS)


@needs_pinning
def test_dataloader_pinning_calls_batch_pin_memory() -> None:
    from torch.utils.data._utils.pin_memory import pin_memory

    out = pin_memory(sample())
    assert isinstance(out, Batch) and out.src.is_pinned()


def test_copies_block_unless_the_target_is_cuda(monkeypatch) -> None:
    calls: list[tuple[str, bool]] = []
    real_to = torch.Tensor.to

    def recording_to(tensor, device, non_blocking=False):
        calls.append((str(device), non_blocking))
        return real_to(tensor, "cpu")

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    batch = sample()
    assert_same(batch.to("cpu"), batch)
    batch.to(torch.device("cuda", 0))
    batch.to("cuda", non_blocking=False)
    n = len(FIELDS)
    assert calls == [("cpu", False)] * n + [("cuda:0", True)] * n + [("cuda", False)] * n


@pytest.mark.gpu
@cuda
def test_pinned_batch_reaches_the_gpu_intact() -> None:
    batch = sample()
    on_gpu = batch.pin_memory().to("cuda")
    assert all(getattr(on_gpu, name).is_cuda for name in FIELDS)
    assert_same(on_gpu.to("cpu"), batch)


def test_the_counted_target_positions_are_found_on_the_host() -> None:
    """The loss selects the counted positions with these indices, not with the mask (which waits for a GPU)."""
    batch = collate([([5, 6], [7]), ([5], [7, 8, 9])])
    flat = batch.tgt_mask.flatten()
    assert torch.equal(batch.tgt_positions, flat.nonzero().squeeze(1))
    assert len(batch.tgt_positions) == batch.n_tgt_tokens
    assert torch.equal(batch.tgt_out.flatten()[batch.tgt_positions], batch.tgt_out[batch.tgt_mask])
