"""Evaluation: is the reranker better than recall, on judged queries? (the ``[cli]`` extra)

- `readers`: queries, qrels and candidate runs from TREC files or JSON lines;
- `measures`: MRR@10, nDCG@10, Recall@k, top-1 accuracy, paired permutation tests, `evaluate`;
- `corpus`: the bundled corpus (standard-library docstrings) and its example judgements.
"""

from .measures import (
    DEFAULT_RESAMPLES,
    MAX_RESAMPLES,
    EvalReport,
    MetricComparison,
    QueryMovement,
    compare_rankings,
    evaluate,
    metric_names,
    paired_permutation_test,
    per_query_scores,
)
from .readers import (
    EvalInputError,
    Qrels,
    read_candidates,
    read_qrels,
    read_queries,
    recall_ranking,
)

__all__ = [
    "DEFAULT_RESAMPLES",
    "MAX_RESAMPLES",
    "EvalInputError",
    "EvalReport",
    "MetricComparison",
    "Qrels",
    "QueryMovement",
    "compare_rankings",
    "evaluate",
    "metric_names",
    "paired_permutation_test",
    "per_query_scores",
    "read_candidates",
    "read_qrels",
    "read_queries",
    "recall_ranking",
]
