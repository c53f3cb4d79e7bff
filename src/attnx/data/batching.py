"""Token-budget batching (§5.1: "sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens").

Pairs are sorted by their longer side (then source length, then a seeded random tie-break), and cut greedily into
batches whose padded size stays within `max_tokens` on both sides. The batches are fixed for a seed; each epoch
visits them in a new seeded order (fairseq does the same), so every epoch has the same number of batches, which
Lightning's progress, resuming and DDP all rely on.
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


def plan_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Group pairs into batches of at most `max_tokens` padded tokens per side (EOS/BOS included).

    Returns `(order, bounds)`: batch `k` holds the pairs `order[bounds[k]:bounds[k + 1]]`. Ties between
    equal lengths are broken by a random permutation from `seed`, or by corpus order when `seed` is None.
    A pair that alone exceeds `max_tokens` gets a batch of its own.
    """
    src = np.asarray(src_lengths, dtype=np.int64) + 1  # + EOS (source), + BOS/EOS (target in/out)
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    longer = np.maximum(src, tgt)
    ties = np.arange(len(src)) if seed is None else np.random.default_rng(seed).permutation(len(src))
    order = np.lexsort((ties, src, longer))
    # Along `order` the longer side never shrinks, so a batch's padded size on its wider side is
    # (pairs) × (longer side of its last pair): the greedy cut needs one binary search per batch.
    key = longer[order].tolist()
    bounds, i, n = [0], 0, len(key)
    while i < n:
        limit = min(n, i + max(1, max_tokens // key[i]))
        j = bisect.bisect_right(range(i, limit), 0, key=lambda k: int((k - i + 1) * key[k] > max_tokens))
        i += max(1, j)
        bounds.append(i)
    return order, np.asarray(bounds, dtype=np.int64)


def collate_indices(dataset: ParallelDataset, indices: np.ndarray) -> Batch:
    """The [`Batch`][attnx.data.batch.Batch] of pairs `indices`, built with array operations (equal to
    `batch.collate`)."""
    indices = np.asarray(indices, dtype=np.int64)

    def side(ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, shift: int) -> tuple[np.ndarray, ...]:
        lens = np.asarray(lengths[indices], dtype=np.int64)
        starts = np.asarray(offsets[indices], dtype=np.int64)
        rows = np.repeat(np.arange(len(indices)), lens)
        cols = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        tokens = ids[np.repeat(starts, lens) + cols]
        out = np.full((len(indices), int(lens.max(initial=0)) + 1), PAD_ID, dtype=np.int64)
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
    return Batch(
        src=src_t,
        tgt_in=tgt_in_t,
        tgt_out=tgt_out_t,
        src_mask=src_t != PAD_ID,
        tgt_mask=tgt_out_t != PAD_ID,
        n_src_tokens=int(src_lens.sum()) + len(indices),
        n_tgt_tokens=int(tgt_lens.sum()) + len(indices),
        index=torch.from_numpy(indices.copy()),
    )


class BatchDataset(Dataset):
    """Wraps a [`ParallelDataset`][attnx.data.corpus.ParallelDataset] so that indexing with an array of pair
    indices returns a [`Batch`][attnx.data.batch.Batch].

    Used with `DataLoader(..., sampler=TokenBatchSampler, batch_size=None)`: the whole batch is gathered and
    padded in one call (in a worker process when `num_workers > 0`).
    """

    def __init__(self, dataset: ParallelDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: np.ndarray) -> Batch:
        return collate_indices(self.dataset, indices)


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
        self.order, self.bounds = plan_batches(
            src_lengths, tgt_lengths, max_tokens, seed if shuffle else None
        )
        self.consumed = 0  # batches yielded so far in this epoch, on this rank
        self._resume: tuple[int, int] | None = None

    @property
    def num_batches(self) -> int:
        """Batches in one epoch over all ranks, before padding."""
        return len(self.bounds) - 1

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
        if self.shuffle:
            order = np.random.default_rng((self.seed, epoch)).permutation(self.num_batches)
        else:
            order = np.arange(self.num_batches)
        padded = np.resize(order, len(self) * self.num_replicas)  # repeats from the start
        return padded[self.rank :: self.num_replicas]

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
            "seed": self.seed,
            "num_batches": self.num_batches,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`: the next epoch iterated is `state["epoch"]`, from its next batch."""
        same_plan = (state.get("seed"), state.get("num_batches"), state.get("num_replicas")) == (
            self.seed,
            self.num_batches,
            self.num_replicas,
        )
        self.epoch = int(state["epoch"])
        if not same_plan:
            warnings.warn(
                "the batch plan differs from the checkpoint's (seed/batches/world size "
                f"{state.get('seed')}/{state.get('num_batches')}/{state.get('num_replicas')} there, "
                f"{self.seed}/{self.num_batches}/{self.num_replicas} here): epoch {self.epoch} restarts from its "
                "first batch; resume with the same corpus, max_tokens, seed and number of devices to continue exactly",
                stacklevel=2,
            )
            return
        self._resume = (self.epoch, int(state["consumed"]))
        self.consumed = int(state["consumed"])
