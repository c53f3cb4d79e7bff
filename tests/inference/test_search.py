"""§6.1 decoding: the KV cache, greedy and beam search, length penalty, maximum length, early termination."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math

import pytest
import torch

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID, UNK_ID, collate
from attnx.inference import search
from attnx.inference.search import (
    SearchConfig,
    beam_search,
    generate,
    greedy_search,
    length_penalty,
    max_output_lengths,
    translate_batch,
)
from attnx.model import build_transformer
from attnx.model.transformer import DecoderState
from tests.conftest import tiny_config


def make_model(**overrides):
    return build_transformer(tiny_config(**overrides)).eval()


def sources(*lengths: int, vocab: int = 50):
    """A padded batch of random sources of the given lengths (ids >= 4), EOS appended."""
    gen = torch.Generator().manual_seed(sum(lengths))
    ids = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in lengths]
    batch = collate([(x, []) for x in ids])
    return batch.src, batch.src_mask


class StepRecorder:
    """Wraps ``model.decode_step``: records the rows of every call, optionally edits the logits."""

    def __init__(self, model, edit=None):
        self.rows: list[int] = []
        self.inner = model.decode_step
        self.edit = edit
        model.decode_step = self

    def __call__(self, tokens, state):
        self.rows.append(tokens.shape[0])
        logits = self.inner(tokens, state)
        return logits if self.edit is None else self.edit(logits, state.offset - 1)


def likelier_eos(logits, position):
    """</s> more likely at every position, so hypotheses and sentences end at different lengths."""
    logits = logits.clone()
    logits[:, EOS_ID] += 0.4 * position
    return logits


def never_eos(logits, position):
    logits = logits.clone()
    logits[:, EOS_ID] = -1e4  # finite: EOS is still possible when forced
    return logits


# --- the cache -------------------------------------------------------------------------------------------


def test_cached_decode_step_equals_full_recomputation_also_after_reorder():
    model = make_model()
    src, src_mask = sources(5, 9, 7)
    gen = torch.Generator().manual_seed(1)
    prefix = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 50, (3, 8), generator=gen)], 1)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        state = model.start_decoding(memory, src_mask)
        for i in range(5):
            step = model.decode_step(prefix[:, i], state)
            full = model.decode(prefix[:, : i + 1], memory, src_mask)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
        # beam-style reorder: rows 2, 0, 0 continue; the cache must follow them
        index = torch.tensor([2, 0, 0])
        state.reorder(index)
        prefix, memory, src_mask = prefix[index], memory[index], src_mask[index]
        for i in range(5, 9):
            step = model.decode_step(prefix[:, i], state)
            full = model.decode(prefix[:, : i + 1], memory, src_mask)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_beam_reorder_within_sentences_moves_only_the_self_attention_cache():
    model = make_model()
    src, src_mask = sources(5, 9)
    gen = torch.Generator().manual_seed(2)
    prefix = torch.cat([torch.full((4, 1), BOS_ID), torch.randint(4, 50, (4, 6), generator=gen)], 1)
    with torch.no_grad():
        memory = model.encode(src, src_mask).repeat_interleave(2, 0)  # rows 0-1: sentence 0, 2-3: 1
        mask = src_mask.repeat_interleave(2, 0)
        state = model.start_decoding(model.encode(src, src_mask), src_mask)
        state.reorder(torch.arange(2).repeat_interleave(2))  # each sentence twice, as the beam does
        for i in range(3):
            model.decode_step(prefix[:, i], state)
        index = torch.tensor([1, 1, 3, 2])  # back-pointers within each sentence
        cross_before = state.caches[0][1].k
        state.reorder(index, same_sources=True)
        assert state.caches[0][1].k is cross_before  # the source side was not copied
        prefix = prefix[index]
        for i in range(3, 6):
            step = model.decode_step(prefix[:, i], state)
            full = model.decode(prefix[:, : i + 1], memory, mask)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_encoder_keys_and_values_are_computed_once_per_sentence_not_per_beam_or_step():
    model = make_model()
    src, src_mask = sources(6, 4)
    calls: list[int] = []
    hooks = [
        layer.cross_attn.k_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
        for layer in model.decoder_layers
    ]
    try:
        recorder = StepRecorder(model)
        beam_search(model, src, src_mask, SearchConfig(beam=4, max_len_a=0, max_len_b=6))
    finally:
        for hook in hooks:
            hook.remove()
    assert len(recorder.rows) > 1
    assert calls == [2] * len(model.decoder_layers)  # one call per layer, batch of 2 sentences, not 8 rows


# --- length penalty and maximum length -------------------------------------------------------------------


def test_length_penalty_is_the_gnmt_form_of_the_paper():
    # ((5 + |Y|) / 6) ** 0.6, computed by hand
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2**0.6) == pytest.approx(1.515716566510398)
    assert length_penalty(10, 0.6) == pytest.approx(1.7328621)  # 2.5 ** 0.6
    assert length_penalty(25, 0.6) == pytest.approx(5**0.6)
    assert length_penalty(10, 0.6, "fairseq") == pytest.approx(3.9810717)  # 10 ** 0.6
    assert length_penalty(10, 0.0) == 1.0
    with pytest.raises(ValueError, match="gnmt"):
        length_penalty(3, 0.6, "wu")


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


def test_pad_and_bos_are_never_generated_but_unk_is():
    def prefer_specials(logits, position):
        logits = logits.clone()
        logits[:, PAD_ID] += 100
        logits[:, BOS_ID] += 100
        logits[:, UNK_ID] += 50
        return logits

    model = make_model()
    StepRecorder(model, prefer_specials)
    src, src_mask = sources(3, 5)
    for out in (
        greedy_search(model, src, src_mask, 0, 4),
        translate_batch(model, src, src_mask, SearchConfig()),
    ):
        for ids in out:
            assert PAD_ID not in ids and BOS_ID not in ids
            assert UNK_ID in ids


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


class MarkovModel(torch.nn.Module):
    """A toy decoder: next-token log-probs depend only on the position and the last token."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table.log())  # (positions, V, V) probabilities
        self.vocab_size = table.shape[-1]

    def encode(self, src, src_mask):
        return src.float().unsqueeze(-1)

    def start_decoding(self, memory, src_mask):
        return DecoderState(memory=memory, src_mask=src_mask)

    def decode_step(self, tokens, state):
        state.offset += 1
        return self.table[state.offset - 1, tokens]

    def decode(self, tgt_in, memory, src_mask):
        return torch.stack([self.table[i, tgt_in[:, i]] for i in range(tgt_in.shape[1])], 1)


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


# --- sampling -------------------------------------------------------------------------------------------


def sampling(**changes):
    return SearchConfig(sampling=True, max_len_a=0.5, max_len_b=6, **changes)


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


def test_top_k_1_sampling_equals_greedy_equals_beam_1():
    model = make_model()
    StepRecorder(model, likelier_eos)
    src, src_mask = sources(7, 3, 12, 1, 5)
    greedy = greedy_search(model, src, src_mask, 0.5, 6)
    beam_1 = translate_batch(model, src, src_mask, SearchConfig(beam=1, max_len_a=0.5, max_len_b=6))
    sampled = generate(model, src, src_mask, sampling(nbest=3, top_k=1, seed=5))
    assert beam_1 == greedy
    for hyps, best in zip(sampled, greedy, strict=True):
        assert [h.tokens for h in hyps] == [best] * 3


def first_token_model(probs: list[float], v: int = 10) -> MarkovModel:
    """A MarkovModel whose first-token distribution is `probs` over tokens 4, 5, ... (</s> after that)."""
    table = torch.zeros(3, v, v)  # log 0 = -inf: impossible at any temperature
    table[0, :, EOS_ID] = 1.0  # rows never used, kept proper distributions
    table[0, BOS_ID, EOS_ID] = 0.0
    table[0, BOS_ID, 4 : 4 + len(probs)] = torch.tensor(probs)
    table[1:, :, EOS_ID] = 1.0
    return MarkovModel(table)


def first_tokens(model, config, n_sentences=50) -> list[int]:
    batch = collate([([5, 6], [])] * n_sentences)
    return [h.tokens[0] for hyps in generate(model, batch.src, batch.src_mask, config) for h in hyps]


def test_sampled_first_tokens_follow_the_models_distribution_chi_square():
    probs = [0.5, 0.25, 0.15, 0.1]
    drawn = first_tokens(first_token_model(probs), SearchConfig(sampling=True, nbest=40, seed=3, max_len_b=2))
    counts = torch.bincount(torch.tensor(drawn) - 4, minlength=len(probs)).double()
    expected = torch.tensor(probs, dtype=torch.float64) * len(drawn)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert len(drawn) == 2000
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


def test_top_p_keeps_only_the_nucleus_and_top_k_the_k_most_probable():
    model = first_token_model([0.5, 0.25, 0.15, 0.1])
    config = SearchConfig(sampling=True, nbest=20, seed=4, max_len_b=2)
    assert set(first_tokens(model, dataclasses.replace(config, top_p=0.7))) == {4, 5}  # 0.5 + 0.25 >= 0.7
    assert set(first_tokens(model, dataclasses.replace(config, top_p=0.5))) == {4}
    assert set(first_tokens(model, dataclasses.replace(config, top_p=0.8))) == {4, 5, 6}
    assert set(first_tokens(model, dataclasses.replace(config, top_k=2))) == {4, 5}
    assert set(first_tokens(model, config)) == {4, 5, 6, 7}


def test_epsilon_sampling_never_draws_a_token_below_epsilon_but_keeps_the_most_probable():
    model = first_token_model([0.5, 0.25, 0.15, 0.1])
    config = SearchConfig(sampling=True, nbest=20, seed=4, max_len_b=2)
    assert set(first_tokens(model, dataclasses.replace(config, epsilon=0.12))) == {4, 5, 6}
    assert set(first_tokens(model, dataclasses.replace(config, epsilon=0.2))) == {4, 5}
    assert set(first_tokens(model, dataclasses.replace(config, epsilon=0.9))) == {4}  # none reaches 0.9


def test_temperature_shapes_the_draws_not_the_reported_log_probs():
    model = first_token_model([0.7, 0.3])
    config = SearchConfig(sampling=True, nbest=40, seed=6, max_len_b=2)
    cold = first_tokens(model, dataclasses.replace(config, temperature=0.1), 5)
    assert set(cold) == {4}  # 0.7 ** 10 against 0.3 ** 10: token 5 almost never
    batch = collate([([5, 6], [])])
    hyps = generate(model, batch.src, batch.src_mask, dataclasses.replace(config, temperature=3.0))[0]
    for h in hyps:
        assert h.token_log_probs[0] == pytest.approx(math.log([0.7, 0.3][h.tokens[0] - 4]), abs=1e-6)


# --- constraints ----------------------------------------------------------------------------------------


def repeating(logits, position):
    """A model that would write the same two tokens over and over."""
    logits = logits.clone()
    logits[:, 7 + position % 2] += 50
    logits[:, EOS_ID] = -1e4
    return logits


@pytest.mark.parametrize("config", [SearchConfig(beam=3), SearchConfig(sampling=True, nbest=3, seed=0)])
def test_no_repeat_ngram_never_repeats_an_ngram(config):
    model = make_model()
    StepRecorder(model, repeating)
    src, src_mask = sources(6, 9)
    plain = generate(model, src, src_mask, dataclasses.replace(config, max_len_a=0, max_len_b=12))
    assert plain[0][0].tokens[:4] == [7, 8, 7, 8]  # the edit works: repeats without the constraint
    for n in (1, 2, 3):
        limited = dataclasses.replace(config, no_repeat_ngram=n, max_len_a=0, max_len_b=12)
        for hyps in generate(model, src, src_mask, limited):
            for h in hyps:
                grams = [tuple(h.tokens[i : i + n]) for i in range(len(h.tokens) - n + 1)]
                assert len(grams) == len(set(grams)), (n, h.tokens)


@pytest.mark.parametrize("config", [SearchConfig(beam=3), SearchConfig(sampling=True, nbest=3, seed=0)])
def test_min_length_holds_back_the_end_of_sentence(config):
    def early_eos(logits, position):
        logits = logits.clone()
        logits[:, EOS_ID] += 50
        return logits

    model = make_model()
    StepRecorder(model, early_eos)
    src, src_mask = sources(6, 9)
    assert all(h.tokens == [] for hyps in generate(model, src, src_mask, config) for h in hyps[:1])
    for hyps in generate(model, src, src_mask, dataclasses.replace(config, min_length=4)):
        assert [len(h.tokens) for h in hyps] == [4] * len(hyps)
    # the maximum length wins over min_length
    capped = dataclasses.replace(config, min_length=10, max_len_a=0, max_len_b=3)
    assert {len(h.tokens) for hyps in generate(model, src, src_mask, capped) for h in hyps} == {3}


@pytest.mark.parametrize(
    "config", [SearchConfig(beam=4, nbest=4), SearchConfig(sampling=True, nbest=3, seed=0)]
)
def test_a_forced_prefix_starts_every_hypothesis_of_its_sentence(config):
    model = make_model()
    StepRecorder(model, likelier_eos)
    src, src_mask = sources(6, 9, 4)
    prefixes = [[9, 9, 12], [], [40]]
    results = generate(model, src, src_mask, config, prefixes=prefixes)
    free = generate(model, src, src_mask, config)
    for hyps, prefix in zip(results, prefixes, strict=True):
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix
            assert len(h.token_log_probs) == len(h.tokens) + 1  # the prefix's own log-probs count
    if not config.sampling:
        assert [h.tokens for h in results[1]] == [h.tokens for h in free[1]]  # no prefix: as without
    long_prefix = [list(range(4, 30))] * 3  # longer than the maximum length: the prefix is kept whole
    short = dataclasses.replace(config, max_len_a=0, max_len_b=3)
    for hyps in generate(model, src, src_mask, short, prefixes=long_prefix):
        assert all(h.tokens == list(range(4, 30)) for h in hyps)


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
