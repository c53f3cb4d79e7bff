"""The contract every registered component must keep; a new plugin is tested by being registered.

Parametrized over the installed registry, so third-party components installed beside attnx are covered.
"""

from __future__ import annotations

import pytest
import torch

from attnx.components.protocols import POSITIONAL_PLACES
from attnx.plugins import registry
from attnx.registry import Kind

D, H, FF, MAX_LEN = 32, 4, 64, 64


def names(kind: Kind) -> list[str]:
    return registry().names(kind)


def build(kind: Kind, name: str):
    shape = {
        Kind.ATTENTION: (D, H),
        Kind.FEEDFORWARD: (D, FF),
        Kind.POSITIONAL: (D, MAX_LEN),
        Kind.NORM: (D,),
    }
    return registry().build(kind, name, *shape[kind])


def assert_gradients_flow(module, output, inputs):
    output.pow(2).sum().backward()
    for x in inputs:
        assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def assert_state_dict_round_trip(kind, name, module, run):
    torch.manual_seed(123)
    fresh = build_positional(name) if kind is Kind.POSITIONAL else build(kind, name)
    fresh.load_state_dict(module.state_dict())
    torch.testing.assert_close(run(fresh.eval()), run(module.eval()))


@pytest.mark.parametrize("name", names(Kind.ATTENTION))
def test_attention_contract(name):
    attn = build(Kind.ATTENTION, name).eval()
    q = torch.randn(2, 6, D, requires_grad=True)
    kv = torch.randn(2, 6, D, requires_grad=True)
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    out = attn(q, kv, key_mask=key_mask)
    assert out.shape == (2, 6, D)
    # Padded keys are ignored.
    noisy = kv.detach().clone()
    noisy[1, 4:] = 100.0
    torch.testing.assert_close(attn(q, noisy, key_mask=key_mask)[1], out[1].detach(), rtol=1e-5, atol=1e-5)
    # Causal: a position never sees a later one.
    x = torch.randn(2, 6, D)
    before = attn(x, x, causal=True)
    later = x.clone()
    later[:, 3:] = torch.randn(2, 3, D)
    torch.testing.assert_close(attn(later, later, causal=True)[:, :3], before[:, :3], rtol=1e-5, atol=1e-5)
    # Weights on request, one distribution (or nothing) per query.
    _, weights = attn(q, kv, key_mask=key_mask, need_weights=True)
    assert weights.shape == (2, H, 6, 6) and weights[1, ..., 4:].abs().max() == 0
    assert_gradients_flow(attn, attn.train()(q, kv, key_mask=key_mask), [q, kv])
    assert_state_dict_round_trip(Kind.ATTENTION, name, attn, lambda m: m(x, x, causal=True))


@pytest.mark.parametrize("name", names(Kind.FEEDFORWARD))
def test_feedforward_contract(name):
    ffn = build(Kind.FEEDFORWARD, name).eval()
    x = torch.randn(2, 5, D, requires_grad=True)
    out = ffn(x)
    assert out.shape == (2, 5, D)
    changed = x.detach().clone()
    changed[:, 2] = 5.0
    torch.testing.assert_close(ffn(changed)[:, [0, 1, 3, 4]], out[:, [0, 1, 3, 4]].detach())  # position-wise
    assert_gradients_flow(ffn, ffn.train()(x), [x])
    assert_state_dict_round_trip(Kind.FEEDFORWARD, name, ffn, lambda m: m(x.detach()))


def place(name: str) -> str:
    return registry().get(Kind.POSITIONAL, name).acts_on


def positional_names(where: str) -> list[str]:
    return [name for name in names(Kind.POSITIONAL) if place(name) == where]


def build_positional(name: str):
    shape = {"embeddings": (D, MAX_LEN), "queries_keys": (D // H, MAX_LEN), "scores": (H, MAX_LEN)}
    module = registry().build(Kind.POSITIONAL, name, *shape[place(name)])
    with torch.no_grad():  # a table that starts at zero would hide whether positions differ
        for p in module.parameters():
            p.add_(torch.randn_like(p))
    return module


def test_every_positional_component_acts_where_the_model_applies_one():
    for name in names(Kind.POSITIONAL):
        assert place(name) in POSITIONAL_PLACES, name


@pytest.mark.parametrize("name", positional_names("embeddings"))
def test_positional_contract(name):
    pe = build_positional(name).eval()
    x = torch.randn(2, 8, D, requires_grad=True)
    out = pe(x)
    assert out.shape == (2, 8, D)
    # Offsets address absolute positions: encoding a suffix at its offset equals the suffix of the whole.
    torch.testing.assert_close(pe(x[:, 5:], offset=5), out[:, 5:])
    assert not torch.allclose(out[:, 0] - x[:, 0], out[:, 1] - x[:, 1])  # positions differ
    out.pow(2).sum().backward()
    assert x.grad is not None
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.zeros(1, MAX_LEN + 1, D))
    assert_state_dict_round_trip(Kind.POSITIONAL, name, pe, lambda m: m(x.detach()))


@pytest.mark.parametrize("name", positional_names("queries_keys"))
def test_query_key_positional_contract(name):
    pe = build_positional(name).eval()
    x = torch.randn(2, H, 8, D // H, requires_grad=True)
    out = pe(x, 0)
    assert out.shape == x.shape
    torch.testing.assert_close(pe(x[:, :, 5:], 5), out[:, :, 5:])  # a suffix at its offset: the whole's
    same = x.detach()[:, :, :1].expand(2, H, 8, D // H)  # one vector at every position
    turned = pe(same, 0)
    assert not torch.allclose(turned[:, :, 0], turned[:, :, 1])  # positions differ
    assert_gradients_flow(pe, out, [x])
    assert_state_dict_round_trip(Kind.POSITIONAL, name, pe, lambda m: m(x.detach(), 0))


@pytest.mark.parametrize("name", positional_names("scores"))
def test_score_bias_contract(name):
    pe = build_positional(name).eval()
    for causal in (False, True):
        bias = pe(6, 6, 0, causal)
        assert bias.shape == (H, 6, 6) and torch.isfinite(bias).all()
        torch.testing.assert_close(pe(2, 6, 4, causal), bias[:, 4:])  # later queries at their offset
        assert not torch.allclose(bias[:, 3, :3], bias[:, 3, :3].flip(-1))  # distances differ
    if any(True for _ in pe.parameters()):  # a learned bias (T5's) trains; a fixed one (ALiBi) has nothing to
        assert_gradients_flow(pe, pe(6, 6, 0, False), [])
    assert_state_dict_round_trip(Kind.POSITIONAL, name, pe, lambda m: m(6, 6, 0, False))


@pytest.mark.parametrize("name", names(Kind.NORM))
def test_norm_contract(name):
    norm = build(Kind.NORM, name).eval()
    x = torch.randn(2, 5, D, requires_grad=True)
    out = norm(x)
    assert out.shape == (2, 5, D)
    torch.testing.assert_close(norm(x[:, :2]), out[:, :2])  # per position
    assert_gradients_flow(norm, norm(x), [x])
    assert_state_dict_round_trip(Kind.NORM, name, norm, lambda m: m(x.detach()))


def test_every_kind_has_a_builtin():
    assert {"multihead"} <= set(names(Kind.ATTENTION))
    assert {"relu", "swiglu", "geglu"} <= set(names(Kind.FEEDFORWARD))
    assert {"sinusoidal", "learned", "rotary", "t5_relative"} <= set(names(Kind.POSITIONAL))
    assert {"layernorm", "rmsnorm"} <= set(names(Kind.NORM))
