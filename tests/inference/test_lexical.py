"""Lexically constrained beam search: phrases every output contains (dynamic beam allocation), in order when
asked, banned phrases never written, with the KV cache, n-best lists, ensembles and the length penalty."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from attnx.data.batch import BOS_ID, collate
from attnx.inference.config import SearchConfig
from attnx.inference.decoder import EnsembleDecoder, ModelDecoder
from attnx.inference.eager import EagerTranslator
from attnx.inference.lexical import LexicalBeam, PhraseIds, compile_phrases
from attnx.inference.search import generate
from attnx.inference.term_tables import TermTables
from attnx.inference.terms import Vocabulary
from tests.inference.toys import make_model, sources


def contains(tokens: list[int], phrase: list[int]) -> bool:
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def position(tokens: list[int], phrase: list[int]) -> int:
    n = len(phrase)
    return next(i for i in range(len(tokens) - n + 1) if tokens[i : i + n] == phrase)


class FullPassDecoder:
    """The decoder seam without a cache: every step runs the whole target so far through `model.decode`."""

    def __init__(self, model) -> None:
        self.model = model
        self.models = [model]
        self.vocab_size = model.vocab_size

    def start(self, src, src_mask):
        memory = self.model.encode(src, src_mask)
        return {"memory": memory, "mask": src_mask, "tokens": torch.empty(src.shape[0], 0, dtype=torch.long)}

    def step(self, tokens, state):
        state["tokens"] = torch.cat([state["tokens"], tokens.unsqueeze(1)], dim=1)
        logits = self.model.decode(state["tokens"], state["memory"], state["mask"])[:, -1]
        return torch.log_softmax(logits.float(), dim=-1)

    def reorder(self, state, index, same_sources=False):
        for key in state:
            state[key] = state[key][index]


PHRASES = [
    PhraseIds([[10, 11, 12]]),
    PhraseIds([[20], [30, 31]], ordered=True),
    PhraseIds([[7, 8], [9]], exclude=[[40, 40]]),
]


# --- the tensors ---------------------------------------------------------------------------------------


def id_beam(k: int, phrases: list[list[int]]) -> LexicalBeam:
    """A beam over one sentence whose phrases are id sequences of a 50-token vocabulary."""
    vocab = Vocabulary.of_ids(50)
    terms, needs, origin = compile_phrases(vocab, [PhraseIds(phrases)], include=True)
    return LexicalBeam(k, 50, TermTables(vocab, terms, "cpu", needs), [False], "cpu", origin)


def test_tables_pad_phrases_and_count_their_lengths():
    vocab = Vocabulary.of_ids(50)
    terms, needs, _ = compile_phrases(
        vocab, [PhraseIds([[5, 6, 7]]), PhraseIds([[8], [9, 10]]), PhraseIds()], True
    )
    tables = TermTables(vocab, terms, "cpu", needs)
    assert tables.lengths.tolist() == [[3, 0], [1, 2], [0, 0]]
    assert tables.need.tolist() == [[1, 0], [1, 1], [0, 0]]


def test_a_phrase_listed_twice_is_one_phrase_needed_twice():
    vocab = Vocabulary.of_ids(50)
    terms, needs, origin = compile_phrases(vocab, [PhraseIds([[5], [6], [5]])], True)
    assert [t.text for t in terms[0]] == [vocab.spell([5]), vocab.spell([6])]
    assert needs == [[2, 1]] and origin == [[[0, 2], [1]]]


def test_candidates_offer_each_phrase_start_and_fill_the_beam_round_robin_over_banks():
    beam = id_beam(3, [[10, 11]])
    log_probs = torch.log_softmax(torch.arange(50, dtype=torch.float), dim=0).unsqueeze(0)  # 49 likeliest
    top, source, token, _ = beam.candidates(
        log_probs,
        torch.zeros(1),
        torch.tensor([0]),
        torch.tensor([0]),
        1,
        torch.empty(1, 0, dtype=torch.long),
    )
    # token 10 (bank 1) is far less likely than 49, 48, 47, yet takes the first slot; then bank 0 by score
    assert token.tolist() == [[10, 49, 48]]
    assert source.tolist() == [[0, 0, 0]]


def test_follow_marks_a_phrase_met_when_the_hypothesis_ends_with_it():
    beam = id_beam(2, [[10, 11], [12], [12]])
    one = torch.tensor([0])
    beam.follow(one, torch.tensor([[10]]), one)
    assert beam.unmet(one, one) == [[0, 1, 2]]
    beam.follow(one, torch.tensor([[10, 11]]), one)
    assert beam.unmet(one, one) == [[1, 2]]
    beam.follow(one, torch.tensor([[10, 11, 12]]), one)
    assert beam.unmet(one, one) == [[2]]  # listed twice: met once of two
    assert beam.unfinished(one).tolist() == [True]
    beam.follow(one, torch.tensor([[10, 11, 12, 12]]), one)
    assert beam.unmet(one, one) == [[]] and beam.unfinished(one).tolist() == [False]


# --- the search ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam", [3, 5])
def test_constrained_beam_with_the_cache_equals_it_without(beam):
    model = make_model()
    src, src_mask = sources(5, 7, 3)
    config = SearchConfig(beam=beam, nbest=2, max_len_a=0, max_len_b=12)
    cached = generate(model, src, src_mask, config, constraints=PHRASES)
    full = generate(EnsembleDecoder([FullPassDecoder(model)]), src, src_mask, config, constraints=PHRASES)
    for a, b in zip(cached, full, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_every_phrase_appears_in_every_hypothesis_and_the_search_changes_nothing_else():
    model = make_model()
    src, src_mask = sources(5, 7, 3)
    config = SearchConfig(beam=4, nbest=3, max_len_a=0, max_len_b=12)
    free = generate(model, src, src_mask, config)
    results = generate(model, src, src_mask, config, constraints=PHRASES)
    for hyps, c in zip(results, PHRASES, strict=True):
        assert len(hyps) == 3
        assert hyps[0].unmet == []
        for hyp in hyps:  # the maximum length may end the others first: they say so, and rank last
            assert hyp.unmet == [i for i, p in enumerate(c.include) if not contains(hyp.tokens, p)]
            assert not any(contains(hyp.tokens, p) for p in c.exclude)
        assert [len(h.unmet) for h in hyps] == sorted(len(h.unmet) for h in hyps)
    # a sentence without constraints in the same batch decodes as it does alone
    mixed = generate(model, src, src_mask, config, constraints=[PHRASES[0], None, None])
    assert [h.tokens for h in mixed[1]] == [h.tokens for h in free[1]]


def test_ordered_phrases_appear_in_the_given_order():
    model = make_model()
    src, src_mask = sources(6, 4)
    config = SearchConfig(beam=4, nbest=4, max_len_a=0, max_len_b=10)
    for order in ([[30, 31], [20]], [[20], [30, 31]]):
        results = generate(model, src, src_mask, config, constraints=[PhraseIds(order, ordered=True)] * 2)
        assert all(hyps[0].unmet == [] for hyps in results)
        for hyp in itertools.chain.from_iterable(results):
            if not hyp.unmet:
                assert position(hyp.tokens, order[0]) + len(order[0]) <= position(hyp.tokens, order[1])


def test_banned_phrases_never_appear_though_their_tokens_may():
    model = make_model()
    src, src_mask = sources(5, 7)
    config = SearchConfig(beam=4, nbest=4, max_len_a=0, max_len_b=12)
    free = generate(model, src, src_mask, config)
    # ban the likeliest pair of consecutive tokens of each best hypothesis
    banned = [[h[0].tokens[i], h[0].tokens[i + 1]] for h in free for i in [0]]
    results = generate(model, src, src_mask, config, constraints=[PhraseIds(exclude=[b]) for b in banned])
    for hyps, phrase in zip(results, banned, strict=True):
        for hyp in hyps:
            assert not contains(hyp.tokens, phrase)
        assert hyps[0].tokens != free[banned.index(phrase)][0].tokens


def test_the_maximum_length_ends_a_hypothesis_that_has_not_met_its_phrases_and_says_which():
    model = make_model()
    src, src_mask = sources(5)
    # a phrase the maximum length leaves no room for after the prefix: 2 tokens allowed
    config = SearchConfig(beam=3, max_len_a=0, max_len_b=2)
    [hyps] = generate(model, src, src_mask, config, prefixes=[[5, 5]], constraints=[PhraseIds([[9, 9, 9]])])
    # the limit grows to the prefix and the phrase: the phrase still fits
    assert contains(hyps[0].tokens, [9, 9, 9]) and hyps[0].unmet == []
    banned = PhraseIds([[9, 9]], exclude=[[9, 9]])  # impossible: ended by the maximum length, said
    [hyps] = generate(
        model, src, src_mask, SearchConfig(beam=3, max_len_a=0, max_len_b=4), constraints=[banned]
    )
    assert hyps[0].unmet == [0]


def test_n_best_length_penalty_and_ensembles_work_with_phrases():
    models = [make_model(), make_model()]
    src, src_mask = sources(5, 6)
    constraints = [PhraseIds([[10, 11]]), PhraseIds([[12]])]
    for config in (
        SearchConfig(beam=4, nbest=4, max_len_a=0, max_len_b=9, alpha=0.0),
        SearchConfig(beam=4, nbest=2, max_len_a=0, max_len_b=9, alpha=1.5, length_penalty="fairseq"),
    ):
        ensemble = EnsembleDecoder([ModelDecoder(m) for m in models], weights=[0.3, 0.7])
        for decoder in (models[0], ensemble):
            results = generate(decoder, src, src_mask, config, constraints=constraints)
            for hyps, c in zip(results, constraints, strict=True):
                assert len(hyps) == config.nbest
                met = [h for h in hyps if not h.unmet]
                assert met and hyps[: len(met)] == met  # those that met the phrase first, best first
                assert [h.score for h in met] == sorted((h.score for h in met), reverse=True)
                for hyp in hyps:
                    assert contains(hyp.tokens, c.include[0]) == (hyp.unmet == [])
                    lp = (len(hyp.tokens) + 1) ** config.alpha if config.length_penalty == "fairseq" else 1.0
                    assert hyp.score == pytest.approx(hyp.log_prob / lp, rel=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_constrained_beam_on_cuda_equals_cpu_in_float64():
    model = make_model().double()
    src, src_mask = sources(5, 7, 3)
    config = SearchConfig(beam=4, nbest=2, max_len_a=0, max_len_b=12)
    on_cpu = generate(model, src, src_mask, config, constraints=PHRASES)
    on_gpu = generate(model.cuda(), src.cuda(), src_mask.cuda(), config, constraints=PHRASES)
    assert [[h.tokens for h in hyps] for hyps in on_gpu] == [[h.tokens for h in hyps] for hyps in on_cpu]
    assert [h.score for hyps in on_gpu for h in hyps] == pytest.approx(
        [h.score for hyps in on_cpu for h in hyps], abs=1e-9
    )


def test_phrases_refuse_sampling():
    model = make_model()
    src, src_mask = sources(5)
    with pytest.raises(ValueError, match="beam search"):
        generate(model, src, src_mask, SearchConfig(sampling=True), constraints=[PhraseIds([[9]])])


# --- a trained model ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator(trained: Path) -> EagerTranslator:
    return EagerTranslator.from_checkpoint(trained, search=SearchConfig(beam=4))


def test_a_trained_model_writes_one_and_two_reference_phrases_in_every_translation(translator, test_set):
    lines = test_set.lines[:12]
    refs = [translator.decode(r) for r in test_set.references[:12]]
    words = [r.split() for r in refs]
    one = [[w[1]] for w in words]
    two = [[" ".join(w[-3:-1]), w[0]] for w in words]
    for phrases in (one, two):
        out = translator.translate(lines, constraints=phrases)
        for text, wanted in zip(out, phrases, strict=True):
            for phrase in wanted:
                assert phrase in text
    ordered = [{"include": [w[2], w[0]], "ordered": True} for w in words]
    for hyps, c in zip(translator.generate(lines, constraints=ordered), ordered, strict=True):
        text = hyps[0].text
        assert hyps[0].unmet == []
        assert text.index(c["include"][0]) < text.rindex(c["include"][1])


def test_a_trained_model_never_writes_an_excluded_phrase(translator, test_set):
    lines = test_set.lines[:12]
    free = translator.translate(lines)
    banned = [" ".join(t.split()[:2]) for t in free]
    out = translator.translate(lines, constraints=[{"exclude": [b]} for b in banned])
    for text, phrase in zip(out, banned, strict=True):
        assert phrase not in text


def test_without_phrases_the_search_is_unchanged(translator, test_set):
    src = collate([(x, []) for x in test_set.sources[:6]])
    config = SearchConfig(beam=4, nbest=2)
    plain = generate(translator.decoder, src.src, src.src_mask, config)
    empty = generate(translator.decoder, src.src, src.src_mask, config, constraints=[None] * 6)
    assert [[h.tokens for h in x] for x in plain] == [[h.tokens for h in x] for x in empty]
    assert BOS_ID not in plain[0][0].tokens
