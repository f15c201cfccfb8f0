"""Recall: the first stage of a recall -> rerank pipeline (the ``[cli]`` extra).

- `bm25`: `BM25Recall`, lexical recall with the `bm25s` library;
- `dense`: `DenseRecall`, nearest embeddings (the ``[local]`` extra), cached on disk;
- `fusion`: `HybridRecall`, BM25 and dense fused by reciprocal rank fusion;
- `arguments`: the checks every recaller shares.

Each has the `pipeline.Recall` shape: ``recall(query, k)`` returns copies of the best `k`
`Candidate`s with their score as `score`, best first.
"""

from .bm25 import BM25Recall
from .dense import DenseRecall
from .fusion import RRF_K, HybridRecall, reciprocal_rank_fusion

__all__ = ["RRF_K", "BM25Recall", "DenseRecall", "HybridRecall", "reciprocal_rank_fusion"]
