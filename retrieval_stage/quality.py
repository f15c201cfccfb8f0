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

Everything here is pure and cheap, so it can run on every traced call: `rerank_quality`
derives all five signals from one list (each scored candidate's recall rank, in rerank order)
with C-speed building blocks; for 50 candidates it costs less than the stage's own result check
(``python -m benchmarks --only quality``; figures in docs/quality.md).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import ge, gt, lt, neg
from typing import Any

from .models import Candidate, recall_order

__all__ = [
    "ATTR_KENDALL_TAU",
    "ATTR_MAX_PROMOTION",
    "ATTR_SCORE_MARGIN",
    "ATTR_TOPK_OVERLAP",
    "ATTR_TOP_SCORE",
    "RerankQuality",
    "kendall_tau_b",
    "max_promotion",
    "rerank_quality",
    "topk_overlap",
]

ATTR_KENDALL_TAU = "retrieval_stage.quality.kendall_tau"
ATTR_TOPK_OVERLAP = "retrieval_stage.quality.topk_overlap"
ATTR_MAX_PROMOTION = "retrieval_stage.quality.max_promotion"
ATTR_TOP_SCORE = "retrieval_stage.quality.top_score"
ATTR_SCORE_MARGIN = "retrieval_stage.quality.score_margin"


@dataclass(frozen=True, slots=True)
class RerankQuality:
    """The label-free signals of one rerank call; a field is None where it is undefined."""

    kendall_tau: float | None
    topk_overlap: float | None
    max_promotion: int | None
    top_score: float | None
    score_margin: float | None

    def attributes(self) -> dict[str, float | int]:
        """The span attributes (``retrieval_stage.quality.*``); undefined signals are left out,
        since an OpenTelemetry attribute cannot be None."""
        pairs: tuple[tuple[str, float | int | None], ...] = (
            (ATTR_KENDALL_TAU, self.kendall_tau),
            (ATTR_TOPK_OVERLAP, self.topk_overlap),
            (ATTR_MAX_PROMOTION, self.max_promotion),
            (ATTR_TOP_SCORE, self.top_score),
            (ATTR_SCORE_MARGIN, self.score_margin),
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

    All five signals come from one list, each scored candidate's 0-based recall rank in
    rerank order (`ranks`): overlap counts the ranks below k among the first k, the deepest
    promotion is their largest, and tau counts the pairs whose ranks rise (see
    `_tau_b_of_ranks`). IndexError when a position is not one of the candidates'.
    """
    if not scored:
        return _NOTHING_SCORED
    if recall is None:
        recall = recall_order(candidates)
    n_scored = len(scored)
    k = n_scored if top_k is None else min(top_k, n_scored)
    positions, scores = zip(*scored, strict=True)
    # `recall` lists input positions by recall rank; sorting the ranks by the position each
    # holds inverts it (rank of each input position), at C speed.
    rank_of = sorted(range(len(recall)), key=recall.__getitem__)
    ranks = list(map(rank_of.__getitem__, positions))
    top = ranks[:k]
    tau = None
    # Recall ranked something above something else: its order (scores high to low, unscored
    # last) does not start and end on the same score.
    if candidates[recall[0]].score != candidates[recall[-1]].score:
        tau = _tau_b_of_ranks(ranks, scores)
    return RerankQuality(
        kendall_tau=tau,
        topk_overlap=sum(map(k.__gt__, top)) / k,
        max_promotion=max(top) + 1,
        top_score=scores[0],
        score_margin=scores[0] - scores[1] if n_scored >= 2 else None,
    )


def _tau_b_of_ranks(ranks: list[int], scores: Sequence[float]) -> float | None:
    """Kendall's tau-b between recall order and rerank scores, for `ranks` distinct recall
    ranks (lower is better) listed in the order of `scores` (the reranker's, best first).

    Ranks never tie (recall ties are broken by input position), so tau-b's denominator is
    sqrt(n0 * (n0 - ties in scores)). A pair is concordant when the reranker put first the
    candidate recall ranked higher (a rise in `ranks`), discordant otherwise; a pair tied in
    score is neither. With ties, each run of equal scores is put in rank order first (two
    stable sorts, in C): its own pairs then all rise, so they are taken back as a whole, and
    its pairs with everything outside it are counted as before. Scores not best first go the
    general way (`kendall_tau_b`).
    """
    n = len(ranks)
    if n < 2:
        return None
    n0 = n * (n - 1) // 2
    if all(map(gt, scores, islice(scores, 1, None))):  # no ties: the common case
        return (2 * _rising_pairs(ranks) - n0) / n0
    if not all(map(ge, scores, islice(scores, 1, None))):  # not best first
        return kendall_tau_b(list(map(neg, ranks)), scores)
    if scores[0] == scores[-1]:  # every score equal (a collapsed reranker): undefined
        return None
    ties = sum(c * (c - 1) // 2 for c in Counter(scores).values() if c > 1)
    score_of = dict(zip(ranks, scores, strict=True))
    # Best score first, and within a run of equal scores lowest rank first (`reverse` keeps
    # the order of equal keys).
    runs_in_rank_order = sorted(sorted(ranks), key=score_of.__getitem__, reverse=True)
    balance = 2 * (_rising_pairs(runs_in_rank_order) - ties) - (n0 - ties)
    return balance / math.sqrt(n0 * (n0 - ties))


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
