"""Hybrid recall: BM25 and dense recall fused by reciprocal rank fusion.

`HybridRecall` fuses BM25's and dense recall's rankings by reciprocal rank fusion (Cormack et
al., 2009): each document scores ``sum(1 / (k + rank))`` over the rankings it appears in, with
``k = 60``. It needs no score calibration between the two, and is robust where either fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..models import Candidate
from .arguments import check_query

if TYPE_CHECKING:
    from .bm25 import BM25Recall
    from .dense import DenseRecall

__all__ = ["RRF_K", "HybridRecall", "reciprocal_rank_fusion"]

RRF_K = 60
"""Reciprocal rank fusion's constant: damps the weight of the very first ranks (the paper's 60)."""


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], *, k: int = RRF_K
) -> list[tuple[str, float]]:
    """Ids by their fused score ``sum(1 / (k + rank))`` (rank 1-based), best first.

    Ties go to the id met first, reading the rankings in the order given. An id listed twice
    in one ranking counts at its best rank.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    fused: dict[str, float] = {}
    for ranking in rankings:
        seen: set[str] = set()
        for rank, doc in enumerate(ranking, start=1):
            if doc in seen:
                continue
            seen.add(doc)
            fused[doc] = fused.get(doc, 0.0) + 1.0 / (k + rank)
    first = {doc: i for i, doc in enumerate(fused)}
    return sorted(fused.items(), key=lambda pair: (-pair[1], first[pair[0]]))


class HybridRecall:
    """BM25 and dense recall fused by reciprocal rank fusion; the fused score is `score`.

    Each recaller contributes its best `depth` documents (default: ``max(k, 100)``): a document
    deep in one list and high in the other still surfaces. `bm25` and `dense` should index the
    same corpus; documents are matched by id.
    """

    name = "hybrid"

    def __init__(
        self,
        bm25: BM25Recall,
        dense: DenseRecall,
        *,
        rrf_k: int = RRF_K,
        depth: int | None = None,
    ) -> None:
        if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 0:
            raise ValueError(f"rrf_k must be an int >= 0, got {rrf_k!r}")
        if depth is not None and (
            isinstance(depth, bool) or not isinstance(depth, int) or depth < 1
        ):
            raise ValueError(f"depth must be an int >= 1 or None, got {depth!r}")
        self.bm25 = bm25
        self.dense = dense
        self.rrf_k = rrf_k
        self.depth = depth

    def __len__(self) -> int:
        return len(self.dense)

    def __repr__(self) -> str:
        return f"HybridRecall({self.bm25!r}, {self.dense!r}, rrf_k={self.rrf_k})"

    def recall(self, query: str, k: int) -> list[Candidate]:
        """The best `k` documents by fused rank, each with its fused score, best first."""
        check_query(query, k)
        depth = self.depth if self.depth is not None else max(k, 100)
        lexical = self.bm25.recall(query, depth)
        semantic = self.dense.recall(query, depth)
        by_id = {c.id: c for c in semantic}
        by_id.update({c.id: c for c in lexical})
        fused = reciprocal_rank_fusion(
            [[c.id for c in lexical], [c.id for c in semantic]], k=self.rrf_k
        )
        return [dataclasses.replace(by_id[doc], score=score) for doc, score in fused[:k]]
