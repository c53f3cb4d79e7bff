"""§3.2 Scaled dot-product and multi-head attention against a plain float64 computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnx.components import attention
from attnx.components.attention import MultiHeadAttention, attention_backends
from attnx.errors import ConfigError
from attnx.model.cache import AttentionCache
from tests.model.reference import attention as reference_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_multihead_matches_reference(causal, padded):
    attn = MultiHeadAttention(32, 4).double().eval()
    p = {f"m.{k}": v for k, v in attn.state_dict().items()}
    q = torch.randn(2, 5, 32, dtype=torch.float64)
    kv = q if causal else torch.randn(2, 5, 32, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]) if padded else None
    out = attn(q, kv, key_mask=key_mask, causal=causal)
    for b in range(2):
        allowed = torch.ones(5, 5, dtype=torch.bool)
        if causal:
            allowed = torch.tril(allowed)
        if padded:
            allowed = allowed & key_mask[b]
        expected = reference_attention(q[b], kv[b], p, "m", 4, allowed)
        torch.testing.assert_close(out[b], expected, rtol=1e-10, atol=1e-10)


def test_weights_path_equals_fused_path_and_rows_sum_to_one():
    attn = MultiHeadAttention(32, 4).eval()
    q, kv = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    key_mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    fused = attn(q, kv, key_mask=key_mask)
    explicit, weights = attn(q, kv, key_mask=key_mask, need_weights=True)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    assert weights.shape == (2, 4, 4, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 4))
    assert weights[1, :, :, 2:].abs().max() == 0


def test_scaled_by_sqrt_dk():
    """One head, identity projections: the output is softmax(q k^T / sqrt(d_k)) v exactly."""
    attn = MultiHeadAttention(4, 1, bias=False).double()
    attn.in_proj.weight.data = torch.eye(4, dtype=torch.float64).repeat(3, 1)
    attn.out_proj.weight.data = torch.eye(4, dtype=torch.float64)
    q, k = torch.randn(1, 2, 4, dtype=torch.float64), torch.randn(1, 3, 4, dtype=torch.float64)
    expected = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(4), -1) @ k
    torch.testing.assert_close(attn(q, k), expected)


def test_self_attention_cache_grows_and_static_cache_is_reused():
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    full = attn(x, x, causal=True)
    cache = AttentionCache()
    steps = [attn(x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache) for i in range(5)]
    assert cache.length == 5
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    memory = torch.randn(2, 7, 32)
    static = AttentionCache(static=True)
    first = attn(x[:, :1], memory, cache=static)
    # A static cache is not recomputed: a different memory is ignored once the cache is filled.
    again = attn(x[:, :1], torch.zeros_like(memory), cache=static)
    torch.testing.assert_close(first, again)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match=r"d_model \(30\) must be divisible by the number of heads \(4\)"):
        MultiHeadAttention(30, 4)


def test_key_and_value_sizes_can_differ_from_d_model_over_heads():
    """Table 3 (B): d_k reduced with h and d_model fixed; the output keeps d_model."""
    attn = MultiHeadAttention(32, 4, d_k=3, d_v=5)
    assert attn.sizes == (12, 12, 20) and attn.in_proj.out_features == 44 and attn.out_proj.in_features == 20
    x = torch.randn(2, 4, 32)
    assert attn(x, x, causal=True).shape == (2, 4, 32)
    assert attn(x, x, need_weights=True)[1].shape == (2, 4, 4, 4)


class KernelCalls:
    """Records what each call of ``scaled_dot_product_attention`` was given, then runs it."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[tuple[int, ...] | None, bool]] = []
        real = F.scaled_dot_product_attention

        def record(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
            self.calls.append((None if attn_mask is None else tuple(attn_mask.shape), is_causal))
            return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", record)


def test_kernel_gets_the_least_exact_mask(monkeypatch):
    """On CUDA any attn_mask rules out the flash kernel: masks are passed only where they hide something."""
    kernel = KernelCalls(monkeypatch)
    attn = MultiHeadAttention(32, 4).eval()
    x, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    padding = torch.arange(7) < torch.tensor([[7], [4], [2]])  # (B, S)
    attn(x, x, causal=True)  # decoder self-attention in training
    attn(x, memory, key_mask=padding)  # encoder-decoder attention, padded sources
    attn(x, memory)  # unpadded sources
    cache = AttentionCache()
    for i in range(3):  # decoding: each new query sees every cached key
        attn(x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache)
    attn(
        x[:, 3:5], x[:, 3:5], causal=True, cache=cache
    )  # two queries over the cache: the first misses one key
    assert kernel.calls == [
        (None, True),
        ((3, 1, 1, 7), False),  # broadcast over heads and queries, never expanded to (B, H, T, S)
        (None, False),
        (None, False),
        (None, False),
        (None, False),
        ((1, 1, 2, 5), False),
    ]


def test_chunk_over_the_cache_equals_the_full_causal_pass():
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    cache = AttentionCache()
    parts = [
        attn(x[:, :1], x[:, :1], causal=True, cache=cache),
        attn(x[:, 1:4], x[:, 1:4], causal=True, cache=cache),
    ]
    parts.append(attn(x[:, 4:], x[:, 4:], causal=True, cache=cache))
    torch.testing.assert_close(torch.cat(parts, 1), attn(x, x, causal=True), rtol=1e-5, atol=1e-5)


class CudaLike:
    """A stand-in for a CUDA tensor: only ``is_cuda`` is read."""

    is_cuda = True


def test_cudnn_attention_is_left_out_while_the_context_lasts():
    """cuDNN's attention cost 2.3 ms of host time a call on an H200: over CUDA tensors the context turns
    PyTorch's cuDNN switch off, then the switch is as it was, after an error too; CPU tensors and
    ``CUDNN_ATTENTION`` leave it alone, and a switch the user turned off stays off."""
    flags = torch.backends.cuda
    assert flags.cudnn_sdp_enabled()
    with attention_backends(CudaLike()):
        assert not flags.cudnn_sdp_enabled() and flags.flash_sdp_enabled() and flags.math_sdp_enabled()
    with pytest.raises(RuntimeError, match="kernel failed"), attention_backends(CudaLike()):
        raise RuntimeError("kernel failed")
    assert flags.cudnn_sdp_enabled()
    with attention_backends(torch.zeros(1)):
        assert flags.cudnn_sdp_enabled()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "CUDNN_ATTENTION", True)
        with attention_backends(CudaLike()):
            assert flags.cudnn_sdp_enabled()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        with attention_backends(CudaLike()):  # the caller's choice holds, less cuDNN's
            assert (
                flags.cudnn_sdp_enabled(),
                flags.flash_sdp_enabled(),
                flags.mem_efficient_sdp_enabled(),
            ) == (
                False,
                False,
                True,
            )
        assert flags.cudnn_sdp_enabled()
    assert flags.cudnn_sdp_enabled() and flags.flash_sdp_enabled() and flags.math_sdp_enabled()


def test_the_kernel_choice_is_made_once_a_pass_not_once_an_attention_call(monkeypatch):
    """A forward pass enters the kernel choice once per stack, however many layers and attention calls it
    has; an attention call itself sets no flag (it did twice a call on CUDA)."""
    from attnx.model import TransformerConfig, build_transformer

    entered: list[list] = []  # the kernels each choice allowed
    cudnn_during_calls: list[bool] = []
    real_choice, real_kernel = attention.sdpa_kernel, F.scaled_dot_product_attention

    def choice(backends):
        entered.append(backends)
        return real_choice(backends)

    def kernel(*args, **kwargs):
        cudnn_during_calls.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real_kernel(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_kernel", choice)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    monkeypatch.setattr(attention, "excludes_cudnn", lambda x: True)  # a CUDA run, as far as the choice goes
    for layers in (1, 3):
        config = TransformerConfig(
            vocab_size=20, d_model=16, n_heads=2, d_ff=32, encoder_layers=layers, decoder_layers=layers
        )
        model = build_transformer(config).eval()
        src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 4))
        entered.clear(), cudnn_during_calls.clear()
        model(src, tgt, src > 0)
        assert len(entered) == 2  # encoder, decoder
        assert cudnn_during_calls == [False] * 3 * layers
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_compiled_attention_layer_is_one_graph_and_computes_what_eager_does():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 7, 32)
    key_mask = torch.arange(7) < torch.tensor([[7], [4], [2]])
    explained = torch._dynamo.explain(attn)(x, x, key_mask=key_mask)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(attn, backend="aot_eager", dynamic=True)
    torch.testing.assert_close(compiled(x, x, key_mask=key_mask), attn(x, x, key_mask=key_mask))


# --- CUDA kernels ----------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ampere = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
    reason="the flash kernel in bf16 needs a CUDA device of compute capability 8.0 or newer",
)


def fused_only():
    """Every fused CUDA kernel allowed, the math fallback not: a shape no fused kernel takes raises."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    )


def flash_only():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def padded_batch(batch: int, length: int, d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, length, d_model, device="cuda", requires_grad=True)
    lengths = torch.randint(1, length + 1, (batch,), device="cuda")
    lengths[0] = length
    return x, torch.arange(length, device="cuda") < lengths[:, None]  # (B, S) True = real token


@pytest.mark.gpu
@ampere
@pytest.mark.parametrize("d_model,n_heads", [(512, 8), (1024, 16)], ids=["base", "big"])
@pytest.mark.parametrize("batch,length", [(100, 31), (12, 250)], ids=["3125-tokens", "longest"])
def test_training_attention_runs_on_fused_kernels_in_bf16(d_model, n_heads, batch, length):
    """The three attentions of a training step, forward and backward, bf16 autocast, base and big shapes.

    Whichever fused kernel runs must honour the padding mask: keys at padded positions, changed, change nothing.
    """
    attn = MultiHeadAttention(d_model, n_heads, dropout=0.0).cuda().train()
    src, src_mask = padded_batch(batch, length + 3, d_model)
    tgt = torch.randn(batch, length, d_model, device="cuda", requires_grad=True)
    noise = torch.where(src_mask.unsqueeze(-1), 0.0, 10 * torch.randn_like(src) + 5)
    with torch.autocast("cuda", dtype=torch.bfloat16), fused_only(), attention_backends(src):
        outs = [
            attn(src, src, key_mask=src_mask),
            attn(tgt, tgt, causal=True),
            attn(tgt, src, key_mask=src_mask),
        ]
        sum(o.float().sum() for o in outs).backward()
        with torch.no_grad():
            cross = attn(tgt, src + noise, key_mask=src_mask)
            encoder = attn(src, src + noise, key_mask=src_mask)
    assert all(o.dtype == torch.bfloat16 and torch.isfinite(o).all() for o in outs)
    assert torch.isfinite(src.grad).all() and torch.isfinite(tgt.grad).all()
    torch.testing.assert_close(cross, outs[2].detach(), rtol=0, atol=1e-3)
    real = src_mask.unsqueeze(-1).expand_as(
        encoder
    )  # rows of real source tokens (padded queries: don't care)
    torch.testing.assert_close(encoder[real], outs[0].detach()[real], rtol=0, atol=1e-3)


@pytest.mark.gpu
@ampere
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_padded_training_attention_runs_no_cudnn_kernel(compiled):
    """What the profile of a training step showed costing 61% of it: no cuDNN attention, forward or backward,
    eager or compiled (compiled layers ran 3.7x slower than eager on an H200 while they kept cuDNN's)."""
    from torch.profiler import ProfilerActivity, profile

    attn = MultiHeadAttention(512, 8).cuda().train()
    if compiled:
        attn = torch.compile(attn, dynamic=True)
        src, src_mask = padded_batch(100, 34, 512)
        with (
            torch.autocast("cuda", dtype=torch.bfloat16),
            attention_backends(src),
        ):  # compiled before the profile
            attn(src, src, key_mask=src_mask).float().sum().backward()
            attn(src, src, causal=True).float().sum().backward()
    src, src_mask = padded_batch(100, 34, 512)
    with (
        torch.autocast("cuda", dtype=torch.bfloat16),
        attention_backends(src),
        profile(activities=[ProfilerActivity.CUDA]) as prof,
    ):
        attn(src, src, key_mask=src_mask).float().sum().backward()
        attn(src, src, causal=True).float().sum().backward()
        torch.cuda.synchronize()
    names = [event.key for event in prof.key_averages()]
    assert not [name for name in names if "cudnn" in name.lower() and "sdpa" in name.lower()], names
    assert [name for name in names if "flash" in name.lower() or "fmha" in name.lower()], names
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.gpu
@ampere
def test_unpadded_and_decoding_self_attention_run_on_the_flash_kernel():
    attn = MultiHeadAttention(512, 8).cuda()
    x = torch.randn(64, 30, 512, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16), flash_only():
        attn(x, x, causal=True).float().sum().backward()  # decoder self-attention in training
        attn(x, x).float().sum().backward()  # an unpadded encoder batch (key_mask None)
        cache = AttentionCache()
        with torch.no_grad():
            steps = [attn(x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache) for i in range(5)]
    assert torch.isfinite(x.grad).all() and cache.length == 5
    assert all(torch.isfinite(s).all() for s in steps)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_bf16_matches_the_float64_computation(causal):
    """The kernel CUDA picks by default (cuDNN, flash or memory-efficient), against CPU float64."""
    attn = MultiHeadAttention(512, 8).eval()
    x, memory = torch.randn(8, 40, 512), torch.randn(8, 45, 512)
    key_mask = torch.arange(45) < torch.randint(1, 46, (8, 1))
    kv, mask = (x, None) if causal else (memory, key_mask)
    expected = attn.double()(x.double(), kv.double(), key_mask=mask, causal=causal)
    attn = attn.float().cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = attn(x.cuda(), kv.cuda(), key_mask=None if mask is None else mask.cuda(), causal=causal)
    torch.testing.assert_close(out.double().cpu(), expected, rtol=0.05, atol=0.02)


def test_bf16_training_on_cpu_runs_the_explicit_computation(monkeypatch):
    """bf16 training on CPU skips the CPU flash kernel (its backward is the slow part of a step); fp32 training,
    validation and decoding keep it."""
    kernel = KernelCalls(monkeypatch)
    attn = MultiHeadAttention(32, 4).train()
    x = torch.randn(2, 5, 32)
    key_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn(x, x, key_mask=key_mask, causal=True).float().sum().backward()
        assert kernel.calls == []
        with torch.no_grad():
            attn(x, x, key_mask=key_mask)  # no gradient (validation, decoding): the fused kernel
    attn(x, x, key_mask=key_mask)  # fp32 training
    assert kernel.calls == [((2, 1, 1, 5), False)] * 2
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


def test_cpu_training_under_bf16_autocast_keeps_the_softmax_in_fp32():
    attn = MultiHeadAttention(32, 4).train()
    x = torch.randn(3, 6, 32)
    key_mask = torch.arange(6) < torch.tensor([[6], [4], [1]])  # (B, S); one source of a single token
    expected = attn(x, x, key_mask=key_mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = attn(x, x, key_mask=key_mask, need_weights=True)
        fused = attn(x, x, key_mask=key_mask)
    assert weights.dtype == torch.float32 and out.dtype == fused.dtype == torch.bfloat16
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 6))
    assert weights[2, :, :, 1:].abs().max() == 0
    torch.testing.assert_close(fused.float(), expected, rtol=0.05, atol=0.05)


def test_under_autocast_each_input_is_cast_once_not_once_per_projection():
    """bf16 autocast casts a linear layer's fp32 input for every product: with W^Q, W^K and W^V stacked, a
    self-attention input is cast once (it was three times) and an encoder-decoder memory once (twice)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    attn = MultiHeadAttention(32, 4).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), Casts() as casts:
        attn(x, x)
        attn(x, memory)
    activations = [shape for shape in casts.shapes if shape[0] == 2]
    assert activations == [(2, 5, 32), (2, 5, 32), (2, 7, 32)]


@pytest.mark.parametrize("cross", [False, True])
def test_stacked_projection_gradients_equal_those_of_three_separate_projections(cross):
    """float64: the gradient of the stacked W^Q; W^K; W^V is the three separate projections' gradients stacked
    (self-attention in one product, encoder-decoder attention in two)."""
    attn = MultiHeadAttention(32, 4).double().train()
    x = torch.randn(2, 5, 32, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 6, 32, dtype=torch.float64, requires_grad=True) if cross else x
    key_mask = torch.tensor([[True] * memory.shape[1], [True] * 3 + [False] * (memory.shape[1] - 3)])
    weights = torch.linspace(-1, 1, 32, dtype=torch.float64)
    (attn(x, memory, key_mask=key_mask, causal=not cross) * weights).sum().backward()

    separate = {  # leaf tensors: the earlier layout's parameters, as the reference reads them
        f"m.{name}.{kind}": tensor.detach().clone().requires_grad_()
        for name, (weight, bias) in zip(("q_proj", "k_proj", "v_proj"), attn.projections(), strict=True)
        for kind, tensor in (("weight", weight), ("bias", bias))
    } | {f"m.out_proj.{k}": v.detach() for k, v in attn.out_proj.state_dict().items()}
    xr, mr = x.detach().requires_grad_(), memory.detach().clone().requires_grad_()
    total = 0
    for b in range(2):
        allowed = (
            key_mask[b].expand(5, -1)
            if cross
            else torch.tril(torch.ones(5, 5, dtype=torch.bool)) & key_mask[b]
        )
        kv = mr[b] if cross else xr[b]
        total = total + (reference_attention(xr[b], kv, separate, "m", 4, allowed) * weights).sum()
    total.backward()
    for kind in ("weight", "bias"):
        stacked = torch.cat([separate[f"m.{name}.{kind}"].grad for name in ("q_proj", "k_proj", "v_proj")])
        torch.testing.assert_close(getattr(attn.in_proj, kind).grad, stacked, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-10, atol=1e-10)
    if cross:
        torch.testing.assert_close(memory.grad, mr.grad, rtol=1e-10, atol=1e-10)


def grouped_reference(attn, query, keys, allowed, bias=None, rotate=None):
    """Grouped-query attention (Ainslie et al. 2023) one head at a time, float64: query head `i` uses key/value
    head `i // (H / H_kv)`; `rotate(x, positions)` turns queries and keys, `bias` `(H, T, S)` joins the scores."""
    w_q, w_k, w_v = (w for w, _ in attn.projections())
    b_q, b_k, b_v = (b for _, b in attn.projections())
    d_k, group = attn.d_k, attn.n_heads // attn.kv_heads
    heads = []
    for i in range(attn.n_heads):
        j = i // group
        q = query @ w_q[i * d_k : (i + 1) * d_k].T + b_q[i * d_k : (i + 1) * d_k]  # (T, d_k)
        k = keys @ w_k[j * d_k : (j + 1) * d_k].T + b_k[j * d_k : (j + 1) * d_k]  # (S, d_k)
        v = keys @ w_v[j * d_k : (j + 1) * d_k].T + b_v[j * d_k : (j + 1) * d_k]
        if rotate is not None:
            q, k = rotate(q, torch.arange(len(q))), rotate(k, torch.arange(len(k)))
        scores = q @ k.T / math.sqrt(d_k) + (0 if bias is None else bias[i])
        heads.append(torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v)
    return torch.cat(heads, -1) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_query_attention_matches_its_definition_in_float64(kv_heads, need_weights):
    attn = MultiHeadAttention(32, 4, kv_heads=kv_heads).double().eval()
    assert attn.sizes == (32, 8 * kv_heads, 8 * kv_heads)  # W^K, W^V shrink with the key/value heads
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    memory = torch.randn(1, 4, 32, dtype=torch.float64)
    for query, keys, causal in ((x, x, True), (x, memory, False)):
        out = attn(query, keys, causal=causal, need_weights=need_weights)
        out = out[0] if need_weights else out
        allowed = torch.ones(6, keys.shape[1], dtype=torch.bool)
        allowed = torch.tril(allowed) if causal else allowed
        torch.testing.assert_close(
            out[0], grouped_reference(attn, query[0], keys[0], allowed), rtol=1e-10, atol=1e-10
        )


def test_the_cache_of_grouped_query_attention_holds_only_the_key_value_heads():
    attn = MultiHeadAttention(32, 4, kv_heads=1).eval()
    x = torch.randn(2, 5, 32)
    full = attn(x, x, causal=True)
    cache = AttentionCache()
    steps = [attn(x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.k.shape == (2, 1, 5, 8) and cache.v.shape == (2, 1, 5, 8)
    with pytest.raises(ValueError, match=r"kv_heads \(3\) must divide n_heads \(4\)"):
        MultiHeadAttention(32, 4, kv_heads=3)


class ScoreBias(torch.nn.Module):
    """A throwaway score bias: a random `(H, T, S)` table read at the query's absolute position."""

    acts_on = "scores"

    def __init__(self, heads: int, length: int) -> None:
        super().__init__()
        self.table = torch.randn(heads, length, length, dtype=torch.float64)

    def forward(self, t, s, offset=0, causal=False):
        return self.table[:, offset : offset + t, :s]


class Turn(torch.nn.Module):
    """A throwaway rotary-like position: each feature pair turned by `position` radians."""

    acts_on = "queries_keys"

    def forward(self, x, offset=0):
        angle = torch.arange(offset, offset + x.shape[-2], dtype=x.dtype).unsqueeze(-1)  # (T, 1)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack(
            (even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos()), -1
        ).flatten(-2)


def turn_rows(x, positions):
    """Each row of `x` `(T, d)` turned by its position in radians, pair by pair, written out."""
    out = x.clone()
    for t, angle in enumerate(positions.tolist()):
        c, s = math.cos(angle), math.sin(angle)
        out[t, 0::2] = x[t, 0::2] * c - x[t, 1::2] * s
        out[t, 1::2] = x[t, 0::2] * s + x[t, 1::2] * c
    return out


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_positions_inside_attention_act_on_the_scores_or_on_queries_and_keys(need_weights, padded):
    attn = MultiHeadAttention(32, 4, kv_heads=2).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]) if padded else None
    bias = ScoreBias(4, 6)
    for positions, kwargs in ((bias, {"bias": bias.table}), (Turn(), {"rotate": turn_rows})):
        out = attn(x, x, key_mask=key_mask, positions=positions, need_weights=need_weights)
        out = out[0] if need_weights else out
        for b in range(2):
            allowed = torch.ones(6, 6, dtype=torch.bool)
            if padded and b == 1:
                allowed[:, 4:] = False
            expected = grouped_reference(attn, x[b], x[b], allowed, **kwargs)
            torch.testing.assert_close(out[b], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("positions", [ScoreBias(4, 7), Turn()])
def test_positions_inside_attention_take_the_offset_of_incremental_decoding_from_the_cache(positions):
    attn = MultiHeadAttention(32, 4, kv_heads=2).double().eval()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    full = attn(x, x, causal=True, positions=positions)
    cache = AttentionCache()
    blocks = [x[:, :3]] + [x[:, i : i + 1] for i in range(3, 7)]  # a prefix, then one position a step
    steps = torch.cat([attn(h, h, causal=True, cache=cache, positions=positions) for h in blocks], 1)
    torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # 2.0 reached torch.empty: "argument 'size' ... must be tuple of ints"
        (dict(kv_heads=2.0), r"^kv_heads must be an integer, one of \[1, 2, 4\] \(n_heads 4\), got 2\.0$"),
        (dict(kv_heads=True), r"^kv_heads must be an integer, one of \[1, 2, 4\] \(n_heads 4\), got True$"),
        (dict(kv_heads=0), r"^kv_heads \(0\) must divide n_heads \(4\)"),
        (dict(d_k=0), r"^d_k must be an integer >= 1 \(the width of each head's queries and keys\), got 0$"),
        (dict(d_v=-1), r"^d_v must be an integer >= 1 \(the width of each head's values\), got -1$"),
        (dict(dropout=1.0), r"^dropout must be in \[0, 1\), got 1\.0$"),
        (dict(dropout=float("nan")), r"^dropout must be in \[0, 1\), got nan$"),
        (dict(bias="no"), r"^bias must be true or false, got 'no'$"),
        (dict(n_heads=4.0), r"^n_heads must be an integer >= 1, got 4\.0$"),
    ],
)
def test_a_head_count_width_or_dropout_out_of_range_is_one_line_naming_it(args, message):
    with pytest.raises(ConfigError, match=message):
        MultiHeadAttention(**({"d_model": 32, "n_heads": 4} | args))


def test_the_kernel_flags_are_marked_constant_for_the_compiler_as_its_decorator_marks_them() -> None:
    """`backend_enabled` carries what `torch.compiler.assume_constant_result` sets (without importing the
    compiler at start-up); a PyTorch that marks functions otherwise fails here, not in a compiled run."""
    import subprocess
    import sys

    import torch

    from attnx.components.attention import backend_enabled

    def probe() -> bool:
        return True

    marked = torch.compiler.assume_constant_result(probe)
    assert {k: v for k, v in vars(marked).items()} == {"_dynamo_marked_constant": True}
    assert backend_enabled._dynamo_marked_constant is True
    code = "import sys, attnx.components.attention; print('torch._dynamo' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
