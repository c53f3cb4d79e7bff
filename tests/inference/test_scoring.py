"""Forced scoring: the search's own numbers for its outputs, and hard alignments from the cross-attention."""

from __future__ import annotations

import pytest
import torch

from attnx.data.batch import EOS_ID, collate
from attnx.inference.config import SearchConfig
from attnx.inference.decoder import EnsembleDecoder, ModelDecoder
from attnx.inference.scoring import force_decode
from attnx.inference.search import generate
from tests.inference.toys import make_model, sources


def eos_prone_model():
    """A tiny model whose hypotheses end at many lengths (a larger `</s>` output row), the same in the
    cached steps and the full pass."""
    model = make_model(share_embeddings=False)
    with torch.no_grad():
        model.output_projection.weight[EOS_ID] *= 4.0
    return model


@pytest.mark.parametrize(
    "config",
    [
        SearchConfig(beam=4, nbest=4, max_len_a=0.5, max_len_b=6),
        SearchConfig(beam=3, nbest=3, alpha=1.0, length_penalty="fairseq", max_len_a=0.5, max_len_b=6),
        SearchConfig(sampling=True, nbest=3, temperature=1.5, top_k=10, seed=2, max_len_a=0.5, max_len_b=6),
        SearchConfig(beam=2, nbest=2, no_repeat_ngram=2, min_length=3, max_len_a=0.5, max_len_b=6),
    ],
)
def test_forced_scoring_of_search_outputs_gives_back_the_searchs_scores(config):
    model = eos_prone_model()
    src, src_mask = sources(7, 3, 12, 5)
    results = generate(model, src, src_mask, config, prefixes=[[], [9], [], [4, 4]])
    rows = torch.tensor([i for i, hyps in enumerate(results) for _ in hyps])
    flat = [h for hyps in results for h in hyps]
    scored = force_decode(model, src[rows], src_mask[rows], [h.tokens for h in flat], config)
    assert len({len(h.tokens) for h in flat}) > 1
    for searched, forced in zip(flat, scored, strict=True):
        assert forced.tokens == searched.tokens
        assert forced.log_prob == pytest.approx(searched.log_prob, abs=1e-4)
        assert forced.score == pytest.approx(searched.score, abs=1e-4)
        assert forced.token_log_probs == pytest.approx(searched.token_log_probs, abs=1e-5)


def test_forced_scoring_of_an_ensemble_is_its_search_score():
    torch.manual_seed(1)
    ensemble = EnsembleDecoder([ModelDecoder(make_model()), ModelDecoder(make_model())], weights=[2, 1])
    src, src_mask = sources(6, 4)
    config = SearchConfig(beam=3, nbest=3, max_len_b=6)
    results = generate(ensemble, src, src_mask, config)
    rows = torch.tensor([i for i, hyps in enumerate(results) for _ in hyps])
    flat = [h for hyps in results for h in hyps]
    scored = force_decode(ensemble, src[rows], src_mask[rows], [h.tokens for h in flat], config)
    assert [h.log_prob for h in scored] == pytest.approx([h.log_prob for h in flat], abs=1e-4)


def test_alignments_are_argmaxes_of_the_last_layers_mean_cross_attention():
    model = make_model()
    batch = collate([([5, 9, 11, 7, 30], [8, 6, 4]), ([12, 4], [9, 9, 9, 9, 5]), ([], [7, 7])])
    targets = [[8, 6, 4], [9, 9, 9, 9, 5], [7, 7]]
    config = SearchConfig(alignment=True)
    scored = force_decode(model, batch.src, batch.src_mask, targets, config)
    with torch.no_grad():
        weights: list[torch.Tensor] = []
        model.decode(batch.tgt_in, model.encode(batch.src, batch.src_mask), batch.src_mask, weights=weights)
    attention = weights[-1].mean(1)  # (B, T, S)
    for i, (hyp, n_src) in enumerate(zip(scored, [5, 2, 0], strict=True)):
        if n_src == 0:
            assert hyp.alignment == []  # a blank source has no piece to align to
            continue
        assert [j for _, j in hyp.alignment] == list(range(len(targets[i])))  # every target piece, no </s>
        for a, j in hyp.alignment:
            assert 0 <= a < n_src  # a source piece, never the source </s> or padding
            assert attention[i, j, a] == attention[i, j, :n_src].max()
    assert force_decode(model, batch.src, batch.src_mask, targets, SearchConfig())[0].alignment is None


def test_a_blank_target_is_the_probability_of_ending_at_once():
    model = make_model()
    src, src_mask = sources(4)
    hyp = force_decode(model, src, src_mask, [[]], SearchConfig())[0]
    with torch.no_grad():
        first = model.decode_step(
            torch.tensor([2]), model.start_decoding(model.encode(src, src_mask), src_mask)
        )
    assert hyp.log_prob == pytest.approx(float(first.log_softmax(-1)[0, EOS_ID]), abs=1e-5)
    assert len(hyp.token_log_probs) == 1
    with pytest.raises(ValueError, match="2 targets for 1 sources"):
        force_decode(model, src, src_mask, [[], [5]], SearchConfig())
