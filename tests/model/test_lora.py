"""LoRA adapters: only they train, the model starts as it was, every use of an adapted weight sees the adapter
(cross-attention's slices too), and wrong choices are one line."""

from __future__ import annotations

import pytest
import torch

from attnx.errors import ConfigError
from attnx.model import build_transformer
from attnx.model.lora import adapted, adapter_targets, add_adapters
from tests.conftest import tiny_config
from tests.model.test_transformer import pair_batch


def test_adapters_start_as_the_model_and_alone_train() -> None:
    model = build_transformer(tiny_config()).eval()
    src, src_mask, _, tgt_in = pair_batch()
    before = model(src, tgt_in, src_mask)
    names = adapter_targets(model, ["in_proj", "out_proj"], ["decoder_layers.*"])
    assert names and all(n.startswith("decoder_layers.") for n in names)
    add_adapters(model, names, rank=2, alpha=4.0)
    torch.testing.assert_close(model(src, tgt_in, src_mask), before)  # B starts at zero
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    assert set(adapted(model)) == set(names)
    model(src, tgt_in, src_mask).sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)


def test_cross_attention_sees_its_adapter() -> None:
    model = build_transformer(tiny_config()).eval()
    src, src_mask, _, tgt_in = pair_batch()
    before = model(src, tgt_in, src_mask)
    add_adapters(model, ["decoder_layers.0.cross_attn.in_proj"], rank=2, alpha=2.0)
    with torch.no_grad():
        model.decoder_layers[0].cross_attn.in_proj.parametrizations.weight[0].lora_B.fill_(0.1)
    assert not torch.allclose(model(src, tgt_in, src_mask), before)


@pytest.mark.parametrize(
    ("projections", "layers", "message"),
    [
        (["q_proj"], ["*"], r"^lora\.projections \['q_proj'\] unknown"),
        (["in_proj"], ["middle_layers.*"], r"^lora: no projection"),
    ],
)
def test_wrong_choices_are_one_line(projections, layers, message) -> None:
    with pytest.raises(ConfigError, match=message):
        adapter_targets(build_transformer(tiny_config()), projections, layers)


def test_a_rank_below_1_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^lora\.rank must be >= 1"):
        add_adapters(build_transformer(tiny_config()), [], rank=0, alpha=1.0)


@pytest.mark.parametrize(
    ("rank", "alpha", "message"),
    [
        (2.5, 16.0, r"^lora\.rank must be >= 1, an integer \(8 or 16 are usual\), got 2\.5$"),
        (True, 16.0, r"^lora\.rank must be >= 1, an integer .*, got True$"),
        (
            2,
            float("nan"),
            r"^lora\.alpha must be a finite number > 0 \(the scale is alpha / rank\), got nan$",
        ),
        (2, float("inf"), r"^lora\.alpha must be a finite number > 0 .*, got inf$"),
        (2, 0.0, r"^lora\.alpha must be a finite number > 0 .*, got 0\.0$"),
    ],
)
def test_a_rank_or_alpha_that_is_no_number_in_range_is_refused(rank, alpha, message) -> None:
    model = build_transformer(tiny_config())
    with pytest.raises(ConfigError, match=message):
        add_adapters(model, adapter_targets(model, ["in_proj"], ["*"]), rank=rank, alpha=alpha)


@pytest.mark.parametrize("rank", [33, 10**9])
def test_a_rank_above_a_projection_s_smaller_side_is_one_line_before_any_allocation(rank) -> None:
    """As HF PEFT's LoRA: r <= min(in, out) features. 10**9 was an allocation traceback of 128 GB."""
    from attnx.model.lora import adapter_parameters

    model = build_transformer(tiny_config())  # d_model 32: in_proj 96 x 32, w1 64 x 32
    names = adapter_targets(model, ["in_proj", "w1"], ["*"])
    message = (
        rf"^lora\.rank {rank} exceeds the smaller side of projection encoder_layers\.0\.self_attn\.in_proj "
        r"\(96 x 32\): a rank is at most min\(in, out\) features, here 32$"
    )
    for count_or_add in (adapter_parameters, lambda m, n, r: add_adapters(m, n, r, 16.0)):
        with pytest.raises(ConfigError, match=message):
            count_or_add(model, names, rank)
    assert not adapted(model)
    add_adapters(model, names, 32, 16.0)  # the smaller side itself is a rank
    assert model.encoder_layers[0].ffn.w1.parametrizations.weight[0].lora_A.shape == (32, 32)


def test_a_gated_feed_forward_network_takes_adapters_on_its_three_matrices() -> None:
    from attnx.model import ComponentSpec
    from attnx.model.lora import adapter_parameters

    model = build_transformer(tiny_config(feedforward=ComponentSpec("swiglu"))).eval()
    names = adapter_targets(model, ["w", "v", "w2"], ["encoder_layers.0"])
    assert names == ["encoder_layers.0.ffn.w", "encoder_layers.0.ffn.v", "encoder_layers.0.ffn.w2"]
    expected = adapter_parameters(model, names, 2)
    assert expected == 3 * 2 * (32 + 64)  # rank 2 x (d_model + d_ff) each
    src, src_mask, _, tgt_in = pair_batch()
    before = model(src, tgt_in, src_mask)
    add_adapters(model, names, rank=2, alpha=4.0)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    with torch.no_grad():
        model.encoder_layers[0].ffn.v.parametrizations.weight[0].lora_B.fill_(0.1)
    assert not torch.allclose(model(src, tgt_in, src_mask), before)
