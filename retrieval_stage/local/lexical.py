"""`LexicalReranker`: what runs when the ``[local]`` extra is missing.

It is honest about being a bag-of-words heuristic: its `provider` is ``"lexical"``, which the
stage writes to the span as ``retrieval_stage.provider``, and the command line says so and how
to get a real reranker.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from .._args import rank, snapshot

__all__ = ["LexicalReranker"]

T = TypeVar("T")


_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    (
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "do", "does", "for",
        "from", "how", "i", "if", "in", "into", "is", "it", "its", "of", "on", "or", "that",
        "the", "this", "to", "was", "what", "when", "where", "which", "while", "who", "why",
        "will", "with", "you", "your",
    )
)  # fmt: skip


def _stem(word: str) -> str:
    """A crude suffix strip so that 'files'/'file' and 'sorting'/'sort' meet."""
    for suffix in ("ing", "ies", "ed", "es", "ly", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def _terms(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS and len(w) > 1]


class LexicalReranker:
    """A bag-of-words reranker: no model, no server, and it says so.

    Each text scores in [0, 1]: 0.6 x the IDF-weighted share of the query's terms it contains
    (IDF over the candidates given), 0.2 x the share of adjacent query-term pairs that occur
    within three words of each other, 0.2 x the IDF-weighted share of query terms in its first
    twelve words (a name and first sentence). It rewards coverage and proximity that BM25
    ignores, but understands no meaning: use the cross-encoder or a rerank service for that.
    """

    provider = "lexical"
    model_name = "lexical-coverage-proximity"

    _LEAD_WORDS = 12
    _WINDOW = 3

    def __repr__(self) -> str:
        return "LexicalReranker()"

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with their lexical scores, best first; ties keep input order."""
        kept, texts, cap = snapshot(query, items, text, top_k)
        if not texts:
            return []
        query_terms = list(dict.fromkeys(_terms(query)))
        docs = [_terms(t) for t in texts]
        n = len(docs)
        document_frequency = {term: sum(1 for d in docs if term in set(d)) for term in query_terms}
        idf = {
            t: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for t, df in document_frequency.items()
        }
        scores = [self._score(query_terms, idf, d) for d in docs]
        return [(kept[i], s) for i, s in rank(list(enumerate(scores)), cap)]

    def _score(self, query_terms: list[str], idf: dict[str, float], doc: list[str]) -> float:
        total = sum(idf.values())
        if not query_terms or total <= 0.0 or not doc:
            return 0.0
        present = set(doc)
        coverage = sum(idf[t] for t in query_terms if t in present) / total
        lead = set(doc[: self._LEAD_WORDS])
        lead_share = sum(idf[t] for t in query_terms if t in lead) / total
        pairs = list(itertools.pairwise(query_terms))
        proximity = sum(self._near(doc, a, b) for a, b in pairs) / len(pairs) if pairs else 0.0
        return 0.6 * coverage + 0.2 * proximity + 0.2 * lead_share

    def _near(self, doc: list[str], a: str, b: str) -> bool:
        at_a = [i for i, w in enumerate(doc) if w == a]
        if not at_a:
            return False
        at_b = [i for i, w in enumerate(doc) if w == b]
        return any(abs(i - j) <= self._WINDOW for i in at_a for j in at_b)
