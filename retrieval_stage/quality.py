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

Everything here is pure and cheap (tens of µs for 50 candidates in CPython, about what the
stage's own result check costs; ``benchmarks/quality.py``), so it can run on every traced call.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, ge, gt, lt
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

    Walking down `y`, `below` holds, sorted, the x of every pair with a strictly greater y: a
    pair is discordant with each of those whose x is smaller and concordant with each whose x
    is larger. `bisect` and `list.insert` do the inner loop in C (Knight's counting without the
    merge sort), so 50 pairs cost a few microseconds instead of the n² pair loop's ~100.
    """
    n = len(x)
    if n < 2:
        return None
    n0 = n * (n - 1) // 2
    if ties_y == n0:  # every score equal (a collapsed reranker): nothing to count
        return None
    below: list[float] = []
    insert, find = below.insert, bisect_left  # locals: this loop is the whole cost
    discordant = 0
    for value in x:
        i = find(below, value)
        discordant += i
        insert(i, value)
    # `below` is now sorted(x). Without ties, concordant = n0 - discordant.
    ties_x = _tied_pairs(below, lt)
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
    score threshold), `top_k` the call's top_k (None: k is the number scored). `recall` is
    ``recall_order(candidates)`` when the caller has it already.

    k is min(top_k, number scored), so a call asking for more than there are compares what
    there is, and a reranker that returned recall's order has overlap 1.
    """
    if not scored:
        return _NOTHING_SCORED
    if recall is None:
        recall = recall_order(candidates)
    n_scored = len(scored)
    k = n_scored if top_k is None else min(top_k, n_scored)
    positions, scores = zip(*scored, strict=True)
    tau = None
    if len(set(map(_score, candidates))) > 1:  # recall ranked something above something else
        # Recall's order as a number per candidate, higher first: ties in recall score are
        # already broken by input position, as the stage's fallback breaks them.
        place = dict(zip(recall, range(len(recall), 0, -1), strict=True))
        tau = kendall_tau_b(list(map(place.__getitem__, positions)), scores)
    return RerankQuality(
        kendall_tau=tau,
        topk_overlap=topk_overlap(recall, positions, k),
        max_promotion=max_promotion(recall, positions, k),
        top_score=scores[0],
        score_margin=scores[0] - scores[1] if n_scored >= 2 else None,
    )


_NOTHING_SCORED = RerankQuality(None, None, None, None, None)
_score = attrgetter("score")


def _tied_pairs(values: Sequence[float], strictly: Callable[[Any, Any], bool]) -> int:
    """Pairs of equal values in `values`, sorted so that neighbours compare by `strictly` or
    are equal (sum of c(c-1)/2 over runs of equal values); 0 at C speed in the common case, a
    strictly monotonic sequence."""
    if all(map(strictly, values, islice(values, 1, None))):
        return 0
    return sum(c * (c - 1) // 2 for c in Counter(values).values() if c > 1)
