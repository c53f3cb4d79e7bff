"""TranslationTask under the real Lightning Trainer in each precision: finite losses that fall on a repeated
batch, then beam search (beam 4) with the trained weights on the same device.

The CPU test runs everywhere and checks the harness; the CUDA ones are the first thing to run on a GPU.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from attnx.data.batch import BOS_ID, PAD_ID, Batch, collate
from attnx.data.batching import no_collate
from attnx.inference.search import SearchConfig, max_output_lengths, translate_batch
from attnx.training.module import TranslationTask
from tests.conftest import tiny_config

STEPS = 20
VOCAB = 64
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def repeated_batch() -> Batch:
    """Twelve pairs of 3-17 tokens (so both sides are padded), fixed by a seed."""
    gen = torch.Generator().manual_seed(7)
    pairs = []
    for _ in range(12):
        n = int(torch.randint(3, 18, (1,), generator=gen))
        src = torch.randint(4, VOCAB, (n,), generator=gen).tolist()
        pairs.append((src, [(x * 7 + 3) % (VOCAB - 4) + 4 for x in reversed(src)]))  # a learnable mapping
    return collate(pairs, index=list(range(12)))


class LossLog(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def train(
    accelerator: str, precision: str, lr_factor: float = 0.25, warmup_steps: int = 4
) -> tuple[list[float], TranslationTask]:
    """``STEPS`` optimizer steps of a 2+2-layer d_model 64 model on one batch, through ``Trainer.fit``."""
    pl.seed_everything(0, verbose=False)
    config = tiny_config(vocab_size=VOCAB, d_model=64, n_heads=4, d_ff=128, dropout=0.1)
    task = TranslationTask(
        transformer=config, label_smoothing=0.1, lr_factor=lr_factor, warmup_steps=warmup_steps
    )
    batch = repeated_batch()
    log = LossLog()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[log],
    )
    loader = DataLoader([batch] * STEPS, batch_size=None, collate_fn=no_collate)
    trainer.fit(task, train_dataloaders=loader)
    return log.losses, task


def check_training(losses: list[float]) -> None:
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.85 * first, losses


def check_beam_search(task: TranslationTask, device: str, autocast: torch.dtype | None) -> None:
    batch = repeated_batch().to(device)
    model = task.model.to(device)
    config = SearchConfig(beam=4, max_positions=task.config.max_len)  # §6.1: α 0.6, input length + 50
    with torch.autocast(device, dtype=autocast or torch.float32, enabled=autocast is not None):
        hypotheses = translate_batch(model, batch.src, batch.src_mask, config)
    limits = max_output_lengths(batch.src_mask, config.max_len_a, config.max_len_b, config.max_positions)
    assert len(hypotheses) == batch.size
    for hyp, limit in zip(hypotheses, limits.tolist(), strict=True):
        assert len(hyp) <= limit and all(0 <= t < VOCAB for t in hyp)
        assert PAD_ID not in hyp and BOS_ID not in hyp


def test_trains_and_decodes_on_cpu_in_fp32() -> None:
    losses, task = train("cpu", "32-true")
    check_training(losses)
    check_beam_search(task, "cpu", None)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_trains_and_decodes_on_cuda_in_mixed_precision(precision: str) -> None:
    """bf16 autocast, or fp16 autocast with dynamic loss scaling (Lightning's GradScaler)."""
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    losses, task = train("gpu", precision)
    check_training(losses)
    assert next(task.model.parameters()).is_cuda
    check_beam_search(task, "cuda", torch.bfloat16 if precision == "bf16-mixed" else torch.float16)
