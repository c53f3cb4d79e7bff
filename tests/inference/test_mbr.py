"""MBR decoding: utilities equal sacreBLEU's, expected utilities by hand, and MBR through the translator."""

from __future__ import annotations

import dataclasses
import gzip

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

import attnx
from attnx.data.batch import collate
from attnx.inference import mbr as mbr_module
from attnx.inference.config import SearchConfig
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.mbr import (
    bleu_matrix,
    candidate_search,
    check_memory,
    chrf_matrix,
    expected_utilities,
    rank_by_expected_utility,
    utility_table_bytes,
)
from attnx.inference.search import generate
from tests.inference.test_eager import LINES

EDGE_CASES = ["", "a", "ab", "Ein Hund.", "Ein Hund.", "(hi)", "  x  y  ", "ünïcödé – „Zitat“"]


@pytest.fixture(scope="module")
def sentences(shared_data) -> list[str]:
    """Multi30k test sentences, their neighbours in the file and some edge cases."""
    with gzip.open(shared_data / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(30)]
    return lines + EDGE_CASES


@pytest.mark.parametrize(
    ("fast", "metric"),
    [(chrf_matrix, CHRF()), (bleu_matrix, BLEU(effective_order=True))],
    ids=["chrf", "bleu"],
)
def test_pairwise_utilities_equal_sacrebleu_sentence_scores(sentences, fast, metric):
    got = fast(sentences)
    want = np.array([[metric.sentence_score(h, [r]).score for r in sentences] for h in sentences])
    assert got.shape == (len(sentences), len(sentences))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert (got != got.T).any()  # hypothesis and reference are not interchangeable


def candidates(sentences: list[str], k: int) -> list[str]:
    """`k` distinct texts sharing many n-grams, as the samples of one source do."""
    words = " ".join(sentences).split()
    return [" ".join(words[i % 50 : i % 50 + 3 + i % 7]) + f" {i}" for i in range(k)]


@pytest.mark.parametrize("fast", [chrf_matrix, bleu_matrix], ids=["chrf", "bleu"])
def test_utilities_computed_in_blocks_of_n_grams_are_the_same_floats(sentences, fast, monkeypatch):
    texts = candidates(sentences, 120)
    whole = fast(texts)
    monkeypatch.setattr(mbr_module, "PAIRS_PER_CHUNK", 240)  # two n-grams a block
    np.testing.assert_array_equal(fast(texts), whole)


@pytest.mark.parametrize("fast", [chrf_matrix, bleu_matrix], ids=["chrf", "bleu"])
def test_the_memory_estimate_holds_what_the_utilities_take(sentences, fast):
    import tracemalloc

    texts = candidates(sentences, 500)
    tracemalloc.start()
    try:
        fast(texts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= utility_table_bytes(len(texts))


def test_an_mbr_table_over_the_memory_available_is_refused_by_every_translator(checkpoint, monkeypatch):
    """`search.mbr 100000` once asked numpy for 851 GiB in the middle of a run (ArrayMemoryError)."""
    check_memory(SearchConfig(mbr=13364), available=16 * 2**30)  # the most that fits 16 GiB
    with pytest.raises(ValueError, match=r"choose search.mbr 13364 or less$"):
        check_memory(SearchConfig(mbr=13365), available=16 * 2**30)
    monkeypatch.setattr(mbr_module, "available_memory", lambda: 2**30)
    with pytest.raises(ValueError) as err:
        attnx.load(checkpoint, search=SearchConfig(mbr=4000))
    assert str(err.value) == (
        "search.mbr 4000: the pairwise utilities of 4000 candidates take about 1.5 GiB of memory and 1.0 GiB "
        "are available; choose search.mbr 3291 or less"
    )
    translator = attnx.load(checkpoint, search=SearchConfig(beam=2))
    with pytest.raises(ValueError, match="search.mbr 4000: the pairwise utilities"):
        translator.with_search(mbr=4000, beam=4)
    assert utility_table_bytes(100_000) > 800 * 2**30


def test_a_long_utility_table_shows_its_progress_on_stderr(sentences, monkeypatch, capsys):
    monkeypatch.setattr(mbr_module, "PROGRESS_AFTER_S", 0)
    chrf_matrix(candidates(sentences, 20))
    assert "MBR: utilities of 20 candidates" in capsys.readouterr().err


def test_expected_chrf_of_three_candidates_by_hand():
    # chrF("ab" | "a"): 1-grams P = 1/2, R = 1 (no 2-gram in the reference: order 2 not counted);
    # F2 = 5 P R / (4 P + R) = 2.5 / 3. chrF("a" | "ab"): P = 1, R = 1/2: 2.5 / 4.5. "a" vs "b": 0.
    texts, utilities = expected_utilities(["ab", "a", "b"], "chrf")
    assert texts == ["ab", "a", "b"]
    assert utilities == pytest.approx(
        [(100 + 2 * 250 / 3) / 3, (500 / 9 + 100 + 0) / 3, (500 / 9 + 0 + 100) / 3]
    )


def test_expected_bleu_counts_a_candidate_drawn_twice_twice():
    # BLEU("a b" | "a c"): p1 = 1/2, p2 = 0 smoothed to 1 / (2 * 1); exp(mean log) = 1/2. Identical: 100.
    texts, utilities = expected_utilities(["a b", "a c", "a b"], "bleu")
    assert texts == ["a b", "a c"]
    assert utilities == pytest.approx([(100 + 50 + 100) / 3, (50 + 100 + 50) / 3])


def test_ranking_keeps_distinct_texts_best_first_and_the_most_probable_of_a_text():
    hyps = [
        Hypothesis([1], -2.0, -2.0, text="a"),
        Hypothesis([2], -1.0, -1.0, text="ab"),
        Hypothesis([3], -3.0, -3.0, text="b"),
        Hypothesis([4, 5], -0.5, -0.5, text="ab"),  # same text, other pieces, scored higher
    ]
    ranked = rank_by_expected_utility(hyps, "chrf")
    assert [h.text for h in ranked] == ["ab", "a", "b"]  # "a" and "b" tie: the higher score first
    assert ranked[0].tokens == [4, 5]
    assert ranked[0].expected_utility == pytest.approx((2 * 100 + 250 / 3 + 250 / 3) / 4)


def test_candidate_search_draws_n_samples_or_the_n_best_list():
    search = SearchConfig(mbr=8, top_p=0.9, seed=1)
    assert candidate_search(search) == SearchConfig(sampling=True, nbest=8, top_p=0.9, seed=1)
    nbest = SearchConfig(mbr=4, beam=6, mbr_candidates="nbest", mbr_utility="bleu")
    assert candidate_search(nbest) == SearchConfig(beam=6, nbest=4)
    eps = SearchConfig(mbr=4, mbr_candidates="epsilon", epsilon=0.02)
    assert candidate_search(eps) == SearchConfig(sampling=True, nbest=4, epsilon=0.02)
    assert candidate_search(SearchConfig()) == SearchConfig()


def test_mbr_of_identical_candidates_returns_that_candidate(checkpoint):
    # top-k 1: every sample is the greedy translation
    mbr = attnx.load(checkpoint, search=SearchConfig(mbr=6, top_k=1, seed=0, max_len_b=6))
    greedy = attnx.load(checkpoint, search=SearchConfig(beam=1, max_len_b=6))
    results = mbr.generate(LINES)
    for line, hyps, best in zip(LINES, results, greedy.generate(LINES), strict=True):
        assert [h.tokens for h in hyps] == [best[0].tokens]
        if line and hyps[0].text:
            assert hyps[0].expected_utility == pytest.approx(100.0)
    assert mbr.translate(LINES) == greedy.translate(LINES)


def test_mbr_returns_the_drawn_candidate_of_highest_expected_utility_reproducibly(checkpoint):
    search = SearchConfig(mbr=8, seed=5, max_len_b=6)
    translator = attnx.load(checkpoint, search=search)
    results = translator.generate(LINES)
    assert [[h.text for h in hyps] for hyps in results] == [
        [h.text for h in hyps] for hyps in translator.generate(LINES)
    ]  # same seed, same candidates, same choice
    drawn = translator.with_search(**dataclasses.asdict(candidate_search(search))).generate(LINES)
    for line, hyps, samples in zip(LINES, results, drawn, strict=True):
        if not line:
            continue
        texts, utilities = expected_utilities([h.text for h in samples], "chrf")
        assert sorted(h.text for h in hyps) == sorted(texts)  # each distinct sample, once
        assert hyps[0].expected_utility == pytest.approx(max(utilities))
        assert [h.expected_utility for h in hyps] == sorted((h.expected_utility for h in hyps), reverse=True)
        for h in hyps:  # each keeps the model's scores of its pieces
            assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** 0.6)
    other = translator.with_search(seed=6).generate(LINES)
    assert [[h.text for h in hyps] for hyps in results] != [[h.text for h in hyps] for hyps in other]


def test_mbr_over_the_nbest_list_ranks_the_beams_hypotheses(checkpoint):
    search = SearchConfig(mbr=4, beam=4, mbr_candidates="nbest", mbr_utility="bleu", max_len_b=6)
    ranked = attnx.load(checkpoint, search=search).generate(LINES)
    nbest = attnx.load(checkpoint, search=SearchConfig(beam=4, nbest=4, max_len_b=6)).generate(LINES)
    for line, hyps, beam in zip(LINES, ranked, nbest, strict=True):
        if line:
            assert sorted(h.text for h in hyps) == sorted({h.text for h in beam})
            assert all(h.expected_utility is not None for h in hyps)


def test_the_evaluation_path_decodes_the_mbr_choice(checkpoint):
    """`attnx test` and validation translate through `translate_tensors`: MBR reaches them too."""
    translator = attnx.load(checkpoint, search=SearchConfig(mbr=8, seed=2, max_len_b=6))
    batch = collate([(ids, []) for ids in translator.encode([line for line in LINES if line])])
    best = translator.translate_tensors(batch.src, batch.src_mask)
    drawn = generate(translator.decoder, batch.src, batch.src_mask, candidate_search(translator.search))
    for tokens, samples in zip(best, drawn, strict=True):
        for h in samples:
            h.text = translator.decode(h.tokens)
        assert tokens == rank_by_expected_utility(samples, "chrf")[0].tokens
