"""The decoding rows of ``bench_gpu.py``: beam search over the first sentences of a test split, sentences and
output tokens a second, after one warm-up batch."""

from __future__ import annotations

import time

import torch
from gpu_timing import autocast, sync

from attnx.data.batch import Batch
from attnx.inference.config import SearchConfig
from attnx.inference.search import translate_batch
from attnx.model import Transformer


def decode(
    model: Transformer, batches: list[Batch], search: SearchConfig, precision: str, device: torch.device
) -> dict[str, float]:
    model = model.to(device).eval()
    with autocast(device, precision):
        translate_batch(model, batches[0].src.to(device), batches[0].src_mask.to(device), search)  # warm-up
        sync(device)
        start = time.perf_counter()
        outputs = 0
        for batch in batches:
            b = batch.to(device)
            hyps = translate_batch(model, b.src, b.src_mask, search)
            outputs += sum(len(h) + 1 for h in hyps)  # + </s>
        sync(device)
    seconds = time.perf_counter() - start
    n = sum(b.size for b in batches)
    return {
        "sentences": n,
        "sentences_per_s": n / seconds,
        "output_tokens_per_s": outputs / seconds,
        "mean_output_tokens": outputs / n,
        "seconds": seconds,
    }
