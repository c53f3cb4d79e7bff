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
one row of a count matrix per candidate, one column per distinct n-gram of the sentence's candidates), and
the matched counts of all pairs are one array operation, `sum_g min(C[h, g], C[r, g])` per order; the
statistics then go through the same formula as sacreBLEU's, vectorized over the pairs, so the utilities equal
sacreBLEU's (tests/inference/test_mbr.py checks them on Multi30k sentences). Nothing here needs Lightning.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from attnx.inference.config import SearchConfig
from attnx.inference.hypothesis import Hypothesis

__all__ = [
    "bleu_matrix",
    "candidate_search",
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
"""Bound on the `(hypotheses, references, n-grams)` minimum computed at once (memory, not results)."""


def candidate_search(search: SearchConfig) -> SearchConfig:
    """The search that draws the candidates of `search.mbr` (`search` itself when MBR is off)."""
    if not search.mbr:
        return search
    sampling = search.mbr_candidates != "nbest"
    return dataclasses.replace(
        search, mbr=0, mbr_utility="chrf", mbr_candidates="sample", nbest=search.mbr, sampling=sampling
    )


# ------------------------------------------------------------------------------------------ n-gram counts


def ngram_counts(grams: Sequence[Sequence[Counter]], orders: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of every candidate's n-grams as one matrix.

    `grams[i][n]`: the `Counter` of candidate `i`'s n-grams of order `n + 1`, `n < orders`. Returns `C` `(K, G)` (row `i`,
    column `g`: how often candidate `i` has n-gram `g`; `G` distinct n-grams of all orders, grouped by order)
    and `starts` `(orders,)`, the first column of each order.
    """
    columns: list[dict[object, int]] = [{} for _ in range(orders)]
    for by_order in grams:
        for n, counter in enumerate(by_order):
            for gram in counter:
                columns[n].setdefault(gram, len(columns[n]))
    starts = np.cumsum([0] + [len(c) for c in columns[:-1]]).astype(np.int64)
    counts = np.zeros((len(grams), sum(len(c) for c in columns)), dtype=np.int32)
    for i, by_order in enumerate(grams):
        for n, counter in enumerate(by_order):
            if counter:
                where = [columns[n][gram] + starts[n] for gram in counter]
                counts[i, where] = list(counter.values())
    return counts, starts


def matched(counts: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`M` `(K, K, orders)`: `M[h, r, n] = sum over n-grams g of order n of min(C[h, g], C[r, g])`."""
    k, g = counts.shape
    out = np.zeros((k, k, len(starts)), dtype=np.int64)
    if g == 0:
        return out
    # An order with no n-gram at all has an empty column range, which reduceat would not give as 0.
    present = np.append(starts[1:], g) > starts
    step = max(1, PAIRS_PER_CHUNK // max(1, k * g))
    for first in range(0, k, step):
        block = np.minimum(counts[first : first + step, None, :], counts[None, :, :])  # (k', K, G)
        out[first : first + step][..., present] = np.add.reduceat(block, starts[present], axis=2)
    return out


def totals(counts: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`(K, orders)`: each candidate's number of n-grams of each order."""
    out = np.zeros((counts.shape[0], len(starts)), dtype=np.int64)
    if counts.shape[1]:
        present = np.append(starts[1:], counts.shape[1]) > starts
        out[:, present] = np.add.reduceat(counts, starts[present], axis=1)
    return out


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
    counts, starts = ngram_counts([char_ngrams(t) for t in texts], CHRF_CHAR_ORDER)
    n_orders = CHRF_CHAR_ORDER
    match = matched(counts, starts).astype(np.float64)  # (H, R, n)
    total = totals(counts, starts)  # (K, n)
    k = len(texts)
    hyp_total = np.broadcast_to(total[:, None, :], (k, k, n_orders))
    ref_total = np.broadcast_to(total[None, :, :], (k, k, n_orders))
    n_hyp = np.where(ref_total > 0, hyp_total, 0)  # "don't count hits if no reference exists"
    factor = CHRF_BETA**2
    avg_prec = np.zeros((k, k))
    avg_rec = np.zeros((k, k))
    effective = np.zeros((k, k), dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for n in range(n_orders):
            both = (n_hyp[..., n] > 0) & (ref_total[..., n] > 0)
            avg_prec += np.where(both, match[..., n] / n_hyp[..., n], 0.0)
            avg_rec += np.where(both, match[..., n] / ref_total[..., n], 0.0)
            effective += both
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
    counts, starts = ngram_counts([word_ngrams(x) for x in tokens], BLEU_ORDER)
    correct = matched(counts, starts).astype(np.float64)  # (H, R, 4)
    total = totals(counts, starts).astype(np.float64)  # (H, 4)
    k = len(texts)
    sys_len = np.array([len(x) for x in tokens], dtype=np.float64)[:, None].repeat(k, 1)  # (H, R)
    ref_len = sys_len.T
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        smooth = np.ones((k, k))
        log_sum = np.zeros((k, k))
        eff_order = np.zeros((k, 1))
        for n in range(BLEU_ORDER):
            has = total[:, n : n + 1] > 0  # (H, 1): sacreBLEU stops at the first order with no n-grams
            zero = correct[..., n] == 0
            smooth = np.where(has & zero, smooth * 2, smooth)
            precision = np.where(
                zero, 100.0 / (smooth * total[:, n : n + 1]), 100.0 * correct[..., n] / total[:, n : n + 1]
            )
            log_sum = np.where(has, log_sum + np.log(precision), log_sum)
            eff_order = np.where(has, n + 1, eff_order)
        score = bp * np.exp(log_sum / np.maximum(eff_order, 1))
    return np.where(correct.sum(axis=2) > 0, score, 0.0)


UTILITIES: dict[str, Callable[[Sequence[str]], np.ndarray]] = {"chrf": chrf_matrix, "bleu": bleu_matrix}
"""Pairwise utility of each `search.mbr_utility`."""


# ------------------------------------------------------------------------------------------------- MBR


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
