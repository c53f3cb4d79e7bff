"""§3.3 The position-wise feed-forward network, `max(0, x W1 + b1) W2 + b2` (Eq. 2), and its Swish and GELU
forms (Marian, Hugging Face)."""

from __future__ import annotations

import pytest
import torch

from attnx.components.feedforward import GeluFeedForward, ReluFeedForward, SwishFeedForward
from attnx.errors import ConfigError
from attnx.plugins import registry
from attnx.registry import Kind


def test_it_computes_equation_2_at_every_position():
    ffn = ReluFeedForward(8, 24).eval()
    with torch.no_grad():
        for layer in (ffn.w1, ffn.w2):
            layer.bias.normal_()  # the initial biases are zero: give them something to add
    x = torch.randn(3, 5, 8)
    w1, b1, w2, b2 = ffn.w1.weight, ffn.w1.bias, ffn.w2.weight, ffn.w2.bias
    expected = torch.clamp(x @ w1.T + b1, min=0) @ w2.T + b2
    torch.testing.assert_close(ffn(x), expected)
    assert ffn.w1.weight.shape == (24, 8) and ffn.w2.weight.shape == (8, 24)


def test_fresh_weights_are_xavier_uniform_and_biases_zero():
    ffn = ReluFeedForward(64, 256)
    bound = (6 / (64 + 256)) ** 0.5
    for layer in (ffn.w1, ffn.w2):
        largest = float(layer.weight.detach().abs().max())
        assert 0.9 * bound < largest <= bound
        assert bool((layer.bias == 0).all())


def test_dropout_acts_on_the_hidden_activations_only_while_training():
    ffn = ReluFeedForward(8, 512, dropout=0.5)
    x = torch.randn(2, 3, 8)
    expected = ffn.eval()(x)
    assert ReluFeedForward(8, 512).dropout == 0.0  # the paper has none here
    torch.manual_seed(0)
    trained = ffn.train()(x)
    assert not torch.allclose(trained, expected)
    hidden = torch.relu(ffn.w1(x))
    torch.manual_seed(0)
    kept = torch.nn.functional.dropout(hidden, 0.5, True)
    torch.testing.assert_close(trained, ffn.w2(kept))


def test_it_is_the_registered_relu_feedforward():
    entry = registry().entry(Kind.FEEDFORWARD, "relu")
    assert entry.factory is ReluFeedForward and entry.plugin == "attnx.components.feedforward"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((8, 0), r"^d_ff must be an integer >= 1 \(the hidden width\), got 0$"),
        ((8, -8), r"^d_ff must be an integer >= 1 \(the hidden width\), got -8$"),
        ((8, 24.0), r"^d_ff must be an integer >= 1 \(the hidden width\), got 24.0$"),
        ((8, 24, 1.5), r"^dropout must be in \[0, 1\), got 1.5$"),
        ((8, 24, -0.1), r"^dropout must be in \[0, 1\), got -0.1$"),
        ((8, 24, float("nan")), r"^dropout must be in \[0, 1\), got nan$"),
    ],
)
def test_a_width_or_dropout_out_of_range_is_one_line_naming_it(args, message):
    with pytest.raises(ConfigError, match=message):
        ReluFeedForward(*args)


@pytest.mark.parametrize(
    ("name", "cls", "hf_activation"),
    [("swish", SwishFeedForward, "swish"), ("gelu", GeluFeedForward, "gelu")],
)
def test_swish_and_gelu_compute_transformers_feedforward_on_the_same_weights(name, cls, hf_activation):
    """Marian's and M2M-100's layers run `fc2(act(fc1(x)))` with `ACT2FN[config.activation_function]`."""
    activations = pytest.importorskip("transformers.activations")
    torch.manual_seed(0)
    ffn = registry().build(Kind.FEEDFORWARD, name, 16, 48).eval()
    assert (
        type(ffn) is cls and registry().entry(Kind.FEEDFORWARD, name).plugin == "attnx.components.feedforward"
    )
    fc1, fc2 = torch.nn.Linear(16, 48), torch.nn.Linear(48, 16)
    with torch.no_grad():
        for ours, theirs in ((ffn.w1, fc1), (ffn.w2, fc2)):
            ours.bias.normal_()
            theirs.load_state_dict(ours.state_dict())
    x = 3 * torch.randn(4, 7, 16)
    with torch.no_grad():
        expected = fc2(activations.ACT2FN[hf_activation](fc1(x)))
        diff = float((ffn(x) - expected).abs().max())
    print(f"{name}: max |Δ| {diff:.1e} against transformers' {hf_activation}")
    assert diff <= 1e-6


def test_gelu_is_the_exact_one_and_swish_is_x_sigmoid_x():
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    gelu, swish = GeluFeedForward(1, 1).double(), SwishFeedForward(1, 1).double()
    torch.testing.assert_close(gelu.activation(x), x * 0.5 * (1 + torch.erf(x / 2**0.5)))
    assert float((gelu.activation(x) - torch.nn.functional.gelu(x, approximate="tanh")).abs().max()) > 1e-5
    torch.testing.assert_close(swish.activation(x), x * torch.sigmoid(x))


@pytest.mark.parametrize("cls", [SwishFeedForward, GeluFeedForward])
def test_swish_and_gelu_check_their_arguments_as_relu_does(cls):
    with pytest.raises(ConfigError, match=r"^d_ff must be an integer >= 1 \(the hidden width\), got 0$"):
        cls(8, 0)
    with pytest.raises(ConfigError, match=r"^dropout must be in \[0, 1\), got 1.5$"):
        cls(8, 24, 1.5)
