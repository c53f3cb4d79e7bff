"""§3.3 The position-wise feed-forward network, `max(0, x W1 + b1) W2 + b2` (Eq. 2)."""

from __future__ import annotations

import pytest
import torch

from attnx.components.feedforward import ReluFeedForward
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
