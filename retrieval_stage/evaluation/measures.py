"""Is the reranker better? Recall's ranking against the reranked one, on judged queries.

Metrics come from `ir-measures` (pytrec_eval underneath): MRR@10, nDCG@10, Recall@k and top-1
accuracy (P@1), each averaged over every judged query, with a paired two-sided permutation test
per metric (sign flips, in numpy) on the per-query differences. The inputs come from `readers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models import Candidate, Reranked, recall_order
from ..stage import RerankStage
from .readers import Qrels

__all__ = [
    "DEFAULT_RESAMPLES",
    "MAX_RESAMPLES",
    "TOP1",
    "EvalReport",
    "MetricComparison",
    "QueryMovement",
    "compare_rankings",
    "evaluate",
    "metric_names",
    "paired_permutation_test",
    "per_query_scores",
]


DEFAULT_RESAMPLES = 9999
"""Sign-flip resamples when the exact test (2**n) would be larger."""

MAX_RESAMPLES = 1_000_000
"""More resamples than this add run time, not precision a report needs (p to ~1e-6)."""

_BATCH_VALUES = 1 << 16
"""Sign-flipped values worked on at once (a batch of resamples x pairs): a few MB whatever
`resamples` is, rather than every resample at once (GBs for a million resamples of a few
dozen queries)."""

TOP1 = "top-1 accuracy"


# -- metrics -----------------------------------------------------------------------------------


def _measures(recall_at: int) -> list[tuple[str, Any]]:
    from ir_measures import RR, P, R, nDCG

    return [
        ("MRR@10", RR @ 10),
        ("nDCG@10", nDCG @ 10),
        (f"Recall@{recall_at}", R @ recall_at),
        (TOP1, P @ 1),
    ]


def metric_names(recall_at: int) -> list[str]:
    """The metric names a report carries, in order."""
    return [name for name, _ in _measures(recall_at)]


def per_query_scores(
    rankings: Mapping[str, Sequence[str]],
    qrels: Qrels,
    query_ids: Sequence[str],
    *,
    recall_at: int = 5,
) -> dict[str, dict[str, float]]:
    """Metric name → query id → value, for each of `query_ids`.

    Each ranking is scored exactly in the order given (ir-measures sees descending scores
    derived from the rank, so tied scores can never be reordered by document id). A query with
    no ranking scores 0 on every metric rather than dropping out of the average.
    """
    import ir_measures

    measures = _measures(recall_at)
    name_of = {measure: name for name, measure in measures}
    wanted = set(query_ids)
    judged = [
        ir_measures.Qrel(qid, doc, grade)
        for qid, docs in qrels.items()
        if qid in wanted
        for doc, grade in docs.items()
    ]
    run = [
        ir_measures.ScoredDoc(qid, doc, float(len(ranking) - position))
        for qid, ranking in rankings.items()
        if qid in wanted
        for position, doc in enumerate(ranking)
    ]
    scores = {name: dict.fromkeys(query_ids, 0.0) for name, _ in measures}
    if judged and run:
        for metric in ir_measures.iter_calc([m for _, m in measures], judged, run):
            scores[name_of[metric.measure]][metric.query_id] = float(metric.value)
    return scores


def paired_permutation_test(
    a: Sequence[float], b: Sequence[float], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> float:
    """Two-sided p-value that paired samples `a` and `b` have the same mean.

    A sign-flip (paired permutation) test of the mean difference, in numpy: exact (every sign
    pattern of the nonzero differences) when ``2**nonzero <= resamples``, else `resamples`
    random flips from `seed` (so a report is reproducible). The p-value is the one
    ``scipy.stats.permutation_test(..., permutation_type="samples")`` gives: twice the smaller
    tail share, with the observed mean counted once more in the Monte Carlo case (add-one), and
    null means within 100·eps of the observed one counted as ties (relative to the differences'
    total as well, so that rounding never splits a tie, where scipy's can); tests hold it to
    scipy's, and to exact rational arithmetic where rounding would split scipy's ties. It
    assumes nothing about the shape of the differences, which for rank metrics on a few
    queries are far from normal. Identical samples, or fewer than two pairs,
    give 1.0. `resamples` is at most `MAX_RESAMPLES`; they are drawn in batches, so memory
    stays small however many there are.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    if isinstance(resamples, bool) or not isinstance(resamples, int):
        raise TypeError(f"resamples must be an int, got {type(resamples).__name__}")
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ValueError(f"resamples must be between 1 and {MAX_RESAMPLES:,}, got {resamples}")
    if len(a) < 2 or all(x == y for x, y in zip(a, b, strict=True)):
        return 1.0  # one pair's two sign flips are equally extreme: no evidence either way
    import numpy as np

    # A flipped pair's difference is exactly -(a - b): the null means are those scipy computes.
    differences = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    nonzero = np.flatnonzero(differences)  # flipping a zero changes nothing
    observed = np.mean(differences)
    # Ties: null means within 100 eps of the observed one, relative to the larger of it and
    # the differences' total, which bounds the rounding any of these means carries. scipy's
    # tolerance is relative to the observed mean alone: where that is 0 in exact arithmetic
    # but computed as 1e-17 (1 - 1/3 is not 2/3 in floats), its p-value depends on the order
    # it sums in. Everywhere else the two are the same.
    scale = max(abs(float(observed)), float(np.sum(np.abs(differences))))
    gamma = np.finfo(np.float64).eps * 100 * scale
    exact = nonzero.size < 63 and 2**nonzero.size <= resamples
    total = 2**nonzero.size if exact else resamples
    rows = max(16, _BATCH_VALUES // len(differences))  # tiny batches cost more in overhead
    generator = np.random.default_rng(seed)
    bits = np.arange(nonzero.size, dtype=np.int64)
    below = above = 0
    for start in range(0, total, rows):
        count = min(rows, total - start)
        flipped = np.zeros((count, len(differences)), dtype=bool)
        if exact:  # pattern k flips the nonzero differences whose bit is set in k
            codes = np.arange(start, start + count, dtype=np.int64)[:, None]
            flipped[:, nonzero] = (codes >> bits) & 1
        else:
            flipped[:, nonzero] = generator.integers(0, 2, size=(count, nonzero.size)) == 1
        means = np.mean(np.where(flipped, -differences, differences), axis=-1)
        below += int(np.count_nonzero(means <= observed + gamma))
        above += int(np.count_nonzero(means >= observed - gamma))
    adjustment = 0 if exact else 1  # Monte Carlo: the observed flip pattern counts once more
    p_below = (below + adjustment) / (total + adjustment)
    p_above = (above + adjustment) / (total + adjustment)
    return min(1.0, min(p_below, p_above) * 2)


# -- the report --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricComparison:
    """One metric averaged over the judged queries, before and after reranking."""

    name: str
    recall: float
    reranked: float
    p_value: float

    @property
    def delta(self) -> float:
        """Reranked minus recall."""
        return self.reranked - self.recall


@dataclass(frozen=True, slots=True)
class QueryMovement:
    """One query: where its first relevant document was, before and after reranking.

    Ranks are 1-based, None when no relevant document is in the ranking. `recall` and
    `reranked` hold the query's value for each metric.
    """

    query_id: str
    query: str
    first_relevant_recall: int | None
    first_relevant_reranked: int | None
    recall: Mapping[str, float]
    reranked: Mapping[str, float]

    @property
    def movement(self) -> str:
        """``↑2``, ``↓1``, ``=``, ``found`` (only reranked has one), ``lost`` or ``-`` (neither)."""
        before, after = self.first_relevant_recall, self.first_relevant_reranked
        if before is None and after is None:
            return "-"
        if before is None:
            return "found"
        if after is None:
            return "lost"
        if after < before:
            return f"↑{before - after}"
        if after > before:
            return f"↓{after - before}"
        return "="


@dataclass(frozen=True, slots=True)
class EvalReport:
    """Recall against reranked over the judged queries.

    `metrics` holds each metric's means and paired p-value; `per_query` each query's
    movement; `top1_recall`/`top1_reranked` count queries whose first result is relevant, out of
    `queries`. `unjudged` lists query ids left out because no document is judged relevant.
    """

    queries: int
    metrics: list[MetricComparison]
    per_query: list[QueryMovement]
    top1_recall: int
    top1_reranked: int
    unjudged: list[str] = field(default_factory=list)
    test: str = "paired two-sided permutation test (sign flips) of the per-query mean difference"

    def metric(self, name: str) -> MetricComparison:
        """The comparison named `name` (``MRR@10``, ``nDCG@10``, ``Recall@5``, ...)."""
        for comparison in self.metrics:
            if comparison.name == name:
                return comparison
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what ``retrieval-stage eval --json`` prints)."""
        return {
            "queries": self.queries,
            "top1": {
                "recall": self.top1_recall,
                "reranked": self.top1_reranked,
                "of": self.queries,
            },
            "metrics": {
                m.name: {
                    "recall": m.recall,
                    "reranked": m.reranked,
                    "delta": m.delta,
                    "p_value": m.p_value,
                }
                for m in self.metrics
            },
            "significance_test": self.test,
            "per_query": [
                {
                    "query_id": q.query_id,
                    "query": q.query,
                    "first_relevant_rank": {
                        "recall": q.first_relevant_recall,
                        "reranked": q.first_relevant_reranked,
                    },
                    "movement": q.movement,
                    "recall": dict(q.recall),
                    "reranked": dict(q.reranked),
                }
                for q in self.per_query
            ],
            "unjudged": list(self.unjudged),
        }


def compare_rankings(
    recall: Mapping[str, Sequence[str]],
    reranked: Mapping[str, Sequence[str]],
    qrels: Qrels,
    *,
    queries: Mapping[str, str] | None = None,
    recall_at: int = 5,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> EvalReport:
    """Score both rankings on every judged query and compare them.

    The judged queries are those of `queries` (default: every query in `qrels`) with at least
    one document graded above 0; the others are listed in `unjudged`. Rankings are document ids,
    best first.
    """
    if isinstance(recall_at, bool) or not isinstance(recall_at, int) or recall_at < 1:
        raise ValueError(f"recall_at must be an int >= 1, got {recall_at!r}")
    texts: Mapping[str, str] = queries if queries is not None else dict.fromkeys(qrels, "")
    judged = [qid for qid in texts if any(g > 0 for g in qrels.get(qid, {}).values())]
    unjudged = [qid for qid in texts if qid not in set(judged)]
    before = per_query_scores(recall, qrels, judged, recall_at=recall_at)
    after = per_query_scores(reranked, qrels, judged, recall_at=recall_at)
    metrics = [
        MetricComparison(
            name=name,
            recall=_mean([before[name][q] for q in judged]),
            reranked=_mean([after[name][q] for q in judged]),
            p_value=paired_permutation_test(
                [after[name][q] for q in judged],
                [before[name][q] for q in judged],
                resamples=resamples,
                seed=seed,
            ),
        )
        for name in metric_names(recall_at)
    ]
    per_query = [
        QueryMovement(
            query_id=qid,
            query=texts[qid],
            first_relevant_recall=_first_relevant(recall.get(qid, ()), qrels[qid]),
            first_relevant_reranked=_first_relevant(reranked.get(qid, ()), qrels[qid]),
            recall={name: before[name][qid] for name in before},
            reranked={name: after[name][qid] for name in after},
        )
        for qid in judged
    ]
    return EvalReport(
        queries=len(judged),
        metrics=metrics,
        per_query=per_query,
        top1_recall=round(sum(before[TOP1].values())),
        top1_reranked=round(sum(after[TOP1].values())),
        unjudged=unjudged,
    )


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _first_relevant(ranking: Sequence[str], judged: Mapping[str, int]) -> int | None:
    for rank, doc in enumerate(ranking, start=1):
        if judged.get(doc, 0) > 0:
            return rank
    return None


def evaluate(
    stage: RerankStage,
    queries: Mapping[str, str],
    qrels: Qrels,
    candidates: Mapping[str, Sequence[Candidate]],
    *,
    recall_at: int = 5,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    rerank: Callable[[str, str, list[Candidate]], Sequence[Reranked]] | None = None,
) -> EvalReport:
    """Rerank each judged query's candidates with `stage` and compare against recall order.

    Recall's ranking is the candidates by their recall score (`recall_ranking`); the stage is
    given them in that order, so scores the reranker ties keep recall's order. The reranked
    ranking is the stage's output. `progress` is called with each query id once it is
    reranked. A stage built with ``on_error="raise"`` stops the evaluation at the first
    reranker failure; with ``"fallback"`` a failed query keeps its recall order (and so counts
    as no change). `rerank(query_id, query, candidates)`, when given, replaces
    ``stage.run(query, candidates)`` (``eval --phoenix`` runs each query as a traced pipeline).
    """
    judged = [qid for qid in queries if any(g > 0 for g in qrels.get(qid, {}).values())]
    recall: dict[str, list[str]] = {}
    reranked: dict[str, list[str]] = {}
    for qid in judged:
        given = list(candidates.get(qid, ()))
        # Recall order in: a reranker keeps tied scores in input order, so ties then mean
        # "no change" rather than a move back to file order.
        pool = [given[i] for i in recall_order(given)]
        recall[qid] = [c.id for c in pool]
        outputs = (
            stage.run(queries[qid], pool) if rerank is None else rerank(qid, queries[qid], pool)
        )
        reranked[qid] = [r.candidate.id for r in outputs]
        if progress is not None:
            progress(qid)
    return compare_rankings(
        recall,
        reranked,
        qrels,
        queries=queries,
        recall_at=recall_at,
        resamples=resamples,
        seed=seed,
    )
