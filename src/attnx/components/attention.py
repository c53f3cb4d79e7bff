"""§3.2 Multi-head scaled dot-product attention, the paper's only attention."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnx.components.masking import (
    additive_mask,
    attention_mask,
    cache_offset,
    cached_keys_values,
    positioned_queries_keys,
    score_bias,
)
from attnx.components.protocols import KeyValueCache, PositionalEncoding
from attnx.components.values import flag, integer, is_integer, optional_integer, probability
from attnx.errors import ConfigError
from attnx.hookspecs import hookimpl

CUDNN_ATTENTION = False
"""Whether attention on CUDA may run cuDNN's fused kernel (PyTorch's first choice on Hopper GPUs). Off: on an
H200 (torch 2.11, cuDNN 9.19) every cuDNN attention call of a training step cost 2.3 ms of host time, forward
and backward alike, against 20-250 µs on the GPU: 61% of a base step of 3,125 x 8 tokens
(`bench/bench_gpu.py --profile`, docs/gpu.md). cuDNN builds an execution plan for the shapes it is given, the
cause reported upstream; the flash and memory-efficient kernels take the same inputs without one. `True`
restores PyTorch's order."""

NOT_CUDNN = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
"""The kernels `F.scaled_dot_product_attention` may take when cuDNN's is left out, in PyTorch's order."""


def excludes_cudnn(x: Tensor) -> bool:
    """Whether attention over `x` must leave cuDNN's kernel out: on CUDA, unless `CUDNN_ATTENTION`."""
    return x.is_cuda and not CUDNN_ATTENTION


def attention_backends(x: Tensor) -> contextlib.AbstractContextManager:
    """The kernels attention may take while a whole forward pass runs over `x`: an `sdpa_kernel` context
    over the kernels PyTorch's flags allow (an `sdpa_kernel` of the caller's included), cuDNN's left out
    where [`excludes_cudnn`][attnx.components.attention.excludes_cudnn]; a null context elsewhere.

    The model enters it once per pass (encoder, decoder, one decoding step), not once per attention call:
    the flags are set twice a pass whatever the number of layers, and the attention path itself does no host
    work for the choice. The compiler follows an `sdpa_kernel` context, a flag set by hand it would not.
    The backward kernels are those the forward chose, so the context need not cover `backward()`.
    """
    if not excludes_cudnn(x):
        return contextlib.nullcontext()
    allowed = [backend for backend in NOT_CUDNN if backend_enabled(backend)]
    return sdpa_kernel(allowed) if allowed else contextlib.nullcontext()


def backend_enabled(backend: SDPBackend) -> bool:
    """Whether PyTorch's flags (an `sdpa_kernel` context among them) allow `backend`."""
    flags = torch.backends.cuda
    return {
        SDPBackend.FLASH_ATTENTION: flags.flash_sdp_enabled,
        SDPBackend.EFFICIENT_ATTENTION: flags.mem_efficient_sdp_enabled,
        SDPBackend.MATH: flags.math_sdp_enabled,
    }[backend]()


# Read while tracing, as the compiler reads the flags for its kernel: what `torch.compiler.assume_constant_result`
# marks, set without it, since calling it imports the compiler (1.3 s of every command's start-up, translate's
# too); tests/components/test_attention.py checks that the decorator still marks functions so.
backend_enabled._dynamo_marked_constant = True  # type: ignore[attr-defined]


def explicit_on_cpu(q: Tensor) -> bool:
    """Whether attention of bf16 queries `q` `(B, H, T, d_k)` runs the explicit computation rather than
    PyTorch's CPU kernel, the slower of the two in bf16 training (its backward 4-9x the explicit one's) and for
    one query a row, a decoding step over the cache (6-7x the explicit one's for 1,200 rows of 16 or 40 keys on
    a 2-core AMD EPYC Zen 4; `bench/bench_cpu_attention.py --decoding`, docs/benchmarks.md). In fp32 the
    explicit step is faster too (1.5-2x), but attention is a small part of an fp32 search: a whole one gained
    4%, within its run-to-run spread, so fp32 keeps the kernel, as do longer query blocks in bf16 inference."""
    cpu_bf16 = q.device.type == "cpu" and q.dtype == torch.bfloat16
    return cpu_bf16 and (q.requires_grad or q.shape[2] == 1)


SEPARATE_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
"""The projections earlier attnx kept as three `nn.Linear`s, in the order their rows stack in `in_proj`."""


def fuse_separate_projections(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load-time hook: a state dict of the earlier layout (`q_proj`, `k_proj`, `v_proj`, each a weight and a
    bias) gets them stacked along the output dimension as `in_proj`, the one projection this layout holds.
    Weights are not changed, only stacked: the model computes what it computed before."""
    for suffix in ("weight", "bias"):
        names = [f"{prefix}{name}.{suffix}" for name in SEPARATE_PROJECTIONS]
        if all(name in state_dict for name in names):
            state_dict[f"{prefix}in_proj.{suffix}"] = torch.cat([state_dict.pop(name) for name in names])


class MultiHeadAttention(nn.Module):
    """§3.2.2 Multi-head attention: `Concat(head_1..head_h) W^O`, `head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i)`.

    §3.2.1 scaled dot-product attention `softmax(Q K^T / sqrt(d_k)) V` runs through
    `torch.nn.functional.scaled_dot_product_attention` (same result, fused kernel); the explicit
    computation is used when the weights themselves are asked for, for bf16 decoding steps on CPU
    ([`explicit_on_cpu`][attnx.components.attention.explicit_on_cpu]), and for bf16 training on CPU: there PyTorch's
    CPU flash kernel is the slow part of a step, its backward 4-9x the explicit computation's (`q k^T` and
    `weights v` as bf16 matrix products, the softmax in fp32) on a 2-core AMD EPYC with AVX512-BF16
    (`bench/bench_cpu_attention.py`, docs/benchmarks.md). In fp32 the two were within the noise of each other,
    so fp32 keeps the kernel. `dropout` acts on the attention weights; the paper uses none there (0.0), only
    on sub-layer outputs. `d_k` / `d_v` default to
    `d_model / n_heads`; setting them gives Table 3's rows (A) and (B).

    The mask handed to the kernel is the least one that is exact, because on CUDA any `attn_mask` rules out
    the flash kernel: causal self-attention over a square, unpadded block passes `is_causal` alone; a causal
    query that already sees every key (one decoding step over the cache) passes no mask at all; padding is a
    broadcast `(B, 1, 1, S)` mask, which the memory-efficient kernel takes without expanding it (cuDNN's is
    left out on CUDA: `CUDNN_ATTENTION`).
    `key_mask=None` means no padding, so a caller that knows a batch is unpadded lets every kernel run.

    W^Q, W^K and W^V are one stacked `in_proj` (`(W^Q; W^K; W^V)`): self-attention (`query is key_value`)
    projects its input once, in one matrix product (one kernel, the input cast once under autocast, not three
    times); encoder-decoder attention projects the queries with W^Q and the memory with W^K and W^V stacked,
    two products. Checkpoints of the earlier layout, three separate projections, load unchanged
    ([`fuse_separate_projections`][attnx.components.attention.fuse_separate_projections]).

    `kv_heads` (default `n_heads`): grouped-query attention (Ainslie et al. 2023), `kv_heads` key/value heads,
    each shared by `n_heads / kv_heads` consecutive query heads; `kv_heads: 1` is multi-query attention
    (Shazeer 2019). W^K and W^V shrink to `kv_heads * d_k` rows and the decoding cache holds only those
    heads. Positions acting inside attention (rotary on queries and keys, ALiBi or T5 biases on the
    scores) are taken through `positions` (`positions_accepted`).
    """

    positions_accepted = ("queries_keys", "scores")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        d_k: int | None = None,
        d_v: int | None = None,
        kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        d_model, n_heads = integer("d_model", d_model), integer("n_heads", n_heads)
        d_k = optional_integer("d_k", d_k, what="the width of each head's queries and keys")
        d_v = optional_integer("d_v", d_v, what="the width of each head's values")
        dropout, bias = probability("dropout", dropout), flag("bias", bias)
        if d_model % n_heads and (d_k is None or d_v is None):
            raise ConfigError(
                f"d_model ({d_model}) must be divisible by the number of heads ({n_heads}); "
                f"d_k = d_v = d_model / heads. Choose e.g. heads in "
                f"{[h for h in (1, 2, 4, 8, 16, 32) if d_model % h == 0]}, or set d_k and d_v explicitly."
            )
        kv_heads = n_heads if kv_heads is None else kv_heads
        divisors = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
        if not is_integer(kv_heads):
            raise ConfigError(
                f"kv_heads must be an integer, one of {divisors} (n_heads {n_heads}), got {kv_heads!r}"
            )
        if kv_heads <= 0 or n_heads % kv_heads:
            raise ConfigError(
                f"kv_heads ({kv_heads}) must divide n_heads ({n_heads}): each key/value head serves "
                f"n_heads / kv_heads query heads. Choose one of {divisors}"
            )
        self.n_heads = n_heads
        self.kv_heads = kv_heads
        self.d_k = d_k or d_model // n_heads  # Table 3 (B) varies d_k alone
        self.d_v = d_v or d_model // n_heads
        self.dropout = dropout
        self.sizes = (n_heads * self.d_k, kv_heads * self.d_k, kv_heads * self.d_v)  # rows of W^Q, W^K, W^V
        self.in_proj = nn.Linear(d_model, sum(self.sizes), bias=bias)  # (W^Q; W^K; W^V) stacked
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model, bias=bias)
        # each of W^Q, W^K, W^V, W^O initialized as its own matrix, in that order (as when they were four)
        for weight in (*self.in_proj.weight.data.split(self.sizes), self.out_proj.weight.data):
            nn.init.xavier_uniform_(weight)
        for proj in (self.in_proj, self.out_proj):
            if bias:
                nn.init.zeros_(proj.bias)
        self.register_load_state_dict_pre_hook(fuse_separate_projections)

    def projections(self) -> list[tuple[Tensor, Tensor | None]]:
        """`(weight, bias)` of W^Q, W^K and W^V, views into `in_proj` (what exporters write one by one)."""
        weights = self.in_proj.weight.split(self.sizes)
        biases = self.in_proj.bias.split(self.sizes) if self.in_proj.bias is not None else (None,) * 3
        return list(zip(weights, biases, strict=True))

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, -1).transpose(1, 2)  # (B, heads, T, d_k or d_v)

    def _shared(self, x: Tensor) -> Tensor:
        """Key/value heads `(B, H_kv, S, d)` repeated for the query heads they serve: `(B, H, S, d)`."""
        group = self.n_heads // self.kv_heads
        return x if group == 1 else x.repeat_interleave(group, dim=1)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        *,
        key_mask: Tensor | None = None,
        causal: bool = False,
        cache: KeyValueCache | None = None,
        need_weights: bool = False,
        positions: PositionalEncoding | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        b, t, _ = query.shape
        if query is key_value:  # self-attention: Q, K and V in one matrix product
            q, k, v = self.in_proj(query).split(self.sizes, dim=-1)  # (B, T, H*d_k), ..., (B, T, H_kv*d_v)
            q, k = positioned_queries_keys(
                positions, self._heads(q, self.n_heads), self._heads(k, self.kv_heads), cache_offset(cache)
            )  # (B, H, T, d_k), (B, H_kv, T, d_k)
            kv = (k, self._heads(v, self.kv_heads))
            k, v, offset = cached_keys_values(cache, lambda: kv)
        else:  # encoder-decoder attention: Q from the queries, K and V in one product from the memory
            rows = (self.sizes[0], self.sizes[1] + self.sizes[2])
            w_q, w_kv = self.in_proj.weight.split(rows)
            b_q, b_kv = (None, None) if self.in_proj.bias is None else self.in_proj.bias.split(rows)
            q = F.linear(query, w_q, b_q)

            def project() -> tuple[Tensor, Tensor]:
                k, v = F.linear(key_value, w_kv, b_kv).split(self.sizes[1:], dim=-1)
                return self._heads(k, self.kv_heads), self._heads(v, self.kv_heads)

            k, v, offset = cached_keys_values(cache, project)  # (B, H_kv, S, d_k), (B, H_kv, S, d_v)
            q = self._heads(q, self.n_heads)  # (B, H, T, d_k)
        k, v = self._shared(k), self._shared(v)  # (B, H, S, d_k), (B, H, S, d_v)
        s = k.shape[2]
        bias = score_bias(positions, t, s, offset, causal)  # (H, T, S) or None
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights or explicit_on_cpu(q):
            mask = attention_mask(key_mask, causal, t, s, offset, query.device)
            scores = (q @ k.transpose(-2, -1)) * (
                1.0 / math.sqrt(self.d_k)
            )  # (B, H, T, S), bf16 under autocast
            # softmax in fp32 (or wider); a fully masked row gives zeros, as the kernel's does
            wide = torch.promote_types(scores.dtype, torch.float32)
            if bias is not None:
                scores = scores.to(wide) + bias.to(wide)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1, dtype=wide)
            weights = weights.nan_to_num(0.0)
            out = F.dropout(weights.to(v.dtype), dropout, self.training) @ v
        else:
            # Query i sits at position offset + i and sees keys j <= offset + i: causality hides a key only
            # when the first query cannot see the last one.
            causal = causal and offset < s - 1
            if bias is not None:  # the bias rides in a float mask, -inf where padding or causality forbid
                mask = attention_mask(key_mask, causal, t, s, offset, query.device)
                mask = additive_mask(bias, mask, q.dtype)  # (B|1, H, T, S)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            elif causal and key_mask is None and offset == 0 and t == s:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
            else:
                mask = attention_mask(
                    key_mask, causal, t, s, offset, query.device
                )  # (B|1, 1, T|1, S) or None
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        out = self.out_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, T, D)
        return (out, weights) if need_weights else out


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_attention("multihead", MultiHeadAttention)
