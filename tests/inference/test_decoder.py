"""The decoding seam: one model, and an ensemble that combines its models in probability space."""

from __future__ import annotations

import pytest
import torch

from attnx.data.batch import PAD_ID, collate
from attnx.inference.config import SearchConfig
from attnx.inference.decoder import EnsembleDecoder, ModelDecoder, as_decoder
from attnx.inference.search import generate
from attnx.model import build_transformer
from tests.conftest import tiny_config


def model(seed: int, **overrides):
    torch.manual_seed(seed)
    return build_transformer(tiny_config(**overrides)).eval()


def pairs():
    batch = collate([([5, 9, 11, 7], [8, 6, 4]), ([12, 4], [9, 9, 9, 9, 5])])
    return batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out


def given(log_probs, tgt_out):
    """The log-probabilities `(B, T)` of the given tokens in `log_probs` `(B, T, V)`; 0 at padding, where forced
    scoring computes nothing."""
    return log_probs.gather(2, tgt_out.unsqueeze(2)).squeeze(2).masked_fill(tgt_out == PAD_ID, 0.0)


def stepped(decoder, src, src_mask, tgt_in):
    """Log-probabilities `(B, T, V)` one cached step at a time."""
    with torch.no_grad():
        state = decoder.start(src, src_mask)
        return torch.stack([decoder.step(tgt_in[:, i], state) for i in range(tgt_in.shape[1])], 1)


def test_model_decoder_steps_are_the_log_softmax_of_the_full_pass_and_forced_gathers_them():
    m = model(0)
    src, src_mask, tgt_in, tgt_out = pairs()
    decoder = as_decoder(m)
    assert isinstance(decoder, ModelDecoder) and as_decoder(decoder) is decoder
    with torch.no_grad():
        full = m(src, tgt_in, src_mask).log_softmax(-1)
        forced, attention = decoder.forced(src, src_mask, tgt_in, tgt_out)
    torch.testing.assert_close(stepped(decoder, src, src_mask, tgt_in), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(forced, given(full, tgt_out), atol=1e-5, rtol=1e-5)
    assert attention is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_log_probabilities_are_float32_at_least_and_a_float64_model_keeps_float64(dtype):
    """A bf16 model's logits are widened before the softmax; a float64 one's are not rounded to float32
    (beam search in float64 is how CPU and GPU are compared exactly)."""
    m = model(0).to(dtype)
    src, src_mask, tgt_in, tgt_out = pairs()
    decoder = ModelDecoder(m)
    forced, attention = decoder.forced(src, src_mask, tgt_in, tgt_out, attention=True)
    steps = stepped(decoder, src, src_mask, tgt_in)
    wide = torch.promote_types(dtype, torch.float32)
    assert steps.dtype == forced.dtype == attention.dtype == wide
    if dtype != torch.float64:
        return
    with torch.no_grad():
        full = m(src, tgt_in, src_mask).log_softmax(-1)
    torch.testing.assert_close(forced, given(full, tgt_out), atol=1e-12, rtol=1e-12)
    for ids, hyps in zip(
        [[5, 9, 11, 7], [12, 4]], generate(m, src, src_mask, SearchConfig(beam=2)), strict=True
    ):
        for h in hyps:  # the search's sums, checked in float64 against forced scoring of its own output
            one = collate([(ids, h.tokens)])
            scored, _ = decoder.forced(one.src, one.src_mask, one.tgt_in, one.tgt_out)
            assert h.log_prob == pytest.approx(float(scored.sum()), abs=1e-12)


def test_forced_attention_is_the_last_layers_cross_attention_averaged_over_heads():
    m = model(0)
    src, src_mask, tgt_in, tgt_out = pairs()
    with torch.no_grad():
        _, attention = ModelDecoder(m).forced(src, src_mask, tgt_in, tgt_out, attention=True)
        weights: list[torch.Tensor] = []
        m.decode(tgt_in, m.encode(src, src_mask), src_mask, weights=weights)
    assert len(weights) == len(m.decoder_layers)  # one per decoder layer, the last is used
    torch.testing.assert_close(attention, weights[-1].mean(1))
    assert attention.shape == (2, tgt_in.shape[1], src.shape[1])


def test_an_ensemble_of_a_model_with_itself_is_that_model():
    m = model(0)
    src, src_mask, tgt_in, tgt_out = pairs()
    alone, twice = ModelDecoder(m), EnsembleDecoder([ModelDecoder(m), ModelDecoder(m)])
    torch.testing.assert_close(stepped(twice, src, src_mask, tgt_in), stepped(alone, src, src_mask, tgt_in))
    with torch.no_grad():
        torch.testing.assert_close(
            twice.forced(src, src_mask, tgt_in, tgt_out)[0], alone.forced(src, src_mask, tgt_in, tgt_out)[0]
        )
    config = SearchConfig(beam=3, nbest=3, max_len_b=8)
    a, b = generate(alone, src, src_mask, config), generate(twice, src, src_mask, config)
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b]
    assert [h.score for hyps in a for h in hyps] == pytest.approx(
        [h.score for hyps in b for h in hyps], abs=1e-5
    )


def test_an_ensemble_mixes_probabilities_with_its_weights_each_model_with_its_own_cache():
    m1, m2 = model(0), model(1)
    src, src_mask, tgt_in, tgt_out = pairs()
    ensemble = EnsembleDecoder([ModelDecoder(m1), ModelDecoder(m2)], weights=[3.0, 1.0])
    assert ensemble.weights == [0.75, 0.25]
    p1 = stepped(ModelDecoder(m1), src, src_mask, tgt_in).exp()
    p2 = stepped(ModelDecoder(m2), src, src_mask, tgt_in).exp()
    expected = (0.75 * p1 + 0.25 * p2).log()
    torch.testing.assert_close(stepped(ensemble, src, src_mask, tgt_in), expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        forced, _ = ensemble.forced(src, src_mask, tgt_in, tgt_out)
    torch.testing.assert_close(forced, given(expected, tgt_out), atol=1e-5, rtol=1e-5)
    # equal weights differ from 3:1, and the ensemble differs from either model
    equal = stepped(EnsembleDecoder([ModelDecoder(m1), ModelDecoder(m2)]), src, src_mask, tgt_in)
    assert not torch.allclose(equal, expected) and not torch.allclose(equal, p1.log())


def test_ensemble_errors_are_one_line():
    with pytest.raises(ValueError, match="share one vocabulary"):
        EnsembleDecoder([ModelDecoder(model(0)), ModelDecoder(model(0, vocab_size=60))])
    with pytest.raises(ValueError, match="2 positive numbers"):
        EnsembleDecoder([ModelDecoder(model(0)), ModelDecoder(model(1))], weights=[1.0])
    with pytest.raises(ValueError, match="2 positive numbers"):
        EnsembleDecoder([ModelDecoder(model(0)), ModelDecoder(model(1))], weights=[1.0, 0.0])


def test_decoding_restores_each_models_training_mode():
    m1, m2 = model(0, dropout=0.3).train(), model(1, dropout=0.3).eval()
    src, src_mask, _, _ = pairs()
    ensemble = EnsembleDecoder([ModelDecoder(m1), ModelDecoder(m2)])
    a = generate(ensemble, src, src_mask, SearchConfig(max_len_b=5))
    b = generate(ensemble, src, src_mask, SearchConfig(max_len_b=5))
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]  # dropout off while decoding
    assert m1.training and not m2.training
