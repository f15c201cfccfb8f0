"""Is the reranker earning its cost? Label-free signals of what one rerank call changed.

No relevance judgements are needed: each signal compares the reranker's ranking with the recall
ranking it was given, or looks at the reranker's own scores. Watched over time they show a
reranker that has stopped reordering (a model swapped for a bi-encoder, a truncation bug, a
server returning its input order), one that reaches deeper than it used to, or one whose scores
have collapsed (every pair 0.5).

- `kendall_tau`: Kendall's tau-b between recall order (`recall_order`: by recall score, ties
  and unscored candidates in input order, the order the stage falls back to) and the rerank
  scores of the candidates the reranker returned scores for. 1 means the reranker kept
  recall's order; 0 unrelated; -1 reversed. Ties are only in the rerank scores, so a reranker
  that returns recall's order with distinct scores reads exactly 1 even where recall scores
  tie. None when recall scores are all absent or all equal (recall expressed no order), when
  fewer than two candidates were scored, or when every rerank score is equal (tau-b is
  undefined: a made-up number would pass for a measurement).
- `topk_overlap`: |rerank top-k ∩ recall top-k| / k.
- `max_promotion`: the deepest 1-based recall rank among the rerank top-k (k when nothing came
  up from below the recall top-k).
- `top_score`, `score_margin`: the best rerank score, and the best minus the second best.
- `rbo`: rank-biased overlap (`rank_biased_overlap`) between recall's top k and the
  reranker's top k, in its extrapolated form RBO_ext (Webber, Moffat and Zobel, "A similarity
  measure for indefinite rankings", TOIS 2010, eq. 30 for two lists of the same depth k) with
  persistence p = 0.9 (`RBO_PERSISTENCE`). Where overlap counts the top k as a set, RBO weighs
  agreement at the head more: 1 identical top k in the same order, 0 disjoint; a swap at ranks
  1-2 costs more than one at ranks 9-10. p = 0.9 gives the first 10 ranks about 86% of the
  weight (the paper's eq. 21), matching the usual top_k of 10; a deeper top_k still counts, with
  less weight per rank.
- `score_spread`: the best minus the worst of the reranker's top-k scores. Near 0 the reranker
  cannot tell its top k apart (a collapse across the head, where `score_margin` sees only the
  first two); it is None where `score_margin` is (fewer than two scores in the top k).

Everything here is pure and cheap, so it can run on every traced call: `rerank_quality`
derives all seven signals from one walk down the scored candidates, keeping the recall ranks
seen so far as the bits of an int (an `&` and a popcount per candidate, no sorting, no dict);
for 50 candidates it costs about a third of the stage's own result check
(``python -m benchmarks --only quality``; figures in docs/quality.md).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import ge, gt, lt
from typing import Any

from ._native import SPEEDUPS as _c
from .models import Candidate, recall_order
from .spans.keys import (
    ATTR_KENDALL_TAU,
    ATTR_MAX_PROMOTION,
    ATTR_RBO,
    ATTR_SCORE_MARGIN,
    ATTR_SCORE_SPREAD,
    ATTR_TOP_SCORE,
    ATTR_TOPK_OVERLAP,
)

__all__ = [
    "RBO_PERSISTENCE",
    "RerankQuality",
    "kendall_tau_b",
    "max_promotion",
    "rank_biased_overlap",
    "rerank_quality",
    "topk_overlap",
]

RBO_PERSISTENCE = 0.9
"""The persistence p of the stage's rank-biased overlap: the chance that a reader who looked at
rank d looks at rank d + 1. 0.9 puts about 86% of the weight on the first 10 ranks."""


@dataclass(frozen=True, slots=True)
class RerankQuality:
    """The label-free signals of one rerank call; a field is None where it is undefined."""

    kendall_tau: float | None
    topk_overlap: float | None
    max_promotion: int | None
    top_score: float | None
    score_margin: float | None
    rbo: float | None = None
    score_spread: float | None = None

    def attributes(self) -> dict[str, float | int]:
        """The span attributes (``retrieval_stage.quality.*``); undefined signals are left out,
        since an OpenTelemetry attribute cannot be None."""
        pairs: tuple[tuple[str, float | int | None], ...] = (
            (ATTR_KENDALL_TAU, self.kendall_tau),
            (ATTR_TOPK_OVERLAP, self.topk_overlap),
            (ATTR_MAX_PROMOTION, self.max_promotion),
            (ATTR_TOP_SCORE, self.top_score),
            (ATTR_SCORE_MARGIN, self.score_margin),
            (ATTR_RBO, self.rbo),
            (ATTR_SCORE_SPREAD, self.score_spread),
        )
        return {key: value for key, value in pairs if value is not None}


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of paired samples `x` and `y`; None where it is undefined.

    tau-b = (concordant - discordant) / sqrt((n0 - ties_x) * (n0 - ties_y)), n0 = n(n-1)/2,
    the definition `scipy.stats.kendalltau` uses. Undefined (None) for fewer than two pairs or
    when either sample has a single value.
    """
    n = len(x)
    if n != len(y):
        raise ValueError(f"paired samples differ in length: {n} and {len(y)}")
    if all(map(gt, y, islice(y, 1, None))):  # best first, no ties: the common case
        return _tau_b_y_descending(x, y, ties_y=0)
    if not all(map(ge, y, islice(y, 1, None))):  # not best first: put it so
        order = sorted(range(n), key=y.__getitem__, reverse=True)
        x = [x[i] for i in order]
        y = [y[i] for i in order]
    return _tau_b_y_descending(x, y, ties_y=_tied_pairs(y, gt))


def _tau_b_y_descending(x: Sequence[float], y: Sequence[float], *, ties_y: int) -> float | None:
    """`kendall_tau_b` for `y` sorted high to low (a reranker's scores, best first), with
    `ties_y` its tied pairs.

    Walking down `y`, each x is discordant with every earlier (higher-y) x that is smaller
    (`_rising_pairs`); without ties the rest of the pairs are concordant.
    """
    n = len(x)
    if n < 2:
        return None
    n0 = n * (n - 1) // 2
    if ties_y == n0:  # every score equal (a collapsed reranker): nothing to count
        return None
    discordant = _rising_pairs(x)
    ties_x = _tied_pairs(sorted(x), lt)
    if ties_x == n0:
        return None
    tied = ties_x or ties_y
    balance = _balance_with_ties(x, y) if tied else n0 - 2 * discordant
    return balance / math.sqrt((n0 - ties_x) * (n0 - ties_y))


def _balance_with_ties(x: Sequence[float], y: Sequence[float]) -> int:
    """concordant - discordant for `y` sorted high to low, pairs tied in x or y counting as
    neither: each run of equal y is compared only with the pairs above it, and joins `below`
    after its last member."""
    below: list[float] = []
    balance = 0
    start = 0
    n = len(x)
    while start < n:
        end = start + 1
        while end < n and y[end] == y[start]:
            end += 1
        above = len(below)
        run = x[start:end]
        for value in run:
            balance += above - bisect_right(below, value) - bisect_left(below, value)
        for value in run:
            insort(below, value)
        start = end
    return balance


def topk_overlap(recall: Sequence[int], reranked: Sequence[int], k: int) -> float | None:
    """|first k of `reranked` ∩ first k of `recall`| / k; None when k < 1.

    Both are rankings of input positions, best first. k larger than either ranking counts only
    what is there, so pass k = min(top_k, n) for a call that returned everything.
    """
    if k < 1:
        return None
    return len(set(recall[:k]).intersection(reranked[:k])) / k


def max_promotion(recall: Sequence[int], reranked: Sequence[int], k: int) -> int | None:
    """The deepest 1-based position in `recall` of any of the first k of `reranked`.

    None when k < 1 or nothing was reranked. A position missing from `recall` is an error
    (the reranker returned something it was not given), not a silent zero.
    """
    top = reranked[:k]
    if k < 1 or not top:
        return None
    # The deepest recall position holding one of `top`, scanning up from the bottom: a
    # reranker that promotes from deep stops early, one that kept recall's order walks n - k.
    wanted = set(top)
    if not wanted.issubset(recall):
        raise KeyError(f"not in the recall ranking: {sorted(wanted.difference(recall))}")
    for rank in range(len(recall), 0, -1):
        if recall[rank - 1] in wanted:
            return rank
    raise AssertionError("unreachable: every position of `top` is in `recall`")  # pragma: no cover


def rank_biased_overlap(
    a: Sequence[Hashable], b: Sequence[Hashable], p: float = RBO_PERSISTENCE
) -> float | None:
    """Rank-biased overlap of rankings `a` and `b` (best first), extrapolated: RBO_ext of
    Webber, Moffat and Zobel (2010), eq. 30, at depth k = the shorter one's length.

    RBO_ext = X_k / k * p**k + (1 - p) / p * sum over d = 1..k of X_d / d * p**d, where X_d is
    how many items the first d of `a` and of `b` share. It assumes the agreement seen at depth k
    continues below it, so identical rankings score 1 (not RBO's lower bound 1 - p**k) and
    disjoint ones 0. Symmetric, in [0, 1]. The longer ranking is read only to depth k (the
    paper's form for uneven lists, eq. 32, is not what the stage needs: it compares two top k).

    None when either ranking is empty. ValueError when p is not in (0, 1) or an item appears
    twice in the first k of a ranking (a ranking holds each item once).
    """
    if not 0.0 < p < 1.0:  # also refuses NaN
        raise ValueError(f"persistence p must lie in (0, 1), not {p!r}")
    k = min(len(a), len(b))
    if k == 0:
        return None
    head_a, head_b = a[:k], b[:k]
    if len(set(head_a)) != k or len(set(head_b)) != k:
        raise ValueError("an item appears twice in a ranking")
    seen_a: set[Hashable] = set()
    seen_b: set[Hashable] = set()
    shared = 0
    weight = 1.0
    total = 0.0
    for d, (x, y) in enumerate(zip(head_a, head_b, strict=True), 1):
        if x == y:
            shared += 1
        else:
            shared += (x in seen_b) + (y in seen_a)
        seen_a.add(x)
        seen_b.add(y)
        weight *= p
        total += shared / d * weight
    return min((1.0 - p) / p * total + shared / k * weight, 1.0)


def _depth(
    candidates: Sequence[Candidate], recall: Sequence[int], n_scored: int, top_k: int | None
) -> tuple[int, bool]:
    """k for `n_scored` pairs, and whether recall ranked something above something else: its
    order (scores high to low, unscored last) does not start and end on the same score. Else
    tau is undefined and only the first k need walking."""
    k = n_scored if top_k is None else max(min(top_k, n_scored), 0)
    ordered = n_scored >= 2 and candidates[recall[0]].score != candidates[recall[-1]].score
    return k, ordered


def rerank_quality(
    candidates: Sequence[Candidate],
    scored: Sequence[tuple[int, float]],
    top_k: int | None = None,
    *,
    recall: Sequence[int] | None = None,
) -> RerankQuality:
    """The signals of one call: `candidates` as given to the reranker, `scored` its
    (input position, score) pairs best first (everything it scored, before the top-k cut or a
    score threshold; distinct positions), `top_k` the call's top_k (None: k is the number
    scored). `recall` is ``recall_order(candidates)`` when the caller has it already.

    k is min(top_k, number scored), so a call asking for more than there are compares what
    there is, and a reranker that returned recall's order has overlap 1.

    All five signals come from one walk down `scored` (`_walk`), which keeps the set of
    recall ranks seen so far as the bits of an int: after the first k, overlap is how many of
    its bits are below k and the deepest promotion its highest bit; tau-b counts, for each
    candidate, the better-ranked ones above it. IndexError when a position is not one of the
    candidates', ValueError when one is scored twice (the reranker returned it twice: every
    signal would be wrong). A score that is not finite is no measurement: its pair is left out.
    A `top_k` below 1 leaves overlap and promotion undefined (None), as `topk_overlap` does.
    """
    if not scored:
        return _NOTHING_SCORED
    if recall is None:
        recall = recall_order(candidates)
    walked = None
    if _c is not None and type(scored) is list and type(recall) is list:
        # The walk in C, which checks what the lines below check (each position once, each
        # score finite) and hands back None for anything it leaves to them.
        n_scored = len(scored)
        k, ordered = _depth(candidates, recall, n_scored, top_k)
        weights, tails = _rbo_weights(k)
        walked = _c.quality_walk(scored, recall, k, ordered, weights, tails)
    if walked is None:
        if len({position for position, _ in scored}) != len(scored):
            raise ValueError("a position is scored twice: the reranker returned it twice")
        if not all(map(math.isfinite, [score for _, score in scored])):
            scored = [(position, score) for position, score in scored if math.isfinite(score)]
            if not scored:
                return _NOTHING_SCORED
        n_scored = len(scored)
        k, ordered = _depth(candidates, recall, n_scored, top_k)
        walked = _walk(scored, recall, k, ordered)
    top, tau, rbo, spread = walked
    top_score = scored[0][1]
    return RerankQuality(
        kendall_tau=tau if ordered else None,
        topk_overlap=(top & ((1 << k) - 1)).bit_count() / k if k else None,
        max_promotion=top.bit_length() if k else None,
        top_score=top_score,
        score_margin=top_score - scored[1][1] if n_scored >= 2 else None,
        rbo=rbo,
        score_spread=spread,
    )


# What `_walk` finds: the recall ranks of the first k as the bits of an int, tau-b, the
# rank-biased overlap of the first k and the spread of their scores (None where undefined). A
# plain tuple: a NamedTuple's construction costs a tenth of the budget's margin per call.
_Walked = tuple[int, float | None, float | None, float | None]


def _walk(
    scored: Sequence[tuple[int, float]], recall: Sequence[int], k: int, full: bool
) -> _Walked:
    """One walk down `scored`: the recall ranks of its first k as the bits of an int, their
    RBO against recall's first k and their score spread, and Kendall's tau-b between recall
    order and the scores (None where undefined) of all of `scored` when `full`, else of the
    first k only (a tau the caller drops: recall expressed no order).

    Each candidate's recall rank r (0 best; distinct, recall ties being broken by input
    position) is bit r of `seen`. A pair is concordant when the reranker put first the
    candidate recall ranked better: walking down, each candidate is concordant with the
    better-ranked ones above it, the bits of `before` below r (one `&` and a popcount), and
    discordant with the rest above it. A pair tied in score is neither: `before` is `seen` as
    it was when the current run of equal scores began, and `tied` counts the run's pairs
    (each member adds the run's earlier ones). Ranks never tie, so tau-b's denominator is
    sqrt(n0 * (n0 - tied)). Every score equal (a collapsed reranker) leaves tau undefined;
    scores not best first (not from the stage) go the general way, `kendall_tau_b`.

    Within the first k, the RBO's agreement at depth d, X_d, is the bits of `seen` below d
    (recall's first d): one more `&` and popcount, weighted from `_rbo_weights`.
    """
    n_ranks = len(recall)
    # recall_order is a permutation of the input positions. The identity (the candidates came
    # in recall order, as a retriever returns them) is its own inverse.
    identity, bit, below = _masks(n_ranks + 1)
    if recall == identity[:n_ranks]:
        rank_of = recall
    else:  # inverted (for 50, a loop beats sorting the ranks by the position each holds)
        rank_of = [0] * n_ranks
        for rank, position in enumerate(recall):
            rank_of[position] = rank
    weights, tails = _rbo_weights(k)
    seen = before = concordant = tied = 0
    agreement = 0.0
    run = -1  # the current run's members so far, less one
    prev = scored[0][1]
    rest = iter(scored)
    depth = len(scored) if full else k
    # The first k, then (for tau) the rest: the same steps, the first k also adding to the RBO.
    for d, (position, score) in enumerate(islice(rest, k), 1):
        rank = rank_of[position]
        if score < prev:  # a new run of scores
            before = seen
            run = 0
            prev = score
        elif score == prev:
            run += 1
            tied += run
        else:  # not best first
            return _walk_in_any_order(scored, rank_of, k, depth)
        concordant += (before & below[rank]).bit_count()
        seen |= bit[rank]
        agreement += (seen & below[d]).bit_count() * weights[d]
    top = seen
    for position, score in rest if full else ():
        rank = rank_of[position]
        if score < prev:
            before = seen
            run = 0
            prev = score
        elif score == prev:
            run += 1
            tied += run
        else:
            return _walk_in_any_order(scored, rank_of, k, depth)
        concordant += (before & below[rank]).bit_count()
        seen |= bit[rank]
    rbo = spread = None
    if k:
        rbo = min(agreement + (top & below[k]).bit_count() * tails[k], 1.0)
        spread = scored[0][1] - scored[k - 1][1] if k >= 2 else None
    n0 = depth * (depth - 1) // 2
    if depth < 2 or tied == n0:
        return top, None, rbo, spread
    balance = 2 * concordant - (n0 - tied)
    tau = balance / n0 if not tied else balance / math.sqrt(n0 * (n0 - tied))
    return top, tau, rbo, spread


def _walk_in_any_order(
    scored: Sequence[tuple[int, float]], rank_of: Sequence[int], k: int, depth: int
) -> _Walked:
    """`_walk` for scores not best first (a direct caller's): the first k's recall ranks, RBO
    and spread (max - min of their scores) step by step, tau-b the general way."""
    top = 0
    agreement = 0.0
    weights, tails = _rbo_weights(k)
    for d, (position, _) in enumerate(islice(scored, k), 1):
        top |= 1 << rank_of[position]
        agreement += (top & ((1 << d) - 1)).bit_count() * weights[d]
    head = [score for _, score in islice(scored, k)]
    rbo = min(agreement + (top & ((1 << k) - 1)).bit_count() * tails[k], 1.0) if k else None
    spread = max(head) - min(head) if k >= 2 else None
    return top, _tau_b_of_ranks(scored, rank_of, depth), rbo, spread


def _tau_b_of_ranks(
    scored: Sequence[tuple[int, float]], rank_of: Sequence[int], depth: int
) -> float | None:
    """Kendall's tau-b between recall order (rank 0 best) and the scores of the first `depth`
    of `scored` in any order: the general `kendall_tau_b` on the negated ranks."""
    pairs = scored[:depth]
    return kendall_tau_b([-rank_of[p] for p, _ in pairs], [s for _, s in pairs])


# RBO_ext's weights for p = `RBO_PERSISTENCE` at index d: (1 - p) / p * p**d / d, the weight
# of the agreement X_d, and p**d / d, the weight of X_d in the extrapolated tail when d = k.
# The sum can round a hair above 1 for identical rankings: the walk caps it at 1.
_RBO_TABLES: tuple[list[float], list[float]] = ([0.0], [0.0])


def _rbo_weights(k: int) -> tuple[list[float], list[float]]:
    """`_RBO_TABLES` for depths up to k at least: grown as needed and rebound as a whole, never
    extended in place (as `_masks`), kept for up to `_MASK_CACHE_LIMIT` ranks."""
    global _RBO_TABLES
    tables = _RBO_TABLES
    if k < len(tables[0]):
        return tables
    p = RBO_PERSISTENCE
    size = max(64, 1 << k.bit_length())
    tails = [0.0] + [p**d / d for d in range(1, size)]
    tables = ([(1.0 - p) / p * tail for tail in tails], tails)
    if size <= _MASK_CACHE_LIMIT:
        _RBO_TABLES = tables
    return tables


_MASK_CACHE_LIMIT = 1024  # kept for up to this many candidates (about 250 kB)
_TABLES: tuple[list[int], list[int], list[int]] = ([], [], [])


def _masks(n: int) -> tuple[list[int], list[int], list[int]]:
    """r, 1 << r and (1 << r) - 1 for r < n (at least): the identity ranking, and the bits
    `_walk`'s loop looks up rather than shifts. Kept for up to `_MASK_CACHE_LIMIT` candidates;
    rebound as a whole, never extended in place, so a thread holding the old ones still holds
    correct ones."""
    global _TABLES
    tables = _TABLES
    if n <= len(tables[0]):
        return tables
    size = max(64, 1 << (n - 1).bit_length())
    bit = [1 << r for r in range(size)]
    tables = (list(range(size)), bit, [b - 1 for b in bit])
    if size <= _MASK_CACHE_LIMIT:
        _TABLES = tables
    return tables


def _rising_pairs(values: Sequence[float]) -> int:
    """Pairs i < j with values[i] < values[j] (strictly): each value counts the smaller ones
    before it, found by `bisect` in a sorted list of them (Knight's O(n log n) counting without
    the merge sort; `bisect` and `list.insert` run in C, so for 50 values this beats both a
    merge sort and the n² pair loop written in Python)."""
    seen: list[float] = []
    insert, find = seen.insert, bisect_left  # locals: this loop is the whole cost
    rising = 0
    for value in values:
        i = find(seen, value)
        rising += i
        insert(i, value)
    return rising


_NOTHING_SCORED = RerankQuality(None, None, None, None, None)


def _tied_pairs(values: Sequence[float], strictly: Callable[[Any, Any], bool]) -> int:
    """Pairs of equal values in `values`, sorted so that neighbours compare by `strictly` or
    are equal (sum of c(c-1)/2 over runs of equal values); 0 at C speed in the common case, a
    strictly monotonic sequence."""
    if all(map(strictly, values, islice(values, 1, None))):
        return 0
    return sum(c * (c - 1) // 2 for c in Counter(values).values() if c > 1)
