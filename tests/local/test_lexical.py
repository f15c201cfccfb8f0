"""`LexicalReranker`: the same scores as the first (quadratic) implementation on ordinary
texts, and work linear in the text on hostile ones (the server's ``--reranker lexical`` and
the command line's fallback run it on whatever a caller sends).
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from retrieval_stage.evaluation.corpus import EXAMPLE_QUERIES, data_path, load_corpus
from retrieval_stage.local import LexicalReranker
from retrieval_stage.local import lexical as lexical_module
from retrieval_stage.local.lexical import _terms


class _FirstLexical:
    """The first implementation, kept verbatim as the reference for scores: every occurrence
    of one query term compared with every occurrence of the next, and a set of each text built
    once per query term."""

    _LEAD_WORDS = 12
    _WINDOW = 3

    def scores(self, query: str, texts: list[str]) -> list[float]:
        query_terms = list(dict.fromkeys(_terms(query)))
        docs = [_terms(t) for t in texts]
        n = len(docs)
        document_frequency = {term: sum(1 for d in docs if term in set(d)) for term in query_terms}
        idf = {
            t: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for t, df in document_frequency.items()
        }
        return [self._score(query_terms, idf, d) for d in docs]

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


def _ranked_by_reference(query: str, texts: list[str]) -> list[tuple[int, float]]:
    scores = _FirstLexical().scores(query, texts)
    return sorted(enumerate(scores), key=lambda pair: (-pair[1], pair[0]))


def _queries() -> list[str]:
    lines = data_path(EXAMPLE_QUERIES).read_text(encoding="utf-8").splitlines()
    return [line.split("\t", 1)[1] for line in lines if line.strip()]


def test_the_bundled_corpus_scores_exactly_as_the_first_implementation() -> None:
    texts = [c.text for c in load_corpus()]
    reranker = LexicalReranker()
    compared = 0
    for number, query in enumerate(_queries()):
        # 50 candidates per query, as the example run recalls, from a different stretch each.
        start = (number * 61) % (len(texts) - 50)
        chosen = texts[start : start + 50]
        got = reranker.rerank(query, list(range(50)), text=chosen.__getitem__)
        assert got == _ranked_by_reference(query, chosen), query
        compared += len(got)
    assert compared == 50 * len(_queries())


def test_texts_full_of_query_terms_score_exactly_as_the_first_implementation() -> None:
    """Repeated, adjacent, distant and stemmed query terms: every branch of the proximity test."""
    rng = random.Random(41)
    vocabulary = ["sort", "sorting", "files", "file", "tree", "delete", "directory", "json"]
    vocabulary += ["string", "the", "of", "a", "to", "dict"]
    filler = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
    reranker = LexicalReranker()
    for _ in range(300):
        query = " ".join(rng.choices(vocabulary, k=rng.randint(0, 6)))
        texts = [
            " ".join(rng.choices(vocabulary + filler * rng.randint(0, 3), k=rng.randint(0, 40)))
            for _ in range(rng.randint(1, 12))
        ]
        got = reranker.rerank(query, list(range(len(texts))), text=texts.__getitem__)
        assert got == _ranked_by_reference(query, texts), (query, texts)


def _hostile(words: int) -> tuple[str, list[str]]:
    """A query of two terms and a text where each occurs `words` times, never near the other:
    the first implementation compared words x words positions, and held the model thread for
    hours at the 2 MB payload limit."""
    text = " ".join(["alpha"] * words + ["filler"] * 10 + ["omega"] * words)
    return "alpha omega", [text, "alpha then omega"]


def _lines_run(call: Callable[[], Any]) -> int:
    """Lines of `lexical.py` executed during `call`: a count of operations no clock can blur."""
    target = lexical_module.__file__
    count = 0

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame: FrameType, event: str, _arg: Any) -> Any:
        return local if frame.f_code.co_filename == target else None

    sys.settrace(calls)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_the_work_grows_linearly_with_the_text_on_a_hostile_one() -> None:
    reranker = LexicalReranker()

    def lines(words: int) -> int:
        query, texts = _hostile(words)
        return _lines_run(lambda: reranker.rerank(query, texts))

    small, large = lines(500), lines(2000)
    # Four times the text: linear work is about four times the lines, quadratic sixteen.
    assert large < 5 * small, (small, large)


def test_the_idf_pass_grows_linearly_with_query_terms_times_texts() -> None:
    """Many distinct query terms over many long texts: each text is read once, not once per
    query term."""
    reranker = LexicalReranker()

    def lines(terms: int) -> int:
        query = " ".join(f"term{i}" for i in range(terms))
        texts = [" ".join(f"word{i}" for i in range(terms)) for _ in range(8)]
        return _lines_run(lambda: reranker.rerank(query, list(range(8)), text=texts.__getitem__))

    small, large = lines(200), lines(800)
    assert large < 5 * small, (small, large)


PAYLOAD_LIMIT = 2_000_000
"""The server's default request body limit (TEI's), in bytes."""
GENEROUS_BOUND_S = 60.0
"""Far above the second or two a request at the payload limit takes on a busy shared machine,
and far below the hours the first implementation took on it."""


@pytest.mark.parametrize("shape", ["one term pair", "many distinct terms"])
def test_a_request_at_the_payload_limit_finishes_within_a_generous_bound(shape: str) -> None:
    if shape == "one term pair":
        words = PAYLOAD_LIMIT // 2 // len("alpha ") // 2
        query, texts = _hostile(words)
    else:
        half = [f"t{i}" for i in range(PAYLOAD_LIMIT // 2 // 8)]
        query = " ".join(half[: len(half) // 4])
        texts = [" ".join(half[i::32]) for i in range(32)]
    assert sum(len(t) for t in texts) + len(query) <= PAYLOAD_LIMIT
    started = time.monotonic()
    result = LexicalReranker().rerank(query, list(range(len(texts))), text=texts.__getitem__)
    elapsed = time.monotonic() - started
    assert len(result) == len(texts)
    assert elapsed < GENEROUS_BOUND_S, elapsed
