"""Constraints: `<pad>` and `<s>` never generated, `no_repeat_ngram`, `min_length`, forced prefixes, and the
maximum length over them all."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnx.inference.config import SearchConfig
from attnx.inference.constraints import Constraints, prefix_table
from attnx.inference.search import generate, greedy_search, translate_batch
from tests.inference.toys import StepRecorder, likelier_eos, make_model, sources


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


# --- one step's bans, on hand-made log-probabilities ----------------------------------------------------------

V = 10


def step_log_probs(rows: int) -> torch.Tensor:
    return torch.log_softmax(torch.randn(rows, V, generator=torch.Generator().manual_seed(rows)), dim=1)


def apply(
    config: SearchConfig, raw: torch.Tensor, t: int, at_max: list[bool], history: list[list[int]], **prefix
):
    constraints = Constraints(config, *prefix_table(prefix.get("prefixes"), raw.shape[0], "cpu"))
    history_ids = torch.tensor(history, dtype=torch.long).view(raw.shape[0], t)
    return constraints.apply(raw.clone(), t, torch.tensor(at_max), history_ids, torch.arange(raw.shape[0]))


def test_special_tokens_are_banned_and_everything_else_kept_as_the_models():
    raw = step_log_probs(2)
    out = apply(SearchConfig(), raw, 0, [False, False], [[], []])
    assert bool((out[:, [PAD_ID, BOS_ID]] == -math.inf).all())
    keep = [i for i in range(V) if i not in (PAD_ID, BOS_ID)]
    assert torch.equal(out[:, keep], raw[:, keep])  # the model's own log-probabilities, not renormalized


def test_at_the_maximum_length_only_the_end_of_sentence_remains_with_its_own_log_prob():
    raw = step_log_probs(3)
    out = apply(SearchConfig(min_length=5), raw, 2, [False, True, False], [[4, 5]] * 3)
    assert out[1, EOS_ID] == raw[1, EOS_ID]  # min_length loses to the maximum length
    assert bool((out[1, [i for i in range(V) if i != EOS_ID]] == -math.inf).all())
    assert out[0, EOS_ID] == out[2, EOS_ID] == -math.inf  # min_length: no </s> before 5 tokens
    assert torch.equal(out[0, 4:], raw[0, 4:])


def test_no_repeat_ngram_bans_exactly_the_tokens_that_would_repeat_an_ngram():
    raw = step_log_probs(2)
    out = apply(SearchConfig(no_repeat_ngram=2), raw, 3, [False, False], [[7, 8, 7], [5, 6, 7]])
    assert out[0, 8] == -math.inf  # 7 8 was written: after 7, 8 would repeat it
    assert torch.equal(out[0, 9], raw[0, 9]) and torch.equal(out[0, 7], raw[0, 7])
    assert torch.equal(out[1, 4:], raw[1, 4:])  # no n-gram of row 1 starts with 7


def test_a_row_with_nothing_left_to_write_may_end():
    raw = step_log_probs(2)
    # Row 0 wrote every ordinary token once: no_repeat_ngram 1 bans them all, min_length bans </s>.
    written = [[UNK_ID, *range(4, V)], [UNK_ID, 4, 4, 4, 4, 4, 4]]
    out = apply(SearchConfig(min_length=20, no_repeat_ngram=1), raw, V - 3, [False, False], written)
    assert out[0, EOS_ID] == raw[0, EOS_ID] and bool(
        torch.isinf(out[0, [i for i in range(V) if i != EOS_ID]]).all()
    )
    assert out[1, EOS_ID] == -math.inf and torch.equal(out[1, 5:], raw[1, 5:])  # row 1 still has tokens


def test_a_forced_prefix_allows_only_its_next_token_with_the_models_log_prob():
    raw = step_log_probs(2)
    prefixes = [[9, 9, 12], []]
    out = apply(SearchConfig(no_repeat_ngram=1), raw, 1, [False, False], [[9], [9]], prefixes=prefixes)
    assert out[0, 9] == raw[0, 9]  # the prefix's second 9, although no_repeat_ngram bans it
    assert bool((out[0, [i for i in range(V) if i != 9]] == -math.inf).all())
    assert out[1, 9] == -math.inf and torch.equal(out[1, 4:9], raw[1, 4:9])  # no prefix: bans as usual


def test_prefix_table_pads_the_prefixes_and_follows_the_sentences_kept():
    table, lengths = prefix_table([[9, 9, 12], [], [40]], 3, "cpu")
    assert table.tolist() == [[9, 9, 12], [PAD_ID] * 3, [40, PAD_ID, PAD_ID]] and lengths.tolist() == [
        3,
        0,
        1,
    ]
    assert prefix_table(None, 3, "cpu") == prefix_table([[], [], []], 3, "cpu") == (None, None)
    with pytest.raises(
        ValueError, match=r"^2 prefixes for 3 sources: give one \(possibly empty\) per source$"
    ):
        prefix_table([[9], [10]], 3, "cpu")
    constraints = Constraints(SearchConfig(), table, lengths)
    constraints.keep(torch.tensor([2, 0]))  # the sentences still searched, after a re-pack
    assert constraints.prefixes.tolist() == [[40, PAD_ID, PAD_ID], [9, 9, 12]]
    assert constraints.prefix_lengths.tolist() == [1, 3]
