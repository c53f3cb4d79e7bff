"""Subword sampling on the training side (config `data.subword_sampling`): each epoch sees every training pair
cut into pieces anew — BPE-dropout for attnx's BPE models (Provilkov et al., 2020), subword regularization for
unigram models (Kudo, 2018) — as Marian's `--sentencepiece-alphas` and Eole's sentencepiece transform do.

The batches stay the ones [`TokenBatchSampler`][attnx.data.batching.TokenBatchSampler] planned from the prepared
segmentation, in the same tensor shapes: a pair's side is re-encoded from its text (its prepared ids decoded) with
SentencePiece's sampling, and keeps its prepared ids where the sampled ones would not fit the batch's padded
length (its shape bucket, or with buckets off the token budget `max_tokens` over the batch's pairs) or the
positions the model reads (its `max_len`). Validation, test and predict keep the prepared, deterministic
segmentation.

The sampling of a batch is seeded by (data seed, epoch, the batch's first pair) and, for a batch drawn again
in the same epoch (a corpus mix upsamples a small corpus, `data.corpus_weights`; DDP's padding repeats
batches), the number of its earlier draws: every draw is segmented anew, and a run resumed mid-epoch (in a
new process), or loading in worker processes, draws exactly the segmentations the uninterrupted run drew. BPE
models are sampled by [`dropout`][attnx.data.dropout] (SentencePiece's BPE sampling differs between processes
for one seed); unigram models by SentencePiece.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import sentencepiece as spm
import torch

from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from attnx.data.batching import BatchDataset, LengthBuckets, TokenBatchSampler
from attnx.data.corpus import ParallelDataset
from attnx.data.dropout import MergeTable, dropout_ids
from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError

_SEED_LOCK = threading.Lock()  # SentencePiece's seed is one global of the process


@dataclass(frozen=True)
class SubwordSampling:
    """How training pairs are segmented anew each epoch.

    Args:
        alpha: 0 (the default): no sampling, the prepared segmentation. For a BPE model (what `attnx prepare`
            trains) the probability that a merge is dropped, in (0, 1) (BPE-dropout; 0.1 in its paper); for a
            unigram model the smoothing of the sampling distribution, > 0 (0.1 to 0.5 are usual).
        nbest_size: Unigram models only: sample from the `nbest_size` best segmentations, or from all of them
            with -1 (the default). BPE-dropout has no n-best list.
    """

    alpha: float = 0.0
    nbest_size: int = -1

    def __post_init__(self) -> None:
        if not self.alpha >= 0:  # negative, or NaN
            raise ConfigError(f"data.subword_sampling.alpha must be >= 0 (0: off), got {self.alpha}")
        if self.nbest_size in (0, 1) or self.nbest_size < -1:
            raise ConfigError(
                "data.subword_sampling.nbest_size must be -1 (every segmentation) or at least 2 (the n best), "
                f"got {self.nbest_size}"
            )

    @property
    def enabled(self) -> bool:
        return self.alpha > 0

    def check(self, tokenizer: Tokenizer) -> str:
        """Refuse settings the SentencePiece model cannot sample with; the one line `attnx fit` prints."""
        bpe = _is_bpe(tokenizer)
        if bpe and self.alpha >= 1.0:
            raise ConfigError(
                f"data.subword_sampling.alpha {self.alpha} drops every merge of the BPE model (characters "
                "only); give a dropout probability below 1, e.g. 0.1"
            )
        if bpe:
            ignored = f"; nbest_size {self.nbest_size} ignored (BPE)" if self.nbest_size != -1 else ""
            return f"subword sampling: BPE-dropout {self.alpha} on the training pairs, each epoch{ignored}"
        return (
            f"subword sampling: unigram alpha {self.alpha}, nbest_size {self.nbest_size} on the training pairs, "
            "each epoch"
        )


NO_SAMPLING = SubwordSampling()
"""The default: the prepared segmentation (copied, never modified)."""


def _is_bpe(tokenizer: Tokenizer) -> bool:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.to_bytes())
    return proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE


HEADROOM_PAIRS = 1000
"""Training pairs whose sampled lengths set the batches' headroom ([`headroom`][attnx.data.sampling.headroom])."""

HEADROOM_QUANTILE = 0.95
"""The share of those pairs whose sampled pieces fit the headroom planned for them."""


def headroom(
    dataset: ParallelDataset, tokenizer_bytes: bytes, sampling: SubwordSampling, seed: int
) -> tuple[float, float]:
    """How much longer than the prepared segmentation the sampled one is, per side: the
    [`HEADROOM_QUANTILE`][attnx.data.sampling.HEADROOM_QUANTILE] of the ratio over
    [`HEADROOM_PAIRS`][attnx.data.sampling.HEADROOM_PAIRS] seeded pairs. The batches are planned for lengths
    this much longer, so that sampled pairs fit the token budget and their shape (sampling splits words into
    more pieces: a plan of the prepared lengths would leave most of them no room)."""
    n = len(dataset)
    picked = np.random.default_rng((seed, 0x5A11)).permutation(n)[: min(n, HEADROOM_PAIRS)]
    batches = SampledBatches(dataset, tokenizer_bytes, sampling, seed, max_tokens=0)
    factors = []
    for side, (ids, offsets, lengths) in enumerate(
        [
            (dataset.src_ids, dataset.src_offsets, dataset.src_lengths),
            (dataset.tgt_ids, dataset.tgt_offsets, dataset.tgt_lengths),
        ]
    ):
        lens = np.asarray(lengths[picked], dtype=np.int64)
        prepared = [ids[offsets[i] : offsets[i] + k].tolist() for i, k in zip(picked, lens, strict=True)]
        sampled = batches._sample(prepared, (seed, -1, side))
        ratios = np.array([(len(x) + 1) / (k + 1) for x, k in zip(sampled, lens, strict=True)])
        factors.append(max(1.0, float(np.quantile(ratios, HEADROOM_QUANTILE))) if len(ratios) else 1.0)
    return factors[0], factors[1]


def planned_lengths(
    lengths: np.ndarray, factor: float, max_tokens: int, max_positions: int | None = None
) -> np.ndarray:
    """`lengths` (without EOS/BOS) grown by `factor` with their EOS/BOS, within `max_tokens` and the model's
    `max_positions` (None: no limit but `max_tokens`), but never below themselves: the lengths a batch is
    planned for."""
    lengths = np.asarray(lengths, dtype=np.int64)
    grown = np.ceil((lengths + 1) * factor).astype(np.int64) - 1
    return np.maximum(lengths, np.minimum(grown, width_limit(max_tokens, max_positions) - 1))


def width_limit(max_tokens: int, max_positions: int | None) -> int:
    """The widest side a sampled batch may have (EOS/BOS included): `max_tokens`, and the model's positions."""
    return max_tokens if max_positions is None else min(max_tokens, max_positions)


def repeated_draws(batches: np.ndarray) -> np.ndarray:
    """For each of `batches` (batch numbers in the order an epoch visits them), how many times it came before:
    0 at its first draw."""
    batches = np.asarray(batches, dtype=np.int64)
    order = np.argsort(batches, kind="stable")
    ranked = batches[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, len(ranked)]))
    repeats = np.empty(len(batches), dtype=np.int64)
    repeats[order] = np.arange(len(batches)) - first
    return repeats


class EpochBatchSampler(TokenBatchSampler):
    """A [`TokenBatchSampler`][attnx.data.batching.TokenBatchSampler] whose batches carry their epoch and how
    many times the epoch drew them before: `(epoch, indices, repeat)`, what
    [`SampledBatches`][attnx.data.sampling.SampledBatches] seeds its sampling with."""

    sampling_line = ""
    """What the sampling does ([`SubwordSampling.check`][attnx.data.sampling.SubwordSampling.check]), said after
    the batches' summary."""

    def summary(self) -> str:
        return f"{super().summary()}\n{self.sampling_line}" if self.sampling_line else super().summary()

    def repeats(self, epoch: int) -> np.ndarray:
        """For each batch this rank visits in `epoch`, how many times the epoch drew it before, over all ranks
        in the order they take them ([`batch_order`][attnx.data.batching.TokenBatchSampler.batch_order]): a
        function of (seed, epoch), so that a resumed run and every rank count alike."""
        padded = np.resize(self.epoch_batches(epoch), len(self) * self.num_replicas)
        return repeated_draws(padded)[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, int]]:  # type: ignore[override]
        epoch = self.epoch
        repeats = self.repeats(epoch)
        for indices in super().__iter__():
            yield epoch, indices, int(repeats[self.consumed - 1])  # `consumed`: this batch's place, from 1


class SampledBatches(BatchDataset):
    """Training batches of a [`ParallelDataset`][attnx.data.corpus.ParallelDataset], each side re-segmented
    with SentencePiece's sampling, in the shape the prepared segmentation gives them."""

    def __init__(
        self,
        dataset: ParallelDataset,
        tokenizer_bytes: bytes,
        sampling: SubwordSampling,
        seed: int,
        max_tokens: int,
        buckets: LengthBuckets | None = None,
        factors: tuple[float, float] = (1.0, 1.0),
        max_positions: int | None = None,
    ) -> None:
        super().__init__(dataset, buckets)
        self.factors = factors  # the headroom the batches were planned with, per side
        self.tokenizer_bytes = tokenizer_bytes  # a processor is rebuilt in each worker: it does not pickle
        self.sampling = sampling
        self.seed = seed
        self.max_tokens = max_tokens
        self.max_positions = max_positions
        """The positions the model reads (its `max_len`): no sampled side is longer. None: no limit."""
        self._sp: spm.SentencePieceProcessor | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_sp": None}
        state.pop("merges", None)  # rebuilt in each worker
        return state

    @property
    def sp(self) -> spm.SentencePieceProcessor:
        if self._sp is None:
            self._sp = spm.SentencePieceProcessor(model_proto=self.tokenizer_bytes)
        return self._sp

    def _width(self, lengths: np.ndarray, factor: float) -> int:
        """The padded length the batch was planned for on a side (EOS/BOS included), and with buckets off
        what the token budget allows beyond it; never more than the model's positions (where the prepared
        pieces fit them)."""
        width = int(planned_lengths(lengths, factor, self.max_tokens, self.max_positions).max(initial=0)) + 1
        if self.buckets is not None:
            return int(self.buckets.pad(width))
        room = self.max_tokens // max(len(lengths), 1)
        return max(width, min(room, width_limit(self.max_tokens, self.max_positions)))

    @cached_property
    def merges(self) -> MergeTable | None:
        """The BPE model's merges (None for a unigram model), built once per process."""
        return MergeTable(self.sp) if _is_bpe(Tokenizer(self.sp)) else None

    def _sample(self, prepared: list[list[int]], key: tuple[int, ...]) -> list[list[int]]:
        """Sampled ids of `prepared` segmentations drawn from `key` alone: BPE-dropout by attnx's own merges
        ([`dropout`][attnx.data.dropout], the same in every process); a unigram model's draws by SentencePiece
        in a new thread (it seeds a thread's generator from its global seed at the thread's first draw)."""
        if self.merges is not None:
            return dropout_ids(self.merges, prepared, self.sampling.alpha, (hash(key) % 2**63,))
        texts = self.sp.decode(prepared)
        out: list[list[list[int]]] = []
        sp, sampling = self.sp, self.sampling

        def draw() -> None:
            out.append(
                sp.encode(
                    texts,
                    out_type=int,
                    enable_sampling=True,
                    alpha=sampling.alpha,
                    nbest_size=sampling.nbest_size,
                    num_threads=1,
                )
            )

        with _SEED_LOCK:
            # 2**32 - 1 is SentencePiece's "no seed" value
            spm.set_random_generator_seed(hash(key) % (2**32 - 1))
            thread = threading.Thread(target=draw)
            thread.start()
            thread.join()
        return out[0]

    def _side(self, ids, offsets, lengths, indices: np.ndarray, key: tuple[int, ...], factor: float):
        lens = np.asarray(lengths[indices], dtype=np.int64)
        prepared = [np.asarray(ids[offsets[i] : offsets[i] + n]) for i, n in zip(indices, lens, strict=True)]
        sampled = self._sample([p.tolist() for p in prepared], key)
        width = self._width(lens, factor)
        # a side whose sampled pieces outgrow the batch's shape keeps its prepared ids
        return [
            s if len(s) + 1 <= width else p.tolist() for s, p in zip(sampled, prepared, strict=True)
        ], width

    def __getitem__(self, item: tuple[int, np.ndarray, int]) -> Batch:  # type: ignore[override]
        """The batch of `(epoch, indices, repeat)`
        ([`EpochBatchSampler`][attnx.data.sampling.EpochBatchSampler]; `(epoch, indices)`: its first draw of
        the epoch)."""
        epoch, indices, *repeat = item
        indices = np.asarray(indices, dtype=np.int64)
        data = self.dataset
        key = (self.seed, epoch, int(indices[0]) if len(indices) else -1)
        if repeat and repeat[0]:  # drawn again this epoch: another segmentation (a first draw keeps its key)
            key = (*key, int(repeat[0]))
        src_factor, tgt_factor = self.factors
        src, src_width = self._side(
            data.src_ids, data.src_offsets, data.src_lengths, indices, (*key, 0), src_factor
        )
        tgt, tgt_width = self._side(
            data.tgt_ids, data.tgt_offsets, data.tgt_lengths, indices, (*key, 1), tgt_factor
        )
        if self.buckets is None:  # padded to the longest pair, as the prepared batches are
            src_width = max(len(s) for s in src) + 1
            tgt_width = max(len(t) for t in tgt) + 1
        return pad_pairs(src, tgt, src_width, tgt_width, indices)


def pad_pairs(
    src: list[list[int]], tgt: list[list[int]], src_width: int, tgt_width: int, indices: np.ndarray
) -> Batch:
    """The [`Batch`][attnx.data.batch.Batch] of id lists (without BOS/EOS) padded to the given widths."""
    n = len(src)
    src_t = torch.full((n, src_width), PAD_ID, dtype=torch.long)  # (B, S)
    tgt_in = torch.full((n, tgt_width), PAD_ID, dtype=torch.long)  # (B, T)
    tgt_out = torch.full((n, tgt_width), PAD_ID, dtype=torch.long)  # (B, T)
    for row, (x, y) in enumerate(zip(src, tgt, strict=True)):
        src_t[row, : len(x)] = torch.tensor(x, dtype=torch.long)
        src_t[row, len(x)] = EOS_ID
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : len(y) + 1] = torch.tensor(y, dtype=torch.long)
        tgt_out[row, : len(y)] = torch.tensor(y, dtype=torch.long)
        tgt_out[row, len(y)] = EOS_ID
    return Batch(
        src=src_t,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        src_mask=src_t != PAD_ID,
        tgt_mask=tgt_out != PAD_ID,
        n_src_tokens=sum(len(x) for x in src) + n,
        n_tgt_tokens=sum(len(y) for y in tgt) + n,
        index=torch.from_numpy(indices.copy()),
    )
