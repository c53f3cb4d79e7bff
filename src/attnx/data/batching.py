"""Token-budget batching (§5.1: "sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens").

Pairs are sorted by their longer side (then source length, target length, and a seeded random tie-break), and
cut greedily into batches whose padded size stays within `max_tokens` on both sides. The batches are fixed for a
seed; each epoch visits them in a new seeded order (fairseq does the same), so every epoch has the same number
of batches, which Lightning's progress, resuming and DDP all rely on.

Shape buckets ([`LengthBuckets`][attnx.data.batching.LengthBuckets]) round each batch's source and target
lengths up to a short ladder (multiples of 8, then 8 steps per doubling) and keep its number of pairs to the full
count of its length, so that a whole epoch uses a few dozen tensor shapes instead of one per batch: kernels
built per shape (oneDNN's bf16 kernels on CPU, `torch.compile`'s graphs) are then built once and reused, and
GPUs get tensor-core multiples. The padding they add is masked like any other.
"""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from attnx.data.corpus import ParallelDataset
from attnx.data.errors import DataError


class LengthBuckets:
    """The padded lengths a batch may have: a length rounded up to a multiple of `multiple`, and beyond
    `16 × multiple` to one of 8 steps per doubling (at most 12.5% more), capped at `max_tokens` (the widest
    side a batch may have: its token budget, or the model's positions where fewer).

    With `multiple` 8: 8, 16, ..., 128, 144, ..., 256, 288, ..., 512, 576, ... Batch sizes follow: a batch of
    padded length `L` holds `max_tokens // L` pairs, or the full count of a longer length where it ends
    before its pairs do (see [`plan_batches`][attnx.data.batching.plan_batches]).
    """

    def __init__(self, multiple: int, max_tokens: int) -> None:
        if multiple < 1:
            raise DataError(f"shape_buckets must be 0 (off) or a positive multiple, not {multiple}")
        self.multiple = multiple
        self.max_tokens = max_tokens

    def pad(self, lengths: np.ndarray | int) -> np.ndarray:
        """The padded length of each of `lengths` (EOS/BOS included)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        bits = np.frexp(np.maximum(lengths - 1, 1))[1].astype(np.int64)  # (lengths - 1).bit_length()
        step = np.maximum(self.multiple, np.left_shift(1, np.maximum(bits - 4, 0)))  # 8 steps per doubling
        padded = -(-lengths // step) * step
        return np.where(lengths <= self.max_tokens, np.minimum(padded, self.max_tokens), lengths)


def plan_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    seed: int | None = None,
    buckets: LengthBuckets | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Group pairs into batches of at most `max_tokens` padded tokens per side (EOS/BOS included).

    Returns `(order, bounds)`: batch `k` holds the pairs `order[bounds[k]:bounds[k + 1]]`. Ties between
    equal lengths are broken by a random permutation from `seed`, or by corpus order when `seed` is None.
    A pair that alone exceeds `max_tokens` gets a batch of its own. With `buckets`, lengths are counted
    padded to their bucket, and a batch cut short by a longer pair that would not fit keeps only as many
    pairs as that longer length's full batch holds (the rest start the next batch): batch sizes then come
    from the set `max_tokens // L` over the bucket lengths `L`, and only the epoch's last batch differs.
    """
    src = np.asarray(src_lengths, dtype=np.int64) + 1  # + EOS (source), + BOS/EOS (target in/out)
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    if buckets is not None:
        src, tgt = buckets.pad(src), buckets.pad(tgt)
    longer = np.maximum(src, tgt)
    ties = np.arange(len(src)) if seed is None else np.random.default_rng(seed).permutation(len(src))
    order = np.lexsort((ties, tgt, src, longer))
    # Along `order` the longer side never shrinks, so a batch's padded size on its wider side is
    # (pairs) × (longer side of its last pair): the greedy cut needs one binary search per batch.
    key = longer[order].tolist()
    bounds, i, n = [0], 0, len(key)
    while i < n:
        limit = min(n, i + max(1, max_tokens // key[i]))
        j = bisect.bisect_right(range(i, limit), 0, key=lambda k: int((k - i + 1) * key[k] > max_tokens))
        j = max(1, j)
        if (
            buckets is not None
            and i + j < n
            and j < max_tokens // key[i + j - 1]
            and key[i + j] <= max_tokens
        ):
            j = max(1, min(j, max_tokens // key[i + j]))  # cut short: the next length's full size
        i += j
        bounds.append(i)
    return order, np.asarray(bounds, dtype=np.int64)


def batch_shapes(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    order: np.ndarray,
    bounds: np.ndarray,
    buckets: LengthBuckets | None = None,
) -> tuple[np.ndarray, float]:
    """The `(pairs, source length, target length)` tensor shape of every batch of a plan, as
    [`collate_indices`][attnx.data.batching.collate_indices] pads it, and the share of padding among the
    tokens of those tensors (source and target inputs together)."""
    src = np.asarray(src_lengths, dtype=np.int64)[order] + 1
    tgt = np.asarray(tgt_lengths, dtype=np.int64)[order] + 1
    starts = bounds[:-1]
    sizes = np.diff(bounds)
    if len(sizes) == 0:
        return np.zeros((0, 3), dtype=np.int64), 0.0
    longest_src = np.maximum.reduceat(src, starts)
    longest_tgt = np.maximum.reduceat(tgt, starts)
    if buckets is not None:
        longest_src, longest_tgt = buckets.pad(longest_src), buckets.pad(longest_tgt)
    shapes = np.stack([sizes, longest_src, longest_tgt], axis=1)
    tokens = int((sizes * (longest_src + longest_tgt)).sum())
    return shapes, 1.0 - (int(src.sum()) + int(tgt.sum())) / tokens


def collate_indices(
    dataset: ParallelDataset, indices: np.ndarray, buckets: LengthBuckets | None = None
) -> Batch:
    """The [`Batch`][attnx.data.batch.Batch] of pairs `indices`, built with array operations (equal to
    `batch.collate`); with `buckets`, both sides padded further, to their bucket length."""
    indices = np.asarray(indices, dtype=np.int64)

    def side(ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, shift: int) -> tuple[np.ndarray, ...]:
        lens = np.asarray(lengths[indices], dtype=np.int64)
        starts = np.asarray(offsets[indices], dtype=np.int64)
        rows = np.repeat(np.arange(len(indices)), lens)
        cols = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        tokens = ids[np.repeat(starts, lens) + cols]
        width = int(lens.max(initial=0)) + 1
        if buckets is not None:
            width = int(buckets.pad(width))
        out = np.full((len(indices), width), PAD_ID, dtype=np.int64)
        out[rows, cols + shift] = tokens
        return out, rows, cols, tokens, lens

    src, *_ = side(dataset.src_ids, dataset.src_offsets, dataset.src_lengths, 0)
    tgt_out, rows, cols, tokens, tgt_lens = side(dataset.tgt_ids, dataset.tgt_offsets, dataset.tgt_lengths, 0)
    src_lens = np.asarray(dataset.src_lengths[indices], dtype=np.int64)
    batch = np.arange(len(indices))
    src[batch, src_lens] = EOS_ID
    tgt_out[batch, tgt_lens] = EOS_ID
    tgt_in = np.full_like(tgt_out, PAD_ID)
    tgt_in[:, 0] = BOS_ID
    tgt_in[rows, cols + 1] = tokens
    src_t, tgt_in_t, tgt_out_t = map(torch.from_numpy, (src, tgt_in, tgt_out))
    alignment = None
    if dataset.links is not None and dataset.link_offsets is not None:
        starts = np.asarray(dataset.link_offsets[indices], dtype=np.int64)
        counts = np.asarray(dataset.link_offsets[indices + 1], dtype=np.int64) - starts
        at = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        links = np.asarray(dataset.links[at], dtype=np.int64)  # (N, 2) source piece, target piece
        alignment = torch.from_numpy(
            np.stack([np.repeat(batch, counts), links[:, 1], links[:, 0]], axis=1)
        )  # (N, 3) batch row, target position, source position
    return Batch(
        src=src_t,
        tgt_in=tgt_in_t,
        tgt_out=tgt_out_t,
        src_mask=src_t != PAD_ID,
        tgt_mask=tgt_out_t != PAD_ID,
        n_src_tokens=int(src_lens.sum()) + len(indices),
        n_tgt_tokens=int(tgt_lens.sum()) + len(indices),
        index=torch.from_numpy(indices.copy()),
        alignment=alignment,
    )


class BatchDataset(Dataset):
    """Wraps a [`ParallelDataset`][attnx.data.corpus.ParallelDataset] so that indexing with an array of pair
    indices returns a [`Batch`][attnx.data.batch.Batch].

    Used with `DataLoader(..., sampler=TokenBatchSampler, batch_size=None)`: the whole batch is gathered and
    padded in one call (in a worker process when `num_workers > 0`), to the sampler's `buckets` if it has them.
    """

    def __init__(self, dataset: ParallelDataset, buckets: LengthBuckets | None = None) -> None:
        self.dataset = dataset
        self.buckets = buckets

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: np.ndarray) -> Batch:
        return collate_indices(self.dataset, indices, self.buckets)


def no_collate(batch: Batch) -> Batch:
    """`BatchDataset` already returns a finished batch."""
    return batch


class TokenBatchSampler(DistributedSampler):
    """Yields arrays of pair indices, one per batch, within a token budget; knows its epoch and position.

    Args:
        src_lengths: tokens of each source sentence (without EOS).
        tgt_lengths: tokens of each target sentence (without BOS/EOS).
        max_tokens: padded tokens per side and batch, EOS/BOS included.
        seed: seeds the tie-break between equal lengths and the batch order of each epoch.
        shuffle: visit the batches in a new seeded order each epoch (training); off, they come shortest
            first in a fixed order (evaluation).
        num_replicas: DDP world size; each rank gets every `num_replicas`-th batch of the epoch's order,
            the list padded by repeating batches from its start so that every rank has the same count.
        rank: this process's DDP rank.
        allow_oversized: let a pair longer than `max_tokens` form a batch of its own (evaluation: every
            pair must be scored); when False such a pair is an error (training: the budget is a promise).
        shape_buckets: 0: each batch is padded to its longest pair; N: to the
            [`LengthBuckets`][attnx.data.batching.LengthBuckets] of multiple N (the batches' loader must pad
            them the same way: `BatchDataset(dataset, sampler.buckets)`).
        max_positions: The positions the model reads (its `max_len`): buckets never pad a side past them.
            None: buckets stop at `max_tokens` only.

    It subclasses `DistributedSampler` so that Lightning, which wraps any other sampler in its own distributed
    sampler under DDP (`use_distributed_sampler`), leaves this one as it is: it shards itself.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        seed: int = 1,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        allow_oversized: bool = False,
        shape_buckets: int = 0,
        max_positions: int | None = None,
    ) -> None:
        if max_tokens < 2:
            raise DataError(f"max_tokens must be at least 2 (one token and EOS), not {max_tokens}")
        super().__init__(
            range(len(src_lengths)), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed
        )
        if not allow_oversized:
            longest = max(int(np.max(src_lengths, initial=0)), int(np.max(tgt_lengths, initial=0))) + 1
            if longest > max_tokens:
                over = int(
                    np.count_nonzero(
                        (np.asarray(src_lengths) >= max_tokens) | (np.asarray(tgt_lengths) >= max_tokens)
                    )
                )
                raise DataError(
                    f"{over} pair(s) are longer than max_tokens={max_tokens} (the longest needs {longest} with "
                    f"EOS); raise max_tokens to at least {longest} or prepare the corpus with --max_sentence_tokens "
                    f"{max_tokens - 1} or less"
                )
        self.max_tokens = max_tokens
        self.shape_buckets = shape_buckets
        widest = max_tokens if max_positions is None else min(max_tokens, max_positions)
        self.buckets = LengthBuckets(shape_buckets, widest) if shape_buckets else None
        self.order, self.bounds = self.plan(src_lengths, tgt_lengths, seed if shuffle else None)
        self.shapes, self.padding = batch_shapes(
            src_lengths, tgt_lengths, self.order, self.bounds, self.buckets
        )
        self.consumed = 0  # batches yielded so far in this epoch, on this rank
        self._resume: tuple[int, int] | None = None

    def plan(
        self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The batches, `(order, bounds)` of [`plan_batches`][attnx.data.batching.plan_batches]."""
        return plan_batches(src_lengths, tgt_lengths, self.max_tokens, seed, self.buckets)

    @property
    def num_batches(self) -> int:
        """Batches in one epoch over all ranks, before padding."""
        return len(self.bounds) - 1

    @property
    def num_shapes(self) -> int:
        """Distinct `(pairs, source length, target length)` tensor shapes among the epoch's batches."""
        return len(np.unique(self.shapes, axis=0))

    def summary(self) -> str:
        """One line on the epoch's batches: how many, in how many shapes, and their share of padding."""
        buckets = f"shape_buckets {self.shape_buckets}" if self.shape_buckets else "shape buckets off"
        return (
            f"batches: {self.num_batches:,} an epoch in {self.num_shapes:,} shapes (pairs x source x target "
            f"length; {buckets}), {self.padding:.1%} of their tokens padding"
        )

    def __len__(self) -> int:
        return math.ceil(self.num_batches / self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's batch order (Lightning calls this at the start of every training epoch)."""
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self.epoch = epoch

    def batch_order(self, epoch: int | None = None) -> np.ndarray:
        """The batch numbers this rank visits in `epoch` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        padded = np.resize(self.epoch_batches(epoch), len(self) * self.num_replicas)  # repeats from the start
        return padded[self.rank :: self.num_replicas]

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """The batch numbers of `epoch` over all ranks, in the order they are visited."""
        if self.shuffle:
            return np.random.default_rng((self.seed, epoch)).permutation(self.num_batches)
        return np.arange(self.num_batches)

    def __iter__(self) -> Iterator[np.ndarray]:
        start = self._resume[1] if self._resume is not None else 0
        self._resume = None
        batches = self.batch_order()
        self.consumed = start
        for k in batches[start:]:
            self.consumed += 1
            yield self.order[self.bounds[k] : self.bounds[k + 1]]

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Position in the epoch: `consumed` batches (default: those yielded) of epoch `self.epoch`."""
        return {
            "epoch": self.epoch,
            "consumed": self.consumed if consumed is None else consumed,
            **self.plan_key(),
        }

    PLAN_NAMES = {"seed": "seed", "num_batches": "batches", "num_replicas": "world size"}

    def plan_key(self) -> dict[str, Any]:
        """What a position in an epoch is only valid for: the seed, the batches, the world size, the buckets."""
        return {
            "seed": self.seed,
            "num_batches": self.num_batches,
            "num_replicas": self.num_replicas,
            "shape_buckets": self.shape_buckets,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`: the next epoch iterated is `state["epoch"]`, from its next batch."""
        ours = self.plan_key()
        theirs = {key: state.get(key, 0 if key == "shape_buckets" else None) for key in ours}
        self.epoch = int(state["epoch"])
        if theirs != ours:
            names = "/".join(self.PLAN_NAMES.get(key, key.replace("_", " ")) for key in ours)
            warnings.warn(
                f"the batch plan differs from the checkpoint's ({names} {'/'.join(map(str, theirs.values()))} "
                f"there, {'/'.join(map(str, ours.values()))} here): epoch {self.epoch} restarts from its first "
                "batch; resume with the same corpus, max_tokens, seed, shape buckets, corpus mix and number of "
                "devices to continue exactly",
                stacklevel=2,
            )
            return
        self._resume = (self.epoch, int(state["consumed"]))
        self.consumed = int(state["consumed"])
