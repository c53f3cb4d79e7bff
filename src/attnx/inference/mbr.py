"""Minimum Bayes risk (MBR) decoding: of `N` candidate translations, the one with the highest expected utility
against the others (Kumar & Byrne 2004; Eikema & Aziz 2020; Freitag et al. 2022).

The candidates are drawn by the search ([`candidate_search`][attnx.inference.mbr.candidate_search]): `N`
samples (`mbr_candidates="sample"`, shaped by `temperature`, `top_k`, `top_p`), `N` epsilon samples
(`"epsilon"`, Hewitt et al. 2022: tokens of probability below `epsilon` are never drawn) or the `N`-best list of
a beam search (`"nbest"`). The same `N` candidates are also the pseudo-references: the expected utility of a
distinct candidate `h` is

    E[u(h)] = 1/N * sum over the N candidates r of u(h, r)

(a candidate drawn twice counts twice as a reference, and `h` is compared with itself too, as the `mbrs`
library does), with `u` sacreBLEU's sentence chrF (`mbr_utility="chrf"`, `CHRF()`: character 6-grams, β 2) or
sentence BLEU (`"bleu"`, `BLEU(effective_order=True)`: 13a tokens, exponential smoothing), both on the
detokenized text, scaled 0-100.

**Fast pairwise utilities.** sacreBLEU scores one pair at a time from two `Counter`s; `N` candidates need
`N²` such calls. Here every candidate's n-grams are counted once ([`ngram_counts`][attnx.inference.mbr.ngram_counts]:
per order, the counts of the n-grams two candidates or more share, as a sparse matrix `C`), and the matched
counts of all pairs, `sum_g min(C[h, g], C[r, g])`, are matrix products of 0/1 blocks of `C`
([`matched`][attnx.inference.mbr.matched]); the statistics then go through the same formula as sacreBLEU's,
vectorized over the pairs, so the utilities equal sacreBLEU's (tests/inference/test_mbr.py checks them on
Multi30k sentences).

**Memory and time.** The table of `N` candidates takes about `N² *` [`BYTES_PER_PAIR`][attnx.inference.mbr.BYTES_PER_PAIR]
bytes at its peak; a translator refuses an `mbr` whose table would not fit the memory available
([`check_memory`][attnx.inference.mbr.check_memory], one line with the estimate and the largest `mbr` that
fits), and a table that takes more than a few seconds shows its progress on stderr. Nothing here needs Lightning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.hypothesis import Hypothesis

__all__ = [
    "bleu_matrix",
    "candidate_search",
    "check_memory",
    "chrf_matrix",
    "expected_utilities",
    "ngram_counts",
    "rank_by_expected_utility",
    "rerank",
]

CHRF_CHAR_ORDER = 6
"""sacreBLEU's chrF: character n-grams of order 1 to 6 (whitespace removed) ..."""
CHRF_BETA = 2
"""... and recall weighted β = 2 times precision."""
BLEU_ORDER = 4
"""sacreBLEU's BLEU: word n-grams of order 1 to 4."""
PAIRS_PER_CHUNK = 1 << 22
"""Bound on the `(candidates, n-grams)` block of counts multiplied at once (memory, not results)."""
PROGRESS_AFTER_S = 3.0
"""A table of pairwise utilities that takes longer than this shows its progress on stderr."""
BYTES_PER_PAIR = 96
"""Peak memory of a table of pairwise utilities per pair of candidates, with room: `chrf_matrix` and
`bleu_matrix` took 59 and 67 bytes a pair over 3,000 distinct candidates (tracemalloc);
tests/inference/test_mbr.py holds the estimate above what they take."""
WORKSPACE_BYTES = 8 * PAIRS_PER_CHUNK
"""The float32 block of counts and its 0/1 copy, besides the `(K, K)` arrays."""


def candidate_search(search: SearchConfig) -> SearchConfig:
    """The search that draws the candidates of `search.mbr` (`search` itself when MBR is off)."""
    if not search.mbr:
        return search
    sampling = search.mbr_candidates != "nbest"
    return dataclasses.replace(
        search, mbr=0, mbr_utility="chrf", mbr_candidates="sample", nbest=search.mbr, sampling=sampling
    )


# ------------------------------------------------------------------------------------------ n-gram counts


@dataclass
class NgramCounts:
    """The candidates' n-grams of one order: how many each candidate has (`totals` `(K,)`) and, as
    coordinates, the counts of the n-grams two candidates or more share (candidate `rows[j]` has n-gram
    `cols[j]` `counts[j]` times; `n_cols` such n-grams). An n-gram of one candidate matches only itself, which
    `totals` counts already, so it is left out: most long n-grams of distinct samples are."""

    totals: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    counts: np.ndarray
    n_cols: int


def ngram_counts(grams: Sequence[Sequence[Counter]], orders: int) -> list[NgramCounts]:
    """`grams[i][n]`: the `Counter` of candidate `i`'s n-grams of order `n + 1`, `n < orders`; one
    [`NgramCounts`][attnx.inference.mbr.NgramCounts] per order."""
    out = []
    for n in range(orders):
        holders = Counter(gram for by_order in grams for gram in by_order[n])
        columns: dict[object, int] = {}
        rows, cols, counts = [], [], []
        for i, by_order in enumerate(grams):
            for gram, count in by_order[n].items():
                if holders[gram] > 1:
                    rows.append(i)
                    cols.append(columns.setdefault(gram, len(columns)))
                    counts.append(count)
        totals = np.array([sum(by_order[n].values()) for by_order in grams], dtype=np.int64)
        arrays = (np.array(rows, np.int64), np.array(cols, np.int64), np.array(counts, np.int64))
        out.append(NgramCounts(totals, *arrays, len(columns)))
    return out


def matched(table: NgramCounts, width: int, bar: tqdm) -> np.ndarray:
    """`M` `(K, K)`: `M[h, r]` = sum over the n-grams `g` of `min(C[h, g], C[r, g])`.

    `min(a, b)` is the number of thresholds `t >= 1` both counts reach, so `M = sum_t B_t B_tᵀ` with
    `B_t[h, g] = C[h, g] >= t`: matrix products of 0/1 blocks of `width` n-grams (exact in float32: every sum
    is an integer far below 2**24). The diagonal is each candidate's own number of n-grams.
    """
    k = len(table.totals)
    out = np.zeros((k, k), dtype=np.float32)
    order = np.argsort(table.cols, kind="stable")
    rows, cols, counts = table.rows[order], table.cols[order], table.counts[order]
    for first in range(0, table.n_cols, width):
        lo, hi = np.searchsorted(cols, [first, first + width])
        block = np.zeros((k, min(width, table.n_cols - first)), dtype=np.float32)  # (K, w)
        block[rows[lo:hi], cols[lo:hi] - first] = counts[lo:hi]
        for t in range(1, int(counts[lo:hi].max()) + 1):
            reached = (block >= t).astype(np.float32)
            out += reached @ reached.T
        bar.update(1)
    np.fill_diagonal(out, table.totals)
    return out


def pairwise_matches(tables: Sequence[NgramCounts]) -> Iterator[np.ndarray]:
    """Per order, [`matched`][attnx.inference.mbr.matched] as float64; a table that takes longer than
    `PROGRESS_AFTER_S` shows its progress on stderr."""
    k = len(tables[0].totals)
    width = max(1, PAIRS_PER_CHUNK // max(1, k))
    blocks = sum(-(-table.n_cols // width) for table in tables)
    with tqdm(
        total=blocks,
        desc=f"MBR: utilities of {k} candidates",
        unit="block",
        file=sys.stderr,
        delay=PROGRESS_AFTER_S,
        leave=False,
        dynamic_ncols=True,
    ) as bar:
        for table in tables:
            yield matched(table, width, bar).astype(np.float64)


# ------------------------------------------------------------------------------------------------ chrF


def char_ngrams(text: str, max_order: int = CHRF_CHAR_ORDER) -> list[Counter]:
    """sacreBLEU's `extract_all_char_ngrams` with whitespace removed: one `Counter` per order."""
    line = "".join(text.split())
    return [Counter(line[i : i + n] for i in range(len(line) - n + 1)) for n in range(1, max_order + 1)]


def chrf_matrix(texts: Sequence[str]) -> np.ndarray:
    """`U` `(K, K)`: `U[h, r]` = sacreBLEU's sentence chrF of hypothesis `texts[h]` against reference `texts[r]`
    (`CHRF().sentence_score(texts[h], [texts[r]]).score`).

    sacreBLEU's statistics per order `n`: hypothesis n-grams (counted only where the reference has n-grams of
    that order), reference n-grams, matched n-grams; its F-score averages precision and recall over the
    orders both sides have (the effective order, sacreBLEU's default without eps smoothing), in the same order
    of operations here, so the numbers are the same floats.
    """
    tables = ngram_counts([char_ngrams(t) for t in texts], CHRF_CHAR_ORDER)
    k = len(texts)
    factor = CHRF_BETA**2
    avg_prec = np.zeros((k, k))
    avg_rec = np.zeros((k, k))
    effective = np.zeros((k, k), dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for table, match in zip(tables, pairwise_matches(tables), strict=True):  # (H, R) per order
            ref_total = table.totals[None, :]  # (1, R)
            n_hyp = np.where(ref_total > 0, table.totals[:, None], 0)  # no hits counted without a reference
            both = (n_hyp > 0) & (ref_total > 0)
            avg_prec += np.where(both, match / n_hyp, 0.0)
            avg_rec += np.where(both, match / ref_total, 0.0)
            effective += both
            del match, n_hyp, both
        avg_prec = np.where(effective > 0, avg_prec / effective, 0.0)
        avg_rec = np.where(effective > 0, avg_rec / effective, 0.0)
        score = (1 + factor) * avg_prec * avg_rec
        score = score / (factor * avg_prec + avg_rec)
    return np.where(avg_prec + avg_rec > 0, 100 * score, 0.0)


# ------------------------------------------------------------------------------------------------ BLEU


def word_ngrams(tokens: Sequence[str], max_order: int = BLEU_ORDER) -> list[Counter]:
    """One `Counter` of word n-gram tuples per order 1 .. `max_order`."""
    return [
        Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)) for n in range(1, max_order + 1)
    ]


def bleu_matrix(texts: Sequence[str]) -> np.ndarray:
    """`U` `(K, K)`: `U[h, r]` = sacreBLEU's sentence BLEU of hypothesis `texts[h]` against reference
    `texts[r]` (`BLEU(effective_order=True).sentence_score(texts[h], [texts[r]]).score`: 13a tokens,
    exponential smoothing, orders up to the longest the hypothesis has, brevity penalty)."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = Tokenizer13a()
    tokens = [tokenize(t.rstrip()).split() for t in texts]
    tables = ngram_counts([word_ngrams(x) for x in tokens], BLEU_ORDER)
    total = np.stack([table.totals for table in tables], axis=1).astype(np.float64)  # (H, 4)
    k = len(texts)
    sys_len = np.array([len(x) for x in tokens], dtype=np.float64)[:, None].repeat(k, 1)  # (H, R)
    ref_len = sys_len.T
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        smooth = np.ones((k, k))
        log_sum = np.zeros((k, k))
        eff_order = np.zeros((k, 1))
        any_correct = np.zeros((k, k), dtype=bool)
        for n, correct in enumerate(pairwise_matches(tables)):  # (H, R) per order
            has = total[:, n : n + 1] > 0  # (H, 1): sacreBLEU stops at the first order with no n-grams
            zero = correct == 0
            smooth = np.where(has & zero, smooth * 2, smooth)
            precision = np.where(
                zero, 100.0 / (smooth * total[:, n : n + 1]), 100.0 * correct / total[:, n : n + 1]
            )
            log_sum = np.where(has, log_sum + np.log(precision), log_sum)
            eff_order = np.where(has, n + 1, eff_order)
            any_correct |= ~zero
            del correct, zero, precision
        score = bp * np.exp(log_sum / np.maximum(eff_order, 1))
    return np.where(any_correct, score, 0.0)


UTILITIES: dict[str, Callable[[Sequence[str]], np.ndarray]] = {"chrf": chrf_matrix, "bleu": bleu_matrix}
"""Pairwise utility of each `search.mbr_utility`."""


# ------------------------------------------------------------------------------------------------- MBR


def utility_table_bytes(candidates: int) -> int:
    """Estimated peak memory of the pairwise utilities of `candidates` distinct candidates."""
    return candidates**2 * BYTES_PER_PAIR + WORKSPACE_BYTES


def available_memory() -> int | None:
    """Bytes this process may still take: Linux's `MemAvailable`, lowered to what is left under a cgroup
    (container) limit; None where neither is known."""
    found: list[int] = []
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open("/proc/meminfo", encoding="ascii") as meminfo,
    ):
        found += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")]
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text()))
    return min(found) if found else None


def check_memory(search: SearchConfig, available: int | None = None) -> None:
    """A usage error, with the estimate and what fits, when the pairwise utilities of `search.mbr` candidates
    would not fit `available` bytes (default: [`available_memory`][attnx.inference.mbr.available_memory])."""
    if not search.mbr:
        return
    available = available_memory() if available is None else available
    need = utility_table_bytes(search.mbr)
    if available is not None and need > available:
        fits = math.isqrt(max(0, available - WORKSPACE_BYTES) // BYTES_PER_PAIR)
        raise ConfigError(
            f"search.mbr {search.mbr}: the pairwise utilities of {search.mbr} candidates take about "
            f"{size(need)} of memory and {size(available)} are available; choose search.mbr {fits} or less"
        )


def size(n: int) -> str:
    """`n` bytes in GiB, or MiB below one GiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def expected_utilities(texts: Sequence[str], utility: str = "chrf") -> tuple[list[str], list[float]]:
    """The distinct texts of `texts` (first-seen order) and each one's expected utility against all `texts`
    (module docstring)."""
    distinct = list(dict.fromkeys(texts))
    weight = Counter(texts)
    pairwise = UTILITIES[utility](distinct)  # (K, K)
    refs = np.array([weight[t] for t in distinct], dtype=np.float64)
    return distinct, (pairwise @ refs / len(texts)).tolist()


def rank_by_expected_utility(hypotheses: Sequence[Hypothesis], utility: str = "chrf") -> list[Hypothesis]:
    """The distinct candidates of `hypotheses` (their `text` filled; of several with one text, the one the
    search scored higher), `expected_utility` set, best first (ties: the higher `score` first)."""
    if not hypotheses:
        return []
    texts, utilities = expected_utilities([h.text for h in hypotheses], utility)
    best: dict[str, Hypothesis] = {}
    for h in hypotheses:
        if h.text not in best or h.score > best[h.text].score:
            best[h.text] = h
    ranked = []
    for text, value in zip(texts, utilities, strict=True):
        best[text].expected_utility = value
        ranked.append(best[text])
    return sorted(ranked, key=lambda h: (h.expected_utility, h.score), reverse=True)


def rerank(
    results: list[list[Hypothesis]], search: SearchConfig, decode: Callable[[Sequence[int]], str]
) -> list[list[Hypothesis]]:
    """Per input, its candidates ranked by expected utility when `search.mbr` (each `text` filled by
    `decode`); `results` unchanged otherwise."""
    if not search.mbr:
        return results
    out = []
    for hyps in results:
        for h in hyps:
            h.text = decode(h.tokens)
        out.append(rank_by_expected_utility(hyps, search.mbr_utility))
    return out
