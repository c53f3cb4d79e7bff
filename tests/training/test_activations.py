"""The activation estimate of each component against the tensors its layers really keep for the backward pass."""

from __future__ import annotations

import pytest
import torch

from attnx.components.loss import translation_loss
from attnx.data.batch import collate
from attnx.model import TransformerConfig, build_transformer
from attnx.training.activations import activation_bytes, layer_bytes

VARIANTS = {
    "paper": {},
    "swiglu": {"feedforward": {"name": "swiglu"}},
    "geglu": {"feedforward": {"name": "geglu"}},
    "gqa": {
        "self_attention": {"name": "multihead", "args": {"kv_heads": 1}},
        "cross_attention": {"name": "multihead", "args": {"kv_heads": 2}},
    },
    "rmsnorm": {"norm": {"name": "rmsnorm"}},
    "rotary": {"positional": {"name": "rotary"}},
    "t5_relative": {"positional": {"name": "t5_relative"}},
    "modern": {
        "norm_position": "pre",
        "norm": {"name": "rmsnorm"},
        "feedforward": {"name": "swiglu"},
        "positional": {"name": "rotary"},
        "self_attention": {"name": "multihead", "args": {"kv_heads": 2}},
    },
}

TOLERANCE = 0.05
"""The paper's layers are counted within 3% of what they keep (the coefficients are rounded)."""


def config_of(variant: str) -> TransformerConfig:
    values = TransformerConfig(
        d_model=64, d_ff=256, n_heads=4, encoder_layers=2, decoder_layers=2, vocab_size=300, dropout=0.1
    ).to_dict()
    return TransformerConfig.from_dict(values | VARIANTS[variant])


def saved_bytes(config: TransformerConfig, sentences: int, length: int) -> int:
    """Bytes of the distinct tensors the forward pass of a training batch saves for its backward pass
    (`torch.autograd.graph.saved_tensors_hooks`), the model's own weights left out."""
    model = build_transformer(config).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    generator = torch.Generator().manual_seed(0)
    words = lambda: torch.randint(4, config.vocab_size, (length - 1,), generator=generator).tolist()  # noqa: E731
    batch = collate([(words(), words()) for _ in range(sentences)])
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        translation_loss(model, batch, 0.1)
    return sum(kept.values())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_estimate_counts_what_each_component_keeps_for_the_backward_pass(variant: str) -> None:
    """A gated network keeps four d_ff-wide tensors where ReLU keeps one, RMSNorm its normalized input,
    rotary its turned queries and keys, T5's bias a mask per sentence; grouped-query attention keeps its
    repeated keys and values. The estimate of each is within a few percent of what the layers save."""
    config = config_of(variant)
    sentences, length = 16, 30
    tokens = sentences * length
    estimated = activation_bytes(config, tokens, tokens, "32-true", "cpu", length, length)
    measured = saved_bytes(config, sentences, length)
    assert abs(estimated / measured - 1) < TOLERANCE, (variant, estimated, measured)


def test_a_score_bias_keeps_a_mask_that_grows_with_the_length() -> None:
    per = layer_bytes(config_of("t5_relative"))
    assert per.per_key == 4 * 4 and layer_bytes(config_of("paper")).per_key == 0
    longer = activation_bytes(config_of("t5_relative"), 4800, 4800, "32-true", "cpu", 60, 60)
    shorter = activation_bytes(config_of("t5_relative"), 4800, 4800, "32-true", "cpu", 30, 30)
    assert longer - shorter == 2 * 2 * 4800 * per.per_key * 30  # 2 + 2 self-attentions, 30 more keys each


@pytest.mark.parametrize("variant", ["paper", "swiglu", "gqa", "modern"])
def test_half_precision_copies_each_matrix_the_layers_really_have(variant: str) -> None:
    """Autocast keeps a 2-byte copy of every matrix it multiplies by: the layers' two-dimensional weights
    (W^K and W^V of grouped-query attention smaller, a gated network's three) and the embedding matrix."""
    config = config_of(variant)
    model = build_transformer(config)
    layers = [*model.encoder_layers, *model.decoder_layers]
    matrices = sum(p.numel() for layer in layers for p in layer.parameters() if p.dim() == 2)
    matrices += config.vocab_size * config.d_model
    loss = 4 * config.vocab_size * config.d_model  # the projection's gradient, in any precision
    assert activation_bytes(config, 0, 0, "bf16-mixed", "cuda") == 2 * matrices + loss
