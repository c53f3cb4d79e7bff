"""Gated feed-forward networks (Shazeer 2020) against `(act(x W) ⊗ x V) W2` written out."""

from __future__ import annotations

import math

import pytest
import torch

from attnx.components.gated import GEGLUFeedForward, SwiGLUFeedForward
from attnx.errors import ConfigError


def swish(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))  # Swish_1(x) = x σ(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # x Φ(x)


@pytest.mark.parametrize(("cls", "act"), [(SwiGLUFeedForward, swish), (GEGLUFeedForward, gelu)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_the_papers_equation_in_float64(cls, act, bias):
    ffn = cls(16, 24, bias=bias).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    w, v, w2 = ffn.w.weight.T, ffn.v.weight.T, ffn.w2.weight.T
    if bias:
        with torch.no_grad():
            for layer in (ffn.w, ffn.v, ffn.w2):
                layer.bias.normal_()
        expected = (act(x @ w + ffn.w.bias) * (x @ v + ffn.v.bias)) @ w2 + ffn.w2.bias
    else:
        expected = (act(x @ w) * (x @ v)) @ w2
    torch.testing.assert_close(ffn(x), expected, rtol=1e-12, atol=1e-12)


def test_d_ff_is_the_hidden_width_of_each_of_the_three_matrices():
    ffn = SwiGLUFeedForward(16, 24)
    assert [tuple(p.shape) for p in ffn.parameters()] == [(24, 16), (24, 16), (16, 24)]
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 16 * 24 and ffn.matrices == 3
    assert (
        sum(p.numel() for p in SwiGLUFeedForward(16, 24, bias=True).parameters()) == 3 * 16 * 24 + 2 * 24 + 16
    )


def test_dropout_acts_on_the_gated_hidden_activations_only_while_training():
    ffn = GEGLUFeedForward(16, 64, dropout=0.5)
    x = torch.randn(1, 3, 16)
    torch.manual_seed(0)
    trained = ffn.train()(x)
    assert not torch.allclose(trained, ffn.eval()(x))
    torch.testing.assert_close(ffn.eval()(x), ffn.eval()(x))


@pytest.mark.parametrize("cls", [SwiGLUFeedForward, GEGLUFeedForward])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(d_ff=0), r"^d_ff must be an integer >= 1 \(the hidden width\), got 0$"),
        (dict(d_ff=-8), r"^d_ff must be an integer >= 1 \(the hidden width\), got -8$"),
        (dict(dropout=1.5), r"^dropout must be in \[0, 1\), got 1.5$"),  # F.dropout's ValueError at step 1
        (dict(dropout=float("nan")), r"^dropout must be in \[0, 1\), got nan$"),
        (dict(bias="no"), r"^bias must be true or false, got 'no'$"),
    ],
)
def test_a_width_dropout_or_bias_out_of_range_is_refused_when_built(cls, args, message):
    with pytest.raises(ConfigError, match=message):
        cls(**({"d_model": 16, "d_ff": 24} | args))
