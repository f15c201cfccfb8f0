"""`BM25Recall`: lexical recall over an in-memory corpus, with the `bm25s` library.

The first stage of a recall→rerank pipeline: cheap, exact-term matching that finds a pool of
plausible documents for the reranker to reorder. It is built into the package so the demo and
the eval command run with no search service.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import Any

from ..models import Candidate
from .arguments import check_query, check_unique_ids

__all__ = ["BM25Recall"]


def _bm25s() -> Any:
    """The `bm25s` module, imported on first use (it pulls in numpy; scipy only if installed)."""
    import bm25s

    return bm25s


class BM25Recall:
    """BM25 (Lucene variant) over `documents`, indexed once at construction.

    `documents` are `Candidate`s whose `text` is indexed and whose `id` and `metadata` travel
    to the results. Tokens are lower-cased words of two or more characters, English stop words
    removed, no stemming. `recall(query, k)` returns copies of the best `k` documents with their
    BM25 score as `score`, best first; ties keep corpus order, and documents sharing no term
    with the query are never returned.
    """

    name = "bm25"

    def __init__(
        self,
        documents: Sequence[Candidate],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
    ) -> None:
        self.documents = list(documents)
        check_unique_ids(self.documents)
        self._stopwords = stopwords
        # numpy's CSC build, whether or not scipy is installed: the [cli] extra has no scipy,
        # and a test holds the scores equal to scipy's build where it is.
        self._index = _bm25s().BM25(k1=k1, b=b, csc_backend="numpy")
        if self.documents:
            tokens = self._tokenize([d.text for d in self.documents])
            self._index.index(tokens, show_progress=False)
            self._vocab: dict[str, int] = dict(self._index.vocab_dict)
        else:
            self._vocab = {}

    def __len__(self) -> int:
        return len(self.documents)

    def __repr__(self) -> str:
        return f"BM25Recall({len(self.documents)} documents)"

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        tokens: list[list[str]] = _bm25s().tokenize(
            texts, stopwords=self._stopwords, return_ids=False, show_progress=False
        )
        return tokens

    def recall(self, query: str, k: int) -> list[Candidate]:
        """The best `k` documents for `query` with their BM25 scores, best first."""
        check_query(query, k)
        (terms,) = self._tokenize([query])
        known = [t for t in terms if t in self._vocab]
        if not known or not self.documents:
            return []
        scores: list[float] = [float(s) for s in self._index.get_scores(known).tolist()]
        best = heapq.nsmallest(k, range(len(scores)), key=lambda i: (-scores[i], i))
        return [
            dataclasses.replace(self.documents[i], score=scores[i]) for i in best if scores[i] > 0.0
        ]
