"""Token selection: beam search's candidates, and sampling shaped by temperature, top-k, epsilon and top-p
that follows the model's own distribution."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnx.data.batch import BOS_ID, EOS_ID, collate
from attnx.inference.config import SearchConfig
from attnx.inference.search import generate, greedy_search, translate_batch
from attnx.inference.selection import BeamSelection, SampleSelection, draw, token_selection
from tests.inference.toys import MarkovModel, StepRecorder, likelier_eos, make_model, sampling, sources


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


# --- one step's candidates, on hand-made log-probabilities ----------------------------------------------------


def rows_of(sentences: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`row_sent`, `row_pos` of decoder rows holding the given sentence of each row, grouped by sentence."""
    row_sent = torch.tensor(sentences)
    row_pos = torch.tensor([sentences[:i].count(s) for i, s in enumerate(sentences)])
    return row_sent, row_pos


def test_beam_candidates_are_each_sentences_k_best_extensions_over_all_its_rows():
    gen = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(4, 8, generator=gen), dim=1)
    scores = torch.tensor([-1.0, -2.5, -0.5, -3.0])
    row_sent, row_pos = rows_of(
        [0, 0, 0, 1]
    )  # sentence 0 has three live rows, sentence 1 one, sentence 2 none
    top, source, token, step = BeamSelection(3, 8).candidates(log_probs, scores, row_sent, row_pos, 3)
    for sentence in (0, 1):
        rows = (row_sent == sentence).nonzero().squeeze(1).tolist()
        every = sorted(
            ((float(scores[r] + log_probs[r, y]), r, y) for r in rows for y in range(8)), reverse=True
        )[:3]
        assert top[sentence].tolist() == pytest.approx([s for s, _, _ in every])
        assert source[sentence].tolist() == [r for _, r, _ in every]
        assert token[sentence].tolist() == [y for _, _, y in every]
        assert step[sentence].tolist() == [float(log_probs[r, y]) for _, r, y in every]
    assert bool((top[2] == -math.inf).all())  # a sentence without rows has no extension


def test_beam_candidates_of_a_vocabulary_smaller_than_the_beam():
    log_probs = torch.log(torch.tensor([[0.1, 0.2, 0.7]]))
    top, _, token, _ = BeamSelection(4, 3).candidates(log_probs, torch.zeros(1), *rows_of([0]), 1)
    assert token[0, :3].tolist() == [2, 1, 0] and top[0, 3] == -math.inf


def test_draw_follows_the_weights_and_never_draws_a_zero_weight(monkeypatch: pytest.MonkeyPatch):
    """Rows of unnormalized weights with zeros first, last and between; 40,000 draws a row (chi-square at
    p = 0.001 against the weights), then the extremes of the uniform number: 0 and the largest below 1."""
    weights = torch.tensor(
        [[0.0, 0.0, 3.0, 0.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0, 0.0, 2.0], [0, 0, 0, 0, 0, 7.0]]
    )
    gen = torch.Generator().manual_seed(3)
    draws = torch.stack([draw(weights, gen) for _ in range(40_000)])  # (draws, rows)
    for row in range(3):
        counts = torch.bincount(draws[:, row], minlength=6).double()
        expected = 40_000 * weights[row].double() / weights[row].sum()
        assert counts[expected == 0].sum() == 0, (row, counts)
        kept = expected > 0
        chi2 = float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())
        assert chi2 <= {1: 0.0, 2: 10.83}[int(kept.sum())], (row, chi2)  # 1 degree of freedom: 10.83

    for u in (0.0, 1.0 - 2**-24):
        monkeypatch.setattr(torch, "rand", lambda shape, u=u, **kw: torch.full(shape, u, dtype=kw["dtype"]))
        token = draw(weights)
        assert bool((weights.gather(1, token.unsqueeze(1)) > 0).all()), (u, token)


def test_sampling_shapes_the_distribution_as_documented():
    probs = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.5, 0.25, 0.15, 0.1]])
    log_probs = probs.log()

    def shaped(**changes) -> list[float]:
        """The probabilities tokens 4-7 are drawn with (`multinomial` draws in proportion to the weights)."""
        config = SearchConfig(sampling=True, nbest=2, **changes)
        weights = SampleSelection(2, config, None).shaped(log_probs)[0]
        return (weights[4:] / weights.sum()).tolist()

    assert shaped() == pytest.approx([0.5, 0.25, 0.15, 0.1])
    assert shaped(top_k=2) == pytest.approx([2 / 3, 1 / 3, 0, 0])
    assert shaped(top_p=0.7) == pytest.approx([2 / 3, 1 / 3, 0, 0])  # 0.5 + 0.25 reaches 0.7
    assert shaped(top_p=0.5) == pytest.approx([1, 0, 0, 0])
    assert shaped(epsilon=0.12) == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    assert shaped(epsilon=0.9) == pytest.approx([1, 0, 0, 0])  # the most probable token always stays
    squared = torch.tensor([0.5, 0.25, 0.15, 0.1]) ** 2
    assert shaped(temperature=0.5) == pytest.approx((squared / squared.sum()).tolist())


def test_the_temperatures_accepted_draw_an_allowed_token():
    """Both ends of `TEMPERATURE_RANGE` keep a forbidden token (-inf) forbidden and the draw a proper one;
    1e-300 and 1e300 made every weight NaN (a draw out of the vocabulary)."""
    from attnx.inference.config import TEMPERATURE_RANGE

    log_probs = torch.log_softmax(torch.tensor([[0.0, 9.0, 3.0, -40.0, 1.0]]), dim=1)
    log_probs[0, 0] = -math.inf  # as Constraints forbids a token
    for temperature in TEMPERATURE_RANGE:
        config = SearchConfig(sampling=True, temperature=temperature)
        weights = SampleSelection(1, config, None).shaped(log_probs)
        assert bool(torch.isfinite(weights).all()) and weights[0, 0] == 0 and weights.sum() > 0
        token = draw(weights, torch.Generator().manual_seed(0))
        assert 1 <= int(token) <= 4


def test_sampled_candidates_report_the_models_own_log_probs():
    gen = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(3 * torch.randn(4, 8, generator=gen), dim=1)
    scores = torch.tensor([-1.0, -2.0, -0.5, -0.25])
    config = SearchConfig(sampling=True, nbest=2, top_k=1, temperature=0.5)
    top, source, token, step = SampleSelection(2, config, None).candidates(
        log_probs, scores, *rows_of([0, 0, 1, 1]), 2
    )
    best = log_probs.argmax(dim=1)  # top_k 1: every row draws its most probable token
    for sentence in (0, 1):
        for slot in range(2):
            row = int(source[sentence, slot])
            assert token[sentence, slot] == best[row]
            assert step[sentence, slot] == log_probs[row, best[row]]  # unshaped by the temperature
            assert top[sentence, slot] == scores[row] + log_probs[row, best[row]]
        assert top[sentence, 0] >= top[sentence, 1]
    assert sorted(source.flatten().tolist()) == [0, 1, 2, 3]


def test_the_selection_of_a_search_config():
    beam = token_selection(SearchConfig(beam=5, nbest=2), 50)
    assert isinstance(beam, BeamSelection) and beam.k == 5 and beam.stops_early
    sampler = token_selection(SearchConfig(sampling=True, nbest=3), 50)
    assert isinstance(sampler, SampleSelection) and sampler.k == 3 and not sampler.stops_early
