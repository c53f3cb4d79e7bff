"""§5.4 label smoothing against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnx.components.loss import label_smoothed_nll, projected_label_smoothed_nll

PAD = 0


def test_hand_computed_values() -> None:
    # One sentence, vocabulary of 3, two real positions and one padded one.
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)], [0.0, math.log(3.0), 0.0], [5.0, -1.0, 2.0]]])
    target = torch.tensor([[2, 1, PAD]])
    sums = label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=PAD)
    # Position 1: p = (1/4, 1/4, 2/4), reference 2.   Position 2: p = (1/5, 3/5, 1/5), reference 1.
    nll = -math.log(2 / 4) - math.log(3 / 5)
    uniform = (-math.log(1 / 4) * 2 - math.log(2 / 4)) / 3 + (-math.log(1 / 5) * 2 - math.log(3 / 5)) / 3
    assert sums.tokens.item() == 2
    assert sums.nll.item() == pytest.approx(nll, rel=1e-6)
    assert sums.loss.item() == pytest.approx(0.9 * nll + 0.1 * uniform, rel=1e-6)


def test_equals_torch_cross_entropy_with_label_smoothing() -> None:
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = PAD
    sums = label_smoothed_nll(logits, target, epsilon=0.1, ignore_index=PAD)
    expected = F.cross_entropy(
        logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, label_smoothing=0.1, reduction="sum"
    )
    assert sums.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert sums.tokens.item() == 13


def test_padding_is_ignored_and_zero_smoothing_is_nll() -> None:
    logits = torch.randn(2, 4, 7, requires_grad=True)
    target = torch.tensor([[3, 4, PAD, PAD], [5, 6, 1, PAD]])
    sums = label_smoothed_nll(logits, target, epsilon=0.0, ignore_index=PAD)
    assert sums.loss.item() == pytest.approx(sums.nll.item())
    sums.loss.backward()
    assert torch.all(logits.grad[target == PAD] == 0)  # padded positions get no gradient


def test_bf16_logits_are_scored_in_float32() -> None:
    logits = torch.randn(2, 3, 9)
    target = torch.randint(1, 9, (2, 3))
    full = label_smoothed_nll(logits, target, 0.1, PAD)
    half = label_smoothed_nll(logits.bfloat16(), target, 0.1, PAD)
    assert half.loss.dtype == torch.float32
    assert half.loss.item() == pytest.approx(full.loss.item(), rel=2e-2)


def test_rejects_bad_epsilon() -> None:
    with pytest.raises(ValueError, match="label smoothing"):
        label_smoothed_nll(torch.zeros(1, 1, 3), torch.ones(1, 1, dtype=torch.long), 1.0, PAD)


def test_training_loss_equals_the_loss_of_the_full_forward() -> None:
    from attnx.components.loss import translation_loss
    from attnx.data.batch import collate
    from attnx.model import build_transformer
    from tests.conftest import tiny_config

    model = build_transformer(tiny_config())
    batch = collate([([5, 6, 7, 8], [9, 10]), ([11], [12, 13, 14, 15, 16])])
    logits = model(batch.src, batch.tgt_in, batch.src_mask)  # (B, T, V), padding included
    full = label_smoothed_nll(logits, batch.tgt_out, 0.1, PAD)
    projected = translation_loss(model, batch, 0.1)
    assert projected.tokens.item() == batch.n_tgt_tokens == 9
    torch.testing.assert_close(projected.loss, full.loss)
    torch.testing.assert_close(projected.nll, full.nll)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, None])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_fused_projection_equals_logits_then_loss(chunk_rows, epsilon) -> None:
    features = torch.randn(23, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 13, (23,))
    fused = projected_label_smoothed_nll(features, weight, target, epsilon, chunk_rows)
    reference = label_smoothed_nll(F.linear(features, weight), target, epsilon, ignore_index=-1)
    torch.testing.assert_close(fused.loss, reference.loss)
    torch.testing.assert_close(fused.nll, reference.nll)
    assert fused.tokens.item() == 23
    grads = torch.autograd.grad(3.0 * fused.loss, (features, weight))
    expected = torch.autograd.grad(3.0 * reference.loss, (features, weight))
    torch.testing.assert_close(grads, expected)
    with torch.no_grad():  # validation: no gradients computed, same sums
        torch.testing.assert_close(
            projected_label_smoothed_nll(features, weight, target, epsilon).loss, fused.loss
        )


@pytest.mark.parametrize("chunk_rows", [5, None])
def test_fused_projection_counts_out_rows_whose_target_is_ignored(chunk_rows) -> None:
    """A captured step passes every position, padding included: with `ignore_index` the padded rows add
    nothing to the sums, the token count or either gradient (a padded row's feature gets none)."""
    features = torch.randn(23, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (23,))
    target[[2, 3, 11, 22]] = 0  # padding
    fused = projected_label_smoothed_nll(features, weight, target, 0.1, chunk_rows, ignore_index=0)
    reference = label_smoothed_nll(F.linear(features, weight), target, 0.1, ignore_index=0)
    torch.testing.assert_close(fused.loss, reference.loss)
    torch.testing.assert_close(fused.nll, reference.nll)
    assert fused.tokens.item() == 19
    grads = torch.autograd.grad(fused.loss, (features, weight))
    torch.testing.assert_close(grads, torch.autograd.grad(reference.loss, (features, weight)))
    assert not grads[0][[2, 3, 11, 22]].any()


def test_fused_projection_under_bf16_autocast() -> None:
    features = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    target = torch.randint(0, 50, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = projected_label_smoothed_nll(features, weight, target, 0.1, chunk_rows=16)
    fused.loss.backward()
    reference = label_smoothed_nll(F.linear(features, weight), target, 0.1, ignore_index=-1)
    assert fused.loss.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert fused.loss.item() == pytest.approx(reference.loss.item(), rel=2e-2)


@pytest.mark.parametrize("name", ["label_smoothed", "reference"])
def test_registered_losses_equal_the_formula_written_out(name: str) -> None:
    """Both loss components, built from the registry as a config names them, against §5.4 computed by hand
    from the model's own probabilities, one real target position at a time (float64)."""
    from attnx.data.batch import collate
    from attnx.model import build_transformer
    from attnx.plugins import registry
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = build_transformer(tiny_config()).double().eval()
    batch = collate([([5, 6, 7, 8], [9, 10]), ([11], [12, 13, 14, 15, 16])])
    loss = registry().build("loss", name, 0.1)
    with torch.no_grad():
        got = loss(model, batch)
        probs = torch.softmax(model(batch.src, batch.tgt_in, batch.src_mask), dim=-1)  # (B, T, V)
    expected_loss = expected_nll = 0.0
    for b, t in batch.tgt_mask.nonzero().tolist():
        p = probs[b, t].tolist()
        y = int(batch.tgt_out[b, t])
        nll = -math.log(p[y])
        expected_nll += nll
        expected_loss += 0.9 * nll + 0.1 * sum(-math.log(q) for q in p) / len(p)
    assert got.tokens.item() == 9
    assert got.nll.item() == pytest.approx(expected_nll, rel=1e-9)
    assert got.loss.item() == pytest.approx(expected_loss, rel=1e-9)
    assert set(registry().names("loss")) >= {"label_smoothed", "reference"}


@pytest.mark.parametrize("chunk_rows", [0, -1, 2.5, True])
def test_chunk_rows_that_are_not_a_positive_integer_are_refused_when_built(chunk_rows) -> None:
    """0 stopped the first step (`range` of step 0), -1 trained on a loss of 0 over no chunk at all."""
    from attnx.components.loss import LabelSmoothedLoss
    from attnx.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model\.loss\.args\.chunk_rows must be an integer >= 1 "):
        LabelSmoothedLoss(0.1, chunk_rows=chunk_rows)


@pytest.mark.parametrize("epsilon", [float("nan"), "0.1", 1.0])
def test_a_smoothing_that_is_not_a_number_in_range_is_refused_when_built(epsilon) -> None:
    from attnx.components.loss import LabelSmoothedLoss
    from attnx.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^label smoothing ε must be in \[0, 1\), got "):
        LabelSmoothedLoss(epsilon)


@pytest.mark.parametrize("chunk_rows", [1, 7, None])
@pytest.mark.parametrize("ignore", [False, True])
def test_fused_projection_adds_the_logits_bias_and_trains_it(chunk_rows, ignore) -> None:
    """`output_bias`: the fused loss scores `features @ weight.T + bias` and gives the bias its gradient, with
    and without rows counted out."""
    features = torch.randn(23, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(13, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (23,))
    target[[2, 11]] = 0
    ignore_index = 0 if ignore else None
    fused = projected_label_smoothed_nll(features, weight, target, 0.1, chunk_rows, ignore_index, bias=bias)
    reference = label_smoothed_nll(
        F.linear(features, weight, bias), target, 0.1, ignore_index=0 if ignore else -1
    )
    torch.testing.assert_close(fused.loss, reference.loss)
    torch.testing.assert_close(fused.nll, reference.nll)
    grads = torch.autograd.grad(2.0 * fused.loss, (features, weight, bias))
    torch.testing.assert_close(grads, torch.autograd.grad(2.0 * reference.loss, (features, weight, bias)))
    assert grads[2].abs().sum() > 0
    without = projected_label_smoothed_nll(features, weight, target, 0.1, chunk_rows, ignore_index)
    assert not torch.allclose(without.loss, fused.loss)
    frozen = projected_label_smoothed_nll(
        features.detach(), weight.detach(), target, 0.1, chunk_rows, ignore_index, bias=bias.detach()
    )
    torch.testing.assert_close(frozen.loss, fused.loss.detach())


@pytest.mark.parametrize("name", ["label_smoothed", "reference"])
def test_both_losses_score_a_model_with_an_output_bias_alike(name: str) -> None:
    from attnx.data.batch import collate
    from attnx.model import build_transformer
    from attnx.plugins import registry
    from attnx.registry import Kind
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = build_transformer(tiny_config(output_bias=True, dropout=0.0)).double()
    with torch.no_grad():
        model.output_bias.normal_()
    batch = collate([([5, 6, 7, 8], [9, 10]), ([11], [12, 13, 14, 15, 16])])
    logits = model(batch.src, batch.tgt_in, batch.src_mask)  # (B, T, V)
    expected = label_smoothed_nll(logits, batch.tgt_out, 0.1, PAD)
    (grad_expected,) = torch.autograd.grad(expected.loss, model.output_bias)
    sums = registry().build(Kind.LOSS, name, 0.1)(model, batch)
    torch.testing.assert_close(sums.loss, expected.loss)
    (grad,) = torch.autograd.grad(sums.loss, model.output_bias)
    torch.testing.assert_close(grad, grad_expected)
