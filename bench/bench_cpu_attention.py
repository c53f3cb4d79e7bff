"""Scaled dot-product attention forward + backward on CPU: PyTorch's kernels against the explicit computation.

    python bench/bench_cpu_attention.py [--batch 160] [--length 18] [--threads 1] [--calls 20] [--rounds 2]
    python bench/bench_cpu_attention.py --decoding [--batch 1200] [--length 16] [--threads 2]

Shapes of the multi30k_cpu model (4 heads of 64, a padded batch of ``--batch`` sentences of ``--length``
tokens, half of them padded to two thirds), in fp32 and bf16. ``default`` is what
``scaled_dot_product_attention`` picks (the CPU flash kernel), ``flash`` and ``math`` force one backend,
``explicit`` is ``MultiHeadAttention``'s training path on CPU: ``q k^T`` and ``weights v`` as matrix products in
the input dtype, the softmax in fp32. The variants alternate within each round; milliseconds per call.

``--decoding``: a search step instead, forward only under `torch.inference_mode`: one query a row
(``--batch`` rows, e.g. 300 sentences x beam 4) over ``--length`` cached keys, which is where
``MultiHeadAttention`` takes the explicit computation in bf16 on CPU (`explicit_on_cpu`).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from harness import load_average, machine_line
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, D_K = 4, 64


def explicit(q, k, v, mask):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))  # (B, H, T, S)
    weights = torch.softmax(scores * (1.0 / math.sqrt(D_K)), dim=-1, dtype=torch.float32).nan_to_num(0.0)
    return weights.to(v.dtype) @ v


def sdpa(backend):
    def run(q, k, v, mask):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return run


VARIANTS = {
    "default": sdpa(None),
    "flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "math": sdpa(SDPBackend.MATH),
    "explicit": explicit,
}


def decoding_milliseconds(fn, dtype, batch: int, length: int, calls: int) -> float:
    """One decoding step's attention: `(B, H, 1, d_k)` queries over `(B, H, S, d_k)` cached keys and values."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, HEADS, 1, D_K, generator=generator, dtype=dtype)
    k, v = (torch.randn(batch, HEADS, length, D_K, generator=generator, dtype=dtype) for _ in range(2))
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)  # (B, 1, 1, S)
    mask[: batch // 2, ..., 2 * length // 3 :] = False
    with torch.inference_mode():
        for _ in range(3):
            fn(q, k, v, mask)
        start = time.perf_counter()
        for _ in range(calls):
            fn(q, k, v, mask)
    return (time.perf_counter() - start) / calls * 1000


def milliseconds(fn, dtype, batch: int, length: int, calls: int) -> float:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch, HEADS, length, D_K, generator=generator, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)  # (B, 1, 1, S)
    mask[: batch // 2, ..., 2 * length // 3 :] = False
    for _ in range(3):
        fn(q, k, v, mask).sum().backward()
    start = time.perf_counter()
    for _ in range(calls):
        fn(q, k, v, mask).sum().backward()
    return (time.perf_counter() - start) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=160)
    parser.add_argument("--length", type=int, default=18)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--decoding", action="store_true", help="time a search step's attention, forward only"
    )
    args = parser.parse_args()
    timed = decoding_milliseconds if args.decoding else milliseconds
    torch.set_num_threads(args.threads)
    print(machine_line())
    print("| round | dtype | " + " | ".join(VARIANTS) + " | load |")
    print("|---" * (len(VARIANTS) + 3) + "|")
    for r in range(args.rounds):
        for dtype in (torch.float32, torch.bfloat16):
            times = [timed(fn, dtype, args.batch, args.length, args.calls) for fn in VARIANTS.values()]
            cells = " | ".join(f"{t:.1f}" for t in times)
            print(f"| {r + 1} | {str(dtype).split('.')[1]} | {cells} | {load_average()} |", flush=True)


if __name__ == "__main__":
    main()
