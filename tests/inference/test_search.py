"""§6.1 decoding, the generation loop: greedy and beam search, the encoder run once, scores, maximum length,
early termination, finished sentences leaving the batch, n-best lists, sampled rows."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from attnx.data.batch import BOS_ID, EOS_ID, UNK_ID, collate
from attnx.inference import search
from attnx.inference.config import SearchConfig
from attnx.inference.lengths import length_penalty, max_output_lengths
from attnx.inference.search import beam_search, generate, greedy_search, translate_batch
from attnx.model import build_transformer
from attnx.model.cache import AttentionCache
from tests.conftest import tiny_config
from tests.inference.toys import (
    MarkovModel,
    StepRecorder,
    likelier_eos,
    make_model,
    never_eos,
    sampling,
    sources,
)

# --- the encoder runs once ---------------------------------------------------------------------------------


def test_encoder_keys_and_values_are_computed_once_per_sentence_not_per_beam_or_step():
    model = make_model()
    src, src_mask = sources(6, 4)
    calls: list[int] = []  # rows of each projection of encoder keys and values
    keys_values = AttentionCache.keys_values

    def record(cache: AttentionCache, project):
        def counted():
            k, v = project()
            calls.append(k.shape[0])
            return k, v

        return keys_values(cache, counted if cache.static else project)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AttentionCache, "keys_values", record)
        recorder = StepRecorder(model)
        beam_search(model, src, src_mask, SearchConfig(beam=4, max_len_a=0, max_len_b=6))
    assert len(recorder.rows) > 1
    assert calls == [2] * len(model.decoder_layers)  # one call per layer, batch of 2 sentences, not 8 rows


# --- scores and maximum length ------------------------------------------------------------------------


def test_hypothesis_score_is_log_prob_over_gnmt_penalty_of_length_with_eos():
    model = make_model()
    src, src_mask = sources(5)
    for hyp in beam_search(model, src, src_mask, SearchConfig(beam=4, max_len_a=0, max_len_b=8))[0]:
        lp = ((5 + len(hyp.tokens) + 1) / 6) ** 0.6
        assert hyp.score == pytest.approx(hyp.log_prob / lp, rel=1e-5)


def test_maximum_output_length_is_input_length_plus_50():
    model = make_model()
    StepRecorder(model, never_eos)
    src, src_mask = sources(3, 10, 1)
    # input length = real source positions, the source </s> included: 4, 11, 2
    expected = [4 + 50, 11 + 50, 2 + 50]
    assert max_output_lengths(src_mask, 1.0, 50).tolist() == expected
    assert [len(y) for y in greedy_search(model, src, src_mask)] == expected
    assert [len(y) for y in translate_batch(model, src, src_mask, SearchConfig(beam=3))] == expected
    capped = SearchConfig(beam=2, max_positions=30)  # never past the model's positions
    assert [len(y) for y in translate_batch(model, src, src_mask, capped)] == [29, 29, 29]


# --- greedy and beam -------------------------------------------------------------------------------------


def test_beam_search_with_beam_1_equals_greedy():
    model = make_model()
    recorder = StepRecorder(model, likelier_eos)
    lengths = (4, 9, 6, 2, 12, 7, 7, 3)
    src, src_mask = sources(*lengths)
    config = SearchConfig(beam=1, max_len_a=1.0, max_len_b=5)
    greedy = greedy_search(model, src, src_mask, 1.0, 5)
    recorder.rows.clear()
    beam = beam_search(model, src, src_mask, config)
    assert [h[0].tokens for h in beam] == greedy
    ended_early = [len(y) < n + 1 + 5 for y, n in zip(greedy, lengths, strict=True)]
    assert any(ended_early) and not all(ended_early)
    assert len({len(y) for y in greedy}) > 2


def all_outputs(model, src, src_mask, tokens, max_len):
    """``(log P(y </s>), y)`` for every ``y`` over ``tokens`` with ``|y| <= max_len``, by teacher forcing."""
    memory = model.encode(src, src_mask)
    results = []
    for n in range(max_len + 1):
        ys = torch.tensor(list(itertools.product(tokens, repeat=n)), dtype=torch.long).view(
            len(tokens) ** n, n
        )
        tgt_in = torch.cat([torch.full((len(ys), 1), BOS_ID), ys], 1)
        tgt_out = torch.cat([ys, torch.full((len(ys), 1), EOS_ID)], 1)
        lprobs = torch.log_softmax(
            model.decode(tgt_in, memory.expand(len(ys), -1, -1), src_mask.expand(len(ys), -1)).float(), -1
        )
        log_p = lprobs.gather(2, tgt_out.unsqueeze(2)).squeeze(2).sum(1)
        results += zip(log_p.tolist(), ys.tolist(), strict=True)
    return results


def test_wide_beam_search_finds_the_exhaustive_optimum():
    """Vocabulary of 7 (tokens UNK, 4, 5, 6 besides </s>), outputs up to 4 tokens: 341 candidates."""
    torch.manual_seed(3)
    model = make_model(vocab_size=7)
    with torch.no_grad():  # sharper, non-trivial distributions
        model.tgt_embedding.weight.mul_(4.0)
    max_len = 4
    for src_ids in ([4, 5, 6], [6, 6], [5, 4, 6, 5, 4]):
        batch = collate([(src_ids, [])])
        with torch.no_grad():
            outputs = all_outputs(model, batch.src, batch.src_mask, [UNK_ID, 4, 5, 6], max_len)
        assert len(outputs) == 1 + 4 + 16 + 64 + 256
        for alpha, kind in [(0.6, "gnmt"), (1.0, "fairseq"), (2.0, "gnmt")]:
            config = SearchConfig(
                beam=400, alpha=alpha, length_penalty=kind, max_len_a=0.0, max_len_b=max_len
            )
            ranking = sorted(
                ((lp / length_penalty(len(y) + 1, alpha, kind), y) for lp, y in outputs), reverse=True
            )
            assert ranking[0][0] - ranking[1][0] > 1e-4  # a unique optimum
            nbest = beam_search(model, batch.src, batch.src_mask, config)[0]
            assert nbest[0].tokens == ranking[0][1]
            assert nbest[0].score == pytest.approx(ranking[0][0], abs=1e-4)
            # the n-best list is a prefix of the exhaustive ranking (early termination loses nothing above it)
            assert [h.tokens for h in nbest] == [y for _, y in ranking[: len(nbest)]]
            # with one best wanted, termination is earlier and the answer the same
            assert translate_batch(model, batch.src, batch.src_mask, config)[0] == ranking[0][1]


def test_early_termination_bound_uses_the_largest_reachable_penalty():
    """Every continuation looks poor after one step, yet one ends up best: a bound of ``s / lp(t + 1)``
    would stop the search after the first step with the empty translation."""
    v, eos, max_len = 10, EOS_ID, 4
    table = torch.full((max_len + 1, v, v), 1e-3)
    table[0, BOS_ID, eos] = 0.25  # </s> at once: score log(0.25) = -1.39
    table[0, BOS_ID, 4:] = 0.75 / 6  # six continuations of -2.08 each
    table[1:, :, :] = 0.01
    table[1:max_len, 4, 4] = 0.97  # then one path with almost no further cost ...
    table[max_len, 4, eos] = 0.97  # ... ending exactly at the maximum length
    table /= table.sum(-1, keepdim=True)
    model = MarkovModel(table)
    batch = collate([([5, 6], [])])
    for alpha, kind in [(2.0, "gnmt"), (1.0, "fairseq")]:
        outputs = all_outputs(model, batch.src, batch.src_mask, list(range(4, v)), max_len)
        best = max(outputs, key=lambda o: o[0] / length_penalty(len(o[1]) + 1, alpha, kind))
        assert best[1] == [4, 4, 4, 4]
        config = SearchConfig(beam=8, alpha=alpha, length_penalty=kind, max_len_a=0, max_len_b=max_len)
        assert translate_batch(model, batch.src, batch.src_mask, config)[0] == [4, 4, 4, 4]
        assert beam_search(model, batch.src, batch.src_mask, config)[0][0].tokens == [4, 4, 4, 4]


def test_finished_sentences_leave_the_batch():
    model = make_model()
    recorder = StepRecorder(model, never_eos)
    src, src_mask = sources(2, 9)  # maximum lengths 3 and 10 with a = 1, b = 0
    beam_search(model, src, src_mask, SearchConfig(beam=4, max_len_a=1.0, max_len_b=0))
    # one row per sentence for <s>, then 4 each; step 4 forces </s> on the short one, then it is gone
    assert recorder.rows == [2] + [8] * 3 + [4] * 7
    recorder.rows.clear()
    greedy_search(model, src, src_mask, 1.0, 0)
    assert recorder.rows == [2] * 4 + [1] * 7


@pytest.mark.parametrize(
    ("ending", "compact_after"),
    [(None, 0.2), (likelier_eos, 0.2), (likelier_eos, 0.0), (likelier_eos, math.inf)],
)
def test_batched_search_equals_one_sentence_at_a_time(ending, compact_after, monkeypatch):
    """Also whether dead rows are re-packed at once (0), lazily (0.2) or only when rows must grow (inf)."""
    monkeypatch.setattr(search, "COMPACT_AFTER", compact_after)
    model = make_model()
    recorder = StepRecorder(model, ending)
    lengths = (7, 3, 12, 1, 5, 9, 9, 2)
    src, src_mask = sources(*lengths)
    config = SearchConfig(beam=4, max_len_a=0.5, max_len_b=6)
    batched = beam_search(model, src, src_mask, config)
    greedy = greedy_search(model, src, src_mask, 0.5, 6)
    for i, n in enumerate(lengths):
        one_src, one_mask = src[i : i + 1, : n + 1], src_mask[i : i + 1, : n + 1]
        alone = beam_search(model, one_src, one_mask, config)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-5)
        assert greedy_search(model, one_src, one_mask, 0.5, 6)[0] == greedy[i]
    if ending is not None:  # hypotheses ended at many lengths, so rows went dead and were re-packed
        assert len({len(h.tokens) for hyps in batched for h in hyps}) > 3
        assert len(set(recorder.rows)) > 3


def test_search_restores_training_mode_and_needs_no_grad():
    model = build_transformer(tiny_config(dropout=0.3)).train()
    src, src_mask = sources(4, 4)
    a = translate_batch(model, src, src_mask, SearchConfig(max_len_b=5))
    b = translate_batch(model, src, src_mask, SearchConfig(max_len_b=5))
    assert a == b  # dropout off while searching
    assert model.training
    assert math.isfinite(beam_search(model, src, src_mask, SearchConfig(max_len_b=5))[0][0].score)


# --- CUDA ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_beam_search_on_cuda_equals_cpu_in_float64():
    """Beam 4 with the KV cache, sentences finishing at different lengths, on both devices (float64: no ties)."""
    model = make_model().double()
    StepRecorder(model, likelier_eos)
    src, src_mask = sources(7, 3, 12, 1, 5, 9, 9, 2)
    config = SearchConfig(beam=4, max_positions=128)
    on_cpu = beam_search(model, src, src_mask, config)
    on_gpu = beam_search(model.cuda(), src.cuda(), src_mask.cuda(), config)
    assert [[h.tokens for h in hyps] for hyps in on_gpu] == [[h.tokens for h in hyps] for hyps in on_cpu]
    assert [h.score for hyps in on_gpu for h in hyps] == pytest.approx(
        [h.score for hyps in on_cpu for h in hyps], abs=1e-9
    )


# --- n-best, per-token log-probabilities -------------------------------------------------------------------


def test_nbest_is_sorted_distinct_and_its_head_is_the_one_best_output():
    model = make_model()
    StepRecorder(model, likelier_eos)
    src, src_mask = sources(6, 3, 9)
    config = SearchConfig(beam=5, nbest=5, max_len_a=0.5, max_len_b=6)
    nbest = generate(model, src, src_mask, config)
    one_best = translate_batch(model, src, src_mask, SearchConfig(beam=5, max_len_a=0.5, max_len_b=6))
    for hyps, best in zip(nbest, one_best, strict=True):
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
        assert hyps[0].tokens == best
        for h in hyps:
            assert len(h.token_log_probs) == len(h.tokens) + 1
            assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-4)
            assert all(lp <= 0 for lp in h.token_log_probs)
    assert [len(h) for h in generate(model, src, src_mask, SearchConfig(beam=5, nbest=2))] == [2, 2, 2]


# --- sampled rows --------------------------------------------------------------------------------------


def test_sampling_with_a_seed_is_reproducible_and_seeds_differ():
    model = make_model()
    src, src_mask = sources(6, 3, 9, 4)
    first = generate(model, src, src_mask, sampling(nbest=4, seed=1))
    again = generate(model, src, src_mask, sampling(nbest=4, seed=1))
    other = generate(model, src, src_mask, sampling(nbest=4, seed=2))
    tokens = [[[h.tokens for h in hyps] for hyps in run] for run in (first, again, other)]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]
    for hyps in first:
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_samples_are_drawn_batched_all_rows_in_one_step():
    model = make_model()
    recorder = StepRecorder(model)
    src, src_mask = sources(6, 3, 9)
    generate(model, src, src_mask, sampling(nbest=5, seed=0))
    assert recorder.rows[0] == 3 * 5  # every sample of every sentence decodes in the same call


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampling_on_cuda_is_reproducible_with_a_seed_and_scores_as_on_cpu():
    """The samples' log-probabilities equal those of forced scoring on the CPU (the search sums float32)."""
    from attnx.inference.scoring import force_decode

    on_cpu = make_model().double()
    on_gpu = copy.deepcopy(on_cpu).cuda()
    src, src_mask = sources(7, 3, 12, 1)
    config = SearchConfig(sampling=True, nbest=3, top_p=0.9, seed=4, max_positions=128)
    first = generate(on_gpu, src.cuda(), src_mask.cuda(), config)
    again = generate(on_gpu, src.cuda(), src_mask.cuda(), config)
    assert [[h.tokens for h in hyps] for hyps in first] == [[h.tokens for h in hyps] for hyps in again]
    rows = torch.tensor([i for i, hyps in enumerate(first) for _ in hyps])
    flat = [h for hyps in first for h in hyps]
    forced = force_decode(on_cpu, src[rows], src_mask[rows], [h.tokens for h in flat], config)
    assert [h.log_prob for h in forced] == pytest.approx([h.log_prob for h in flat], rel=1e-6, abs=1e-5)
