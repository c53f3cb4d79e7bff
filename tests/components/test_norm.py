"""Layer normalization, the `LayerNorm` of `LayerNorm(x + Sublayer(x))`."""

from __future__ import annotations

import pytest
import torch

from attnx.components.norm import LayerNorm
from attnx.errors import ConfigError
from attnx.plugins import registry
from attnx.registry import Kind


def test_each_position_is_normalized_over_d_model_then_scaled_and_shifted():
    norm = LayerNorm(16)
    x = 5 + 3 * torch.randn(2, 4, 16)
    out = norm(x)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 4), atol=1e-3, rtol=0)
    with torch.no_grad():
        norm.weight.fill_(2.0)
        norm.bias.fill_(-1.0)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(norm(x), 2 * (x - mean) / torch.sqrt(var + 1e-5) - 1)


def test_epsilon_is_the_papers_default_or_the_one_given():
    assert LayerNorm(16).eps == 1e-5
    assert LayerNorm(16, eps=1e-6).eps == 1e-6
    constant = torch.full((1, 1, 16), 3.0)  # zero variance: epsilon alone keeps it finite
    assert bool((LayerNorm(16, eps=1e-6)(constant) == 0).all())
    assert sum(p.numel() for p in LayerNorm(16).parameters()) == 2 * 16


def test_it_is_the_registered_layernorm():
    entry = registry().entry(Kind.NORM, "layernorm")
    assert entry.factory is LayerNorm and entry.plugin == "attnx.components.norm"


def test_rmsnorm_is_x_over_its_root_mean_square_times_the_gain_in_float64():
    from attnx.components.norm import RMSNorm

    norm = RMSNorm(16).double()
    with torch.no_grad():
        norm.weight.normal_()
    x = 5 + 3 * torch.randn(2, 4, 16, dtype=torch.float64)
    rms = torch.sqrt((x**2).sum(-1, keepdim=True) / 16 + 1e-6)  # Zhang & Sennrich 2019, eq. 4
    torch.testing.assert_close(norm(x), x / rms * norm.weight, rtol=1e-12, atol=1e-12)
    assert [name for name, _ in norm.named_parameters()] == ["weight"]  # a gain, no bias
    assert RMSNorm(16, eps=1e-5).eps == 1e-5
    assert registry().get(Kind.NORM, "rmsnorm") is RMSNorm
    half = norm.float()(x.float().bfloat16())  # bf16 in, bf16 out: the mean of squares is taken in fp32
    assert half.dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("eps", [-1, 0.0, float("nan"), float("inf"), "1e-6"])
def test_an_epsilon_that_is_not_a_finite_positive_number_is_refused_when_built(name, eps):
    """eps -1 took the root of a negative mean square: NaN at the first step, reported as a diverged run."""
    with pytest.raises(ConfigError, match=r"^eps must be a finite number > 0 \(e\.g\. 1e-[56]\), got "):
        registry().build(Kind.NORM, name, 16, eps=eps)
