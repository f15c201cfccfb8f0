"""Fake rerankers and a fake recall that many test files share.

Each fake gives an answer a test can compute by hand, so a test states what the stage, the
pipeline or the exporter must do with it. They satisfy `Reranker`/`AsyncReranker` structurally,
with no base class, as a user's own reranker would. `provider` and `model_name` are plain
attributes (``None`` by default, which the stage treats as absent) because the stage reads
them into the span; a test that names them in its assertions passes them in.

Fakes that record something only one test cares about (the current span, a hang, a scripted
answer) stay in that test's file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from retrieval_stage import Candidate, RerankResponse

__all__ = ["AsyncByLength", "ByLength", "Failing", "FixedRecall", "FixedScores", "Reverse"]

T = TypeVar("T")


class ByLength:
    """Scores each item by the length of its text, longest first; ties keep input order.

    `top_k` keeps the best k (0/None: all). Without `text`, an item's text is ``str(item)``,
    so plain strings work too. `calls` counts the calls, for tests that check the reranker
    was (or was not) asked.
    """

    def __init__(self, *, provider: str | None = None, model_name: str | None = None) -> None:
        self.provider = provider
        self.model_name = model_name
        self.calls = 0

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with their lengths as scores, best first."""
        self.calls += 1
        get = text or str
        ranked = sorted(((i, float(len(get(i)))) for i in items), key=lambda p: -p[1])
        return ranked[:top_k] if top_k else ranked


class AsyncByLength(ByLength):
    """The awaitable twin of `ByLength`: the same scores, from a coroutine."""

    async def rerank(  # type: ignore[override]
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with their lengths as scores, best first."""
        return ByLength.rerank(self, query, items, text=text, top_k=top_k)


class Failing:
    """Raises the exception it was given on every call: a provider that is down.

    The same instance is raised each time, so a test can match its type and message (the
    stage copies both into the span's status).
    """

    def __init__(
        self,
        error: BaseException,
        /,
        *,
        provider: str | None = None,
        model_name: str | None = None,
    ) -> None:
        self.error = error
        self.provider = provider
        self.model_name = model_name

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """Never returns."""
        raise self.error


class FixedScores:
    """Gives each candidate the score listed for its id, best first.

    For tests of what happens after scoring (thresholds, `top_k`, the span's output
    documents), where the scores must be chosen, not derived. A candidate whose id is not
    listed is a bug in the test: it raises ``KeyError``.
    """

    def __init__(self, scores: Mapping[str, float]) -> None:
        self.scores = scores

    def rerank(
        self,
        query: str,
        items: Sequence[Candidate],
        *,
        text: Callable[[Candidate], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[Candidate, float]]:
        """The candidates with their listed scores, best first."""
        ranked = sorted(((c, self.scores[c.id]) for c in items), key=lambda p: -p[1])
        return ranked[:top_k] if top_k else ranked


class Reverse:
    """The items in reverse order with scores 1.0, 0.99, 0.98, ...: every rank moves.

    It also answers `rerank_response` (one request, one batch), the richer method the stage
    prefers, so the span carries the request counts a real client's would.
    """

    def __init__(self, *, provider: str | None = None, model_name: str | None = None) -> None:
        self.provider = provider
        self.model_name = model_name

    def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """The reversed items with descending scores, cut to `top_k` (0/None: all)."""
        chosen = list(reversed(items))[: top_k or None]
        return RerankResponse(
            results=[(item, 1.0 - i / 100) for i, item in enumerate(chosen)], requests=1, batches=1
        )

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The results of `rerank_response`."""
        return self.rerank_response(query, items, text=text, top_k=top_k).results


class FixedRecall:
    """A recall that always answers the same candidates (the first k), noting each request.

    `asked` holds each ``(query, k)`` it was called with, for tests of what the pipeline asks.
    """

    name = "fixed"

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self.candidates = list(candidates)
        self.asked: list[tuple[str, int]] = []

    def recall(self, query: str, k: int) -> list[Candidate]:
        """The first `k` of the fixed candidates."""
        self.asked.append((query, k))
        return self.candidates[:k]
