"""`LexicalReranker`: what runs when the ``[local]`` extra is missing.

It is honest about being a bag-of-words heuristic: its `provider` is ``"lexical"``, which the
stage writes to the span as ``retrieval_stage.provider``, and the command line says so and how
to get a real reranker.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from .._args import rank, snapshot

__all__ = ["LexicalReranker", "word_count"]

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


def word_count(text: str) -> int:
    """Words the reranker reads in `text` (stop words included): what its work grows with."""
    return sum(1 for _ in _WORD.finditer(text.lower()))


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
        # One pass over each text: its distinct terms, counted once per text for the IDF.
        wanted = {term: k for k, term in enumerate(query_terms)}
        present = [{w for w in set(d) if w in wanted} for d in docs]
        document_frequency = dict.fromkeys(query_terms, 0)
        for terms in present:
            for term in terms:
                document_frequency[term] += 1
        n = len(docs)
        idf = {
            t: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for t, df in document_frequency.items()
        }
        total = sum(idf.values())
        scores = [
            self._score(query_terms, wanted, idf, total, d, p)
            for d, p in zip(docs, present, strict=True)
        ]
        return [(kept[i], s) for i, s in rank(list(enumerate(scores)), cap)]

    def _score(
        self,
        query_terms: list[str],
        wanted: dict[str, int],
        idf: dict[str, float],
        total: float,
        doc: list[str],
        present: set[str],
    ) -> float:
        """One text's score in time linear in the text (never in query x text): only the
        query terms it holds are visited, in the query's order so the sums add up as ever."""
        if not query_terms or total <= 0.0 or not doc:
            return 0.0
        held = sorted(wanted[t] for t in present)
        coverage = sum(idf[query_terms[k]] for k in held) / total
        lead = {w for w in doc[: self._LEAD_WORDS] if w in wanted}
        lead_share = sum(idf[query_terms[k]] for k in sorted(wanted[t] for t in lead)) / total
        pairs = len(query_terms) - 1
        if pairs < 1:
            return 0.6 * coverage + 0.2 * lead_share
        positions: dict[str, list[int]] = {}
        for i, w in enumerate(doc):
            if w in present:
                positions.setdefault(w, []).append(i)
        near = 0
        for k in held:
            following = query_terms[k + 1] if k + 1 < len(query_terms) else None
            if following in present:
                near += _near(positions[query_terms[k]], positions[following], self._WINDOW)
        return 0.6 * coverage + 0.2 * (near / pairs) + 0.2 * lead_share


def _near(at_a: list[int], at_b: list[int], window: int) -> bool:
    """Whether some position in `at_a` is within `window` of some position in `at_b`; both
    ascending. One merge walk: linear in the two lists, where comparing every pair was not."""
    j = 0
    for i in at_a:
        while j < len(at_b) and at_b[j] < i - window:
            j += 1
        if j == len(at_b):
            return False
        if at_b[j] <= i + window:
            return True
    return False
