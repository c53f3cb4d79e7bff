"""§3.1 Encoder and decoder layers: the residual connection around each sub-layer (post-norm as in the
paper, or pre-norm), dropout only while training, and the sub-layers in the paper's order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnx.components.attention import MultiHeadAttention
from attnx.components.feedforward import ReluFeedForward
from attnx.model.cache import AttentionCache
from attnx.model.layers import RESIDUALS, DecoderLayer, EncoderLayer, PostNorm, PreNorm

D = 16


def doubled(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


def test_post_norm_is_the_papers_layernorm_of_x_plus_sublayer():
    norm = nn.LayerNorm(D)
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(PostNorm(norm, 0.0)(x, doubled), norm(x + 2 * x))
    torch.testing.assert_close(PreNorm(norm, 0.0)(x, doubled), x + 2 * norm(x))
    assert {"post": PostNorm, "pre": PreNorm} == RESIDUALS


@pytest.mark.parametrize("residual", [PostNorm, PreNorm])
def test_residual_dropout_acts_on_the_sublayer_output_only_while_training(residual):
    x = torch.randn(4, 8, D)
    wrapped = residual(nn.Identity(), 0.5)
    torch.manual_seed(0)
    dropped = wrapped.train()(x, doubled) - x  # identity norm: what remains is the dropped sub-layer output
    assert bool(((dropped == 0) | torch.isclose(dropped, 4 * x)).all())  # dropped, or kept and scaled by 2
    assert 0.3 < float((dropped == 0).float().mean()) < 0.7
    torch.testing.assert_close(wrapped.eval()(x, doubled), 3 * x)


def layers(d_ff: int = 32) -> tuple[EncoderLayer, DecoderLayer]:
    torch.manual_seed(1)
    encoder = EncoderLayer(
        MultiHeadAttention(D, 2),
        ReluFeedForward(D, d_ff),
        PostNorm(nn.LayerNorm(D), 0.0),
        PostNorm(nn.LayerNorm(D), 0.0),
    )
    decoder = DecoderLayer(
        MultiHeadAttention(D, 2),
        MultiHeadAttention(D, 2),
        ReluFeedForward(D, d_ff),
        *(PostNorm(nn.LayerNorm(D), 0.0) for _ in range(3)),
    )
    return encoder.eval(), decoder.eval()


def test_the_encoder_layer_is_self_attention_then_the_feed_forward_network():
    encoder, _ = layers()
    x = torch.randn(2, 5, D)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    h = encoder.attn_residual.norm(x + encoder.self_attn(x, x, key_mask=mask))
    expected = encoder.ffn_residual.norm(h + encoder.ffn(h))
    torch.testing.assert_close(encoder(x, mask), expected)
    weights: list[torch.Tensor] = []
    torch.testing.assert_close(encoder(x, mask, weights), expected, rtol=1e-5, atol=1e-5)
    assert len(weights) == 1 and weights[0].shape == (2, 2, 5, 5)
    assert float(weights[0][1, :, :, 3:].detach().abs().max()) == 0  # padding gets no attention


def test_the_decoder_layer_is_masked_self_attention_then_the_source_then_the_feed_forward_network():
    _, decoder = layers()
    x, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)
    mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    h = decoder.self_residual.norm(x + decoder.self_attn(x, x, causal=True))
    h = decoder.cross_residual.norm(h + decoder.cross_attn(h, memory, key_mask=mask))
    expected = decoder.ffn_residual.norm(h + decoder.ffn(h))
    torch.testing.assert_close(decoder(x, memory, mask), expected)
    later = x.clone()
    later[:, 2:] = torch.randn(2, 2, D)
    torch.testing.assert_close(
        decoder(later, memory, mask)[:, :2], expected[:, :2]
    )  # never sees later positions
    weights: list[torch.Tensor] = []
    decoder(x, memory, mask, weights=weights)
    assert len(weights) == 1 and weights[0].shape == (2, 2, 4, 6)  # the encoder-decoder attention only


def test_the_decoder_layer_with_a_cache_decodes_one_position_at_a_time_as_the_full_pass():
    _, decoder = layers()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 6, D)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    full = decoder(x, memory, mask)
    cache = (AttentionCache(), AttentionCache(static=True))
    steps = [decoder(x[:, i : i + 1], memory, mask, cache=cache) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache[0].length == 5 and cache[1].length == 6
