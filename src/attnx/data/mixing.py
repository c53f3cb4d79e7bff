"""Weighted training corpora (config `data.corpus_weights`, `data.sampling_temperature`): the corpora that
`attnx prepare --train NAME=PREFIX ...` put into one training split, drawn in the mix asked for, as fairseq's
`--sampling-weights`, Eole's per-corpus `weight` and the temperature sampling of multilingual NMT do.

The asked share of corpus i, in training pairs, is p_i ∝ w_i · (n_i / N)^(1/T): w_i its weight (1 without
`corpus_weights`), n_i its pairs, T the temperature (without `sampling_temperature` the factor is left out, so
the weights alone are the shares). T = 1 keeps the corpora's natural proportions (times the weights), larger T
flattens them toward equal shares.

Batches keep their plan: each corpus is cut into token-budget batches of its own (length-sorted, in shape
buckets, as [`TokenBatchSampler`][attnx.data.batching.TokenBatchSampler] cuts a whole split), so no batch mixes
two corpora. An epoch has as many batches as one pass over the corpora that take part (weight > 0); they are
drawn from each corpus in the number that gives it its share of pairs, and shuffled together. A corpus drawn
more often than it has batches is passed over several times, each pass in a new seeded order; one drawn less
often continues its pass in the next epoch, so every batch of it comes before any comes twice. Which batches an
epoch holds and in what order is a function of (seed, epoch) alone: a run resumed mid-epoch draws exactly the
batches the uninterrupted run drew, and DDP ranks split each epoch as they do without weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from attnx.data.batching import TokenBatchSampler, plan_batches
from attnx.data.corpus import META, PreparedCorpus
from attnx.data.errors import DataError
from attnx.data.sampling import EpochBatchSampler
from attnx.errors import ConfigError

WEIGHTS = "data.corpus_weights"
TEMPERATURE = "data.sampling_temperature"


@dataclass(frozen=True)
class TrainingCorpus:
    """One named corpus of a training split: its pairs are rows `[start, stop)` of the split."""

    name: str
    start: int
    stop: int

    @property
    def pairs(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class CorpusMix:
    """The training corpora and the share of training pairs asked of each (0: left out)."""

    corpora: tuple[TrainingCorpus, ...]
    shares: tuple[float, ...]
    asked: str
    """The options that asked for it, as the start line quotes them."""

    def corpus_of(self, row: int) -> int:
        """The number of the corpus holding row `row` of the training split."""
        return int(np.searchsorted([c.stop for c in self.corpora], row, side="right"))


def training_corpora(corpus: PreparedCorpus, split: str) -> list[TrainingCorpus]:
    """The named corpora of `split` in the order prepare wrote them (one for a single-corpus split). A corpus
    prepared before the rows were recorded has them implied: each corpus's pairs (times its repeat) follow the
    previous corpus's."""
    info = corpus.meta["splits"][split]
    entries: dict[str, Any] = info.get("corpora") or {}
    if len(entries) <= 1:
        return [TrainingCorpus(next(iter(entries), split), 0, int(info["pairs"]))]
    found, end = [], 0
    for name, entry in entries.items():
        rows = entry.get("rows") or [end, end + int(entry["pairs"]) * int(entry.get("repeat", 1))]
        found.append(TrainingCorpus(name, int(rows[0]), int(rows[1])))
        end = int(rows[1])
    if found[0].start != 0 or any(a.stop != b.start for a, b in pairwise(found)) or end != info["pairs"]:
        raise DataError(
            f"{corpus.data_dir / META}: the rows of the training corpora do not cover the {info['pairs']:,} pairs "
            f"of split {split!r}; run `attnx prepare` again into {corpus.data_dir}"
        )
    return found


def corpus_mix(
    corpus: PreparedCorpus, split: str, weights: dict[str, float] | None, temperature: float | None
) -> CorpusMix | None:
    """The mix that `corpus_weights` and `sampling_temperature` ask of `split`'s corpora (None: neither is
    given); a value that cannot work is one [ConfigError][attnx.errors.ConfigError] naming the option."""
    if weights is None and temperature is None:
        return None
    if temperature is not None and not (temperature > 0 and math.isfinite(temperature)):
        raise ConfigError(
            f"{TEMPERATURE} must be a number > 0 (1: the corpora's own proportions; larger: flatter, toward "
            f"equal shares), got {temperature}"
        )
    corpora = training_corpora(corpus, split)
    names = [c.name for c in corpora]
    where = corpus.data_dir
    if len(corpora) == 1:
        option = WEIGHTS if weights is not None else TEMPERATURE
        raise ConfigError(
            f"{option} is given, but {where} holds one training corpus ({names[0]}): prepare several named "
            f"corpora into one folder (attnx prepare --train NAME=PREFIX --train NAME=PREFIX ...), or leave out "
            f"{option}"
        )
    w = np.ones(len(corpora))
    if weights is not None:
        w = np.array([_weight(weights, names, name, where) for name in names])
        if not w.any():
            raise ConfigError(f"{WEIGHTS} are all 0: give at least one training corpus a weight above 0")
    empty = [c.name for c, wi in zip(corpora, w, strict=True) if wi > 0 and c.pairs == 0]
    if empty:
        raise ConfigError(
            f"{WEIGHTS}: corpus {empty[0]!r} of {where} has no training pair left after cleaning; give it weight 0"
        )
    if temperature is not None:
        sizes = np.array([c.pairs for c in corpora], dtype=np.float64)
        w = tempered(w, sizes, temperature)
    shares = w / w.max()  # weights near the largest float sum without overflowing (1e308 + 1e308)
    shares = shares / shares.sum()
    said = (
        [] if weights is None else [f"{WEIGHTS} {{{', '.join(f'{n}: {v:g}' for n, v in weights.items())}}}"]
    )
    said += [] if temperature is None else [f"{TEMPERATURE} {temperature:g}"]
    asked = " and ".join(said)
    return CorpusMix(tuple(corpora), tuple(shares.tolist()), asked)


def tempered(weights: np.ndarray, sizes: np.ndarray, temperature: float) -> np.ndarray:
    """`w_i · (n_i / N)^(1/T)` up to a common factor, for the corpora of weight `w_i > 0` (0 for the others),
    computed in log space: the largest such corpus's size divides the others' before the power, so it keeps a
    share of 1 whatever the temperature, and one near 0 (1e-300) gives it the whole mix, as the limit does,
    instead of every share underflowing to 0 (and none of them being a number after the division)."""
    part = weights > 0
    with np.errstate(divide="ignore", over="ignore"):  # a far smaller corpus's share underflows to 0
        logs = np.log(sizes[part]) - np.log(sizes[part].max())  # <= 0, 0 for the largest corpus taking part
        logits = np.log(weights[part]) + np.where(logs < 0, logs / temperature, 0.0)
    shares = np.zeros_like(weights)
    shares[part] = np.exp(logits - logits.max())
    return shares


def _weight(weights: dict[str, float], names: list[str], name: str, where: Any) -> float:
    unknown = next((n for n in weights if n not in names), None)
    if unknown is not None:
        raise ConfigError(
            f"{WEIGHTS} names {unknown!r}, which is not a training corpus of {where}; its corpora are "
            f"{', '.join(names)}"
        )
    if name not in weights:
        missing = [n for n in names if n not in weights]
        raise ConfigError(
            f"{WEIGHTS} has no weight for {', '.join(missing)}: give one for each training corpus of {where} "
            f"({', '.join(names)}; 0 leaves a corpus out)"
        )
    value = float(weights[name])
    if not (value >= 0 and math.isfinite(value)):
        raise ConfigError(
            f"{WEIGHTS}.{name} is {weights[name]}: a weight is a number >= 0 (0 leaves the corpus out)"
        )
    return value


def epoch_draws(shares: np.ndarray, pairs: np.ndarray, batches: np.ndarray) -> np.ndarray:
    """Batches drawn from each corpus an epoch: as many in all as the corpora taking part have, each corpus's
    number in proportion to its share over its pairs per batch (so its share of pairs is the one asked), at
    least one for a corpus taking part; largest remainders round."""
    used = shares > 0
    total = int(batches[used].sum())
    per_pair = np.where(used, shares * batches / np.maximum(pairs, 1), 0.0)
    exact = total * per_pair / per_pair.sum()
    draws = np.floor(exact).astype(np.int64)
    draws[np.argsort(draws - exact, kind="stable")[: total - int(draws.sum())]] += 1
    return np.where(used, np.maximum(draws, 1), 0)


class MixedBatchSampler(TokenBatchSampler):
    """A [`TokenBatchSampler`][attnx.data.batching.TokenBatchSampler] whose epochs draw each corpus's batches
    in the shares of a [`CorpusMix`][attnx.data.mixing.CorpusMix] (see the module's description)."""

    def __init__(
        self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, mix: CorpusMix, **kwargs: Any
    ) -> None:
        self.mix = mix
        super().__init__(src_lengths, tgt_lengths, max_tokens, **kwargs)
        pairs = np.array([c.pairs for c in mix.corpora])
        self.draws = epoch_draws(np.array(mix.shares), pairs, self.planned)
        pairs_drawn = self.draws * pairs / np.maximum(self.planned, 1)
        self.expected = pairs_drawn / pairs_drawn.sum()
        """Each corpus's expected share of the pairs of an epoch, after rounding to whole batches."""

    def plan(
        self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each corpus's own batches, one corpus after another; `self.first[i]` is corpus i's first batch."""
        orders, bounds, first = [], [np.zeros(1, np.int64)], [0]
        for c in self.mix.corpora:
            order, cuts = plan_batches(
                src_lengths[c.start : c.stop],
                tgt_lengths[c.start : c.stop],
                self.max_tokens,
                seed,
                self.buckets,
            )
            orders.append(order + c.start)
            bounds.append(cuts[1:] + bounds[-1][-1])
            first.append(first[-1] + len(cuts) - 1)
        self.first = np.asarray(first, dtype=np.int64)
        self.planned = np.diff(self.first)  # batches of each corpus
        return np.concatenate(orders), np.concatenate(bounds)

    @property
    def num_batches(self) -> int:
        """Batches in one epoch over all ranks, before padding: one pass over the corpora taking part."""
        return int(self.draws.sum())

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """The batch numbers of `epoch`: draw `t` of corpus i is its `(epoch · draws_i + t)`-th draw of the run,
        taken from its pass `draw // batches_i`, a seeded order of its batches."""
        corpora = np.repeat(np.arange(len(self.draws)), self.draws)
        slots = np.random.default_rng((self.seed, epoch)).permutation(corpora)
        batches = np.empty(len(slots), dtype=np.int64)
        for i, (k, n) in enumerate(zip(self.draws.tolist(), self.planned.tolist(), strict=True)):
            if not k:
                continue
            passes, at = np.divmod(epoch * k + np.arange(k), n)
            picked = np.empty(k, dtype=np.int64)
            for p in np.unique(passes).tolist():
                mine = passes == p
                picked[mine] = np.random.default_rng((self.seed, i, p)).permutation(n)[at[mine]]
            batches[slots == i] = self.first[i] + picked
        return batches

    def plan_key(self) -> dict[str, Any]:
        names = (c.name for c in self.mix.corpora)
        draws = {name: int(k) for name, k in zip(names, self.draws, strict=True)}
        return {**super().plan_key(), "corpus_draws": draws}

    def summary(self) -> str:
        return "\n".join([super().summary(), *self.mix_lines()])

    def mix_lines(self) -> list[str]:
        """What `attnx fit` says at its start: the asked and the expected mix, and the corpora left out."""
        taking = [i for i, share in enumerate(self.mix.shares) if share > 0]
        names = [self.mix.corpora[i].name for i in taking]
        asked = ", ".join(f"{n} {self.mix.shares[i]:.1%}" for n, i in zip(names, taking, strict=True))
        expected = ", ".join(f"{n} {self.expected[i]:.1%}" for n, i in zip(names, taking, strict=True))
        draws = " + ".join(f"{self.draws[i]:,} of {self.planned[i]:,}" for i in taking)
        lines = [
            f"corpus mix ({self.mix.asked}): asked {asked} of the training pairs; expected {expected} (batches "
            f"drawn an epoch: {draws} planned)"
        ]
        left = [c.name for c, share in zip(self.mix.corpora, self.mix.shares, strict=True) if share == 0]
        if left:
            lines.append(f"corpus mix: {', '.join(left)} left out (weight 0): no batch of it is drawn")
        return lines


class MixedEpochBatchSampler(EpochBatchSampler, MixedBatchSampler):
    """A [`MixedBatchSampler`][attnx.data.mixing.MixedBatchSampler] whose batches carry their epoch, for subword
    sampling ([`EpochBatchSampler`][attnx.data.sampling.EpochBatchSampler])."""
