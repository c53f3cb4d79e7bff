from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from attnx.data.batch import collate
from attnx.data.batching import BatchDataset, LengthBuckets, TokenBatchSampler, collate_indices, plan_batches
from attnx.data.corpus import PreparedCorpus
from attnx.data.errors import DataError


def lengths(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, n)
    tgt = np.clip(src + rng.integers(-8, 12, n), 1, None)
    return src.astype(np.int32), tgt.astype(np.int32)


def padded(batch: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> tuple[int, int]:
    """Tokens of the padded source and target tensors, EOS/BOS included."""
    return len(batch) * (int(src[batch].max()) + 1), len(batch) * (int(tgt[batch].max()) + 1)


@pytest.mark.parametrize("max_tokens", [80, 500, 4096])
def test_batches_stay_within_budget_and_cover_each_pair_once(max_tokens: int) -> None:
    src, tgt = lengths()
    sampler = TokenBatchSampler(src, tgt, max_tokens, seed=3)
    batches = list(sampler)
    for batch in batches:
        s, t = padded(batch, src, tgt)
        assert s <= max_tokens and t <= max_tokens
    seen = np.concatenate(batches)
    assert np.array_equal(np.sort(seen), np.arange(len(src)))
    assert len(batches) == len(sampler)


def test_batches_are_full() -> None:
    """Greedy cuts leave little budget unused: a batch cannot take one more pair of its last length."""
    src, tgt = lengths(20_000)
    order, bounds = plan_batches(src, tgt, 4096, seed=1)
    for a, b in zip(bounds[:-2], bounds[1:-1], strict=True):
        s, t = padded(order[a : b + 1], src, tgt)
        assert max(s, t) > 4096  # adding the next pair would overflow


def test_same_seed_same_batches_new_epoch_new_order() -> None:
    src, tgt = lengths()
    a, b = TokenBatchSampler(src, tgt, 500, seed=1), TokenBatchSampler(src, tgt, 500, seed=1)
    first = [x.tolist() for x in a]
    assert first == [x.tolist() for x in b]
    a.set_epoch(1)
    second = [x.tolist() for x in a]
    assert second != first and sorted(map(sorted, second)) == sorted(map(sorted, first))
    other = [x.tolist() for x in TokenBatchSampler(src, tgt, 500, seed=2)]
    assert other != first


def test_ddp_ranks_get_disjoint_batches_and_equal_counts() -> None:
    src, tgt = lengths(1001)
    ranks = [TokenBatchSampler(src, tgt, 300, seed=5, num_replicas=2, rank=r) for r in range(2)]
    for r in ranks:
        r.set_epoch(4)
    batches = [[tuple(b.tolist()) for b in r] for r in ranks]
    total = ranks[0].num_batches
    assert len(batches[0]) == len(batches[1]) == len(ranks[0]) == (total + 1) // 2
    distinct = set(batches[0]) | set(batches[1])
    assert len(distinct) == total  # together every batch, the odd one out repeated to even the counts
    assert len(set(batches[0]) & set(batches[1])) == total % 2
    assert sorted(i for b in distinct for i in b) == list(range(1001))


def test_more_ranks_than_batches_still_gives_every_rank_a_batch() -> None:
    src, tgt = np.full(3, 5), np.full(3, 5)
    ranks = [TokenBatchSampler(src, tgt, 100, num_replicas=4, rank=r) for r in range(4)]
    assert ranks[0].num_batches == 1 and all(len(list(r)) == 1 for r in ranks)


def test_resume_mid_epoch_yields_the_remaining_batches() -> None:
    src, tgt = lengths()
    sampler = TokenBatchSampler(src, tgt, 500, seed=9)
    sampler.set_epoch(2)
    full = [b.tolist() for b in sampler]
    sampler.set_epoch(2)
    it = iter(sampler)
    for _ in range(7):
        next(it)
    state = sampler.state_dict()
    assert state["epoch"] == 2 and state["consumed"] == 7
    resumed = TokenBatchSampler(src, tgt, 500, seed=9)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # Lightning sets the restored epoch again
    assert [b.tolist() for b in resumed] == full[7:]
    resumed.set_epoch(3)  # later epochs are whole
    assert len(list(resumed)) == len(full)


def test_resume_with_another_plan_warns_and_restarts_the_epoch() -> None:
    src, tgt = lengths()
    state = TokenBatchSampler(src, tgt, 500, seed=9).state_dict(consumed=3)
    other = TokenBatchSampler(src, tgt, 800, seed=9)
    with pytest.warns(UserWarning, match="restarts from its first batch"):
        other.load_state_dict(state)
    assert len(list(other)) == len(other)


def test_oversized_pair_is_rejected_in_training_alone_in_evaluation() -> None:
    src, tgt = np.array([5, 5000, 7, 6]), np.array([5, 20, 7, 6])
    with pytest.raises(DataError, match="1 pair.* longer than max_tokens=100.*5001") as refused:
        TokenBatchSampler(src, tgt, 100)
    # the advice names an option `attnx prepare` has, with a value that fits the budget (length + EOS)
    assert str(refused.value).endswith("prepare the corpus with --max_sentence_tokens 99 or less")
    from attnx.commands.data import prepare

    assert "max_sentence_tokens" in inspect.signature(prepare).parameters
    batches = [b.tolist() for b in TokenBatchSampler(src, tgt, 100, shuffle=False, allow_oversized=True)]
    assert [1] in batches and sorted(sum(batches, [])) == [0, 1, 2, 3]


def test_evaluation_order_is_fixed_and_sorted_by_length() -> None:
    src, tgt = lengths(500)
    a = [b.tolist() for b in TokenBatchSampler(src, tgt, 400, shuffle=False, seed=1)]
    b_ = TokenBatchSampler(src, tgt, 400, shuffle=False, seed=2)
    b_.set_epoch(3)
    assert a == [b.tolist() for b in b_]
    longest = [int(np.maximum(src, tgt)[batch].max()) for batch in a]
    assert longest == sorted(longest)


def test_collate_indices_equals_collate(multi30k) -> None:
    dataset = PreparedCorpus(multi30k).dataset("train")
    indices = np.array([3, 17, 4000, 9, 28_000])
    fast = collate_indices(dataset, indices)
    reference = collate([dataset[i] for i in indices], index=indices)
    for field in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask", "tgt_positions", "index"):
        assert torch.equal(getattr(fast, field), getattr(reference, field)), field
    assert (fast.n_src_tokens, fast.n_tgt_tokens) == (reference.n_src_tokens, reference.n_tgt_tokens)
    assert fast.src.dtype == torch.long


def test_length_buckets_round_up_to_multiples_then_eight_steps_per_doubling() -> None:
    buckets = LengthBuckets(8, max_tokens=10_000)
    ladder = sorted(set(buckets.pad(np.arange(1, 300)).tolist()))
    assert ladder[:16] == [8 * k for k in range(1, 17)]  # multiples of 8 up to 128
    assert ladder[16:] == [144, 160, 176, 192, 208, 224, 240, 256, 288, 320]  # then 1/8 of a doubling
    assert buckets.pad(np.array([1, 8, 9, 129])).tolist() == [8, 8, 16, 144]
    capped = LengthBuckets(8, max_tokens=100)
    assert capped.pad(np.array([95, 99, 101])).tolist() == [96, 100, 101]  # never past the budget
    with pytest.raises(DataError, match="shape_buckets"):
        LengthBuckets(0, 100)


@pytest.mark.parametrize("max_tokens", [500, 4096])
def test_shape_buckets_bound_the_shapes_of_an_epoch_within_the_budget(max_tokens: int) -> None:
    src, tgt = lengths(20_000)
    plain = TokenBatchSampler(src, tgt, max_tokens, seed=3)
    bucketed = TokenBatchSampler(src, tgt, max_tokens, seed=3, shape_buckets=8)
    batches = list(bucketed)
    seen = np.concatenate(batches)
    assert np.array_equal(np.sort(seen), np.arange(len(src)))
    ladder = np.unique(bucketed.buckets.pad(np.arange(1, 80)))
    full_sizes = {max_tokens // int(length) for length in ladder}
    for batch in batches:
        s = int(bucketed.buckets.pad(int(src[batch].max()) + 1))
        t = int(bucketed.buckets.pad(int(tgt[batch].max()) + 1))
        assert len(batch) * s <= max_tokens and len(batch) * t <= max_tokens
    sizes = np.diff(bucketed.bounds)
    assert set(sizes[:-1].tolist()) <= full_sizes  # only the plan's last batch may hold fewer
    assert bucketed.num_shapes <= len(ladder) ** 2 and bucketed.num_shapes < plain.num_shapes / 4
    assert plain.padding < bucketed.padding < plain.padding + 0.25


def test_batch_shapes_and_padding_are_those_of_the_collated_tensors(multi30k) -> None:
    dataset = PreparedCorpus(multi30k).dataset("train")
    for shape_buckets in (0, 8):
        sampler = TokenBatchSampler(
            dataset.src_lengths, dataset.tgt_lengths, 3000, seed=1, shape_buckets=shape_buckets
        )
        loader = BatchDataset(dataset, sampler.buckets)
        shapes, real, padded = set(), 0, 0
        for k, indices in enumerate(sampler):
            batch = loader[indices]
            shapes.add((batch.size, batch.src.shape[1], batch.tgt_in.shape[1]))
            real += batch.n_src_tokens + batch.n_tgt_tokens
            padded += batch.src.numel() + batch.tgt_in.numel()
            assert batch.src_mask.sum() == batch.n_src_tokens and batch.tgt_mask.sum() == batch.n_tgt_tokens
            if k == 40:
                break
        assert shapes <= {tuple(shape) for shape in sampler.shapes.tolist()}
    full = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, 3000, seed=1, shape_buckets=8)
    loader = BatchDataset(dataset, full.buckets)
    real = padded = 0
    for indices in full:
        batch = loader[indices]
        real += batch.n_src_tokens + batch.n_tgt_tokens
        padded += batch.src.numel() + batch.tgt_in.numel()
        assert batch.src.shape[1] % 8 == 0 and batch.tgt_in.shape[1] % 8 == 0
    assert full.padding == pytest.approx(1 - real / padded)
    assert full.summary().startswith(f"batches: {full.num_batches:,} an epoch in {full.num_shapes} shapes")


def test_resume_with_other_shape_buckets_warns_and_restarts_the_epoch() -> None:
    src, tgt = lengths()
    state = TokenBatchSampler(src, tgt, 500, seed=9).state_dict(consumed=3)
    other = TokenBatchSampler(src, tgt, 500, seed=9, shape_buckets=8)
    with pytest.warns(UserWarning, match="shape buckets"):
        other.load_state_dict(state)
    same = TokenBatchSampler(src, tgt, 500, seed=9, shape_buckets=8)
    same.load_state_dict(other.state_dict(consumed=3))
    assert len(list(same)) == len(same) - 3
