"""How much faster a model decodes in bf16 than in fp32 here: its own search steps timed in both, on the
device it sits on.

The probe encodes a fixed batch of sources, widens it to a beam and runs a few
([`PROBE_STEPS`][attnx.inference.step_probe.PROBE_STEPS], on 32 sentences of 20 pieces, beam 4)
incremental steps with the key/value cache: the work of a beam search, its encoder, attention, feed-forward
layers, output projection and log-softmax, in the proportions the model gives them (what a product of one
shape cannot tell: a bf16 unit that doubles matrix products gains nothing where attention or the softmax is
the slow part). The two precisions run in turns, so that a busy machine slows both alike, the best run of each
counting.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable

import torch

from attnx.inference.decoder import Decoder, decoding

PROBE_SENTENCES = 32
PROBE_SOURCE_PIECES = 20
PROBE_BEAM = 4
PROBE_STEPS = 8
"""The probe's batch: 32 sources of 20 pieces, 4 hypotheses each (128 rows), 8 decoding steps."""
PROBE_SECONDS = 0.5
"""How long the probe times both precisions, after one untimed run of each (at least two timed runs each)."""

__all__ = ["PROBE_SECONDS", "PROBE_STEPS", "bf16_decoding_speedup", "model_signature"]


def model_signature(decoder: Decoder) -> Hashable:
    """What tells models apart for the probe: each model's class and parameter shapes and dtypes (two checkpoints
    of one configuration decode alike fast)."""
    return tuple(
        (type(m).__name__, tuple((tuple(p.shape), str(p.dtype)) for p in m.parameters()))
        for m in decoder.models
    )


def bf16_decoding_speedup(decoder: Decoder, device: torch.device, seconds: float = PROBE_SECONDS) -> float:
    """bf16-mixed over 32-true rate of `decoder`'s beam-search steps on `device` (its models' device)."""
    generator = torch.Generator().manual_seed(0)  # leaves the global random state alone
    high = decoder.vocab_size
    src = torch.randint(4, high, (PROBE_SENTENCES, PROBE_SOURCE_PIECES), generator=generator).to(
        device
    )  # (B, S)
    src_mask = torch.ones_like(src, dtype=torch.bool)  # (B, S)
    rows = torch.arange(PROBE_SENTENCES, device=device).repeat_interleave(PROBE_BEAM)  # (B*beam,)
    steps = torch.randint(4, high, (PROBE_STEPS, rows.numel()), generator=generator).to(device)  # (T, B*beam)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def search(dtype: torch.dtype | None) -> float:
        cast = contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
        start = time.perf_counter()
        with cast:
            state = decoder.start(src, src_mask)
            decoder.reorder(state, rows)
            for tokens in steps:
                decoder.step(tokens, state)  # (B*beam, V)
        sync()
        return time.perf_counter() - start

    dtypes = (None, torch.bfloat16)
    best = dict.fromkeys(dtypes, float("inf"))
    with decoding(decoder):
        for dtype in dtypes:
            search(dtype)  # warm-up: thread pool, kernel selection, autocast's weight casts
        deadline = time.perf_counter() + seconds
        runs = 0
        while time.perf_counter() < deadline or runs < 2:
            for dtype in dtypes:
                best[dtype] = min(best[dtype], search(dtype))
            runs += 1
    return best[None] / best[torch.bfloat16]
