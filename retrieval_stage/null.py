"""The rerankers that change nothing, for when no rerank service is configured.

`NullReranker` (sync) and `AsyncNullReranker` (awaitable) answer exactly like the HTTP clients
do, down to `rerank_response` and the context-manager methods, so code written against a real
client runs unchanged when configuration selects no service.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ._args import snapshot
from .models import RerankResponse

__all__ = ["AsyncNullReranker", "NullReranker"]

T = TypeVar("T")


def _null_response(
    query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
) -> RerankResponse[T]:
    """Every item in input order with score 0.0, cut to `top_k`; arguments checked as a client."""
    kept, _, cap = snapshot(query, items, text, top_k)
    chosen = kept if cap is None else kept[:cap]
    return RerankResponse(results=[(item, 0.0) for item in chosen])


class NullReranker:
    """One result per item, in input order, each with the uniform score 0.0.

    The uniform score carries no ranking signal, so a stable sort keeps the caller's order, and
    the result has the same shape as a real reranker's, so callers need no special case.
    Arguments are validated as the clients validate them (a negative `top_k` raises
    `ValueError`, an item without text raises `TypeError`), so a bug does not hide behind an
    unconfigured service.
    """

    provider = "null"
    model_name: str | None = None

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items in input order with score 0.0, cut to `top_k` (None or 0: all)."""
        return _null_response(query, items, text, top_k).results

    def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """Like `rerank`, as a `RerankResponse` that reports no usage and no requests."""
        return _null_response(query, items, text, top_k)

    def close(self) -> None:
        """Nothing to release; here so callers can close any reranker."""

    def __enter__(self) -> NullReranker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "NullReranker()"


class AsyncNullReranker:
    """The awaitable twin of `NullReranker`, for code that awaits ``reranker.rerank(...)``."""

    provider = "null"
    model_name: str | None = None

    async def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items in input order with score 0.0, cut to `top_k` (None or 0: all)."""
        return _null_response(query, items, text, top_k).results

    async def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """Like `rerank`, as a `RerankResponse` that reports no usage and no requests."""
        return _null_response(query, items, text, top_k)

    async def aclose(self) -> None:
        """Nothing to release; here so callers can close any reranker."""

    async def __aenter__(self) -> AsyncNullReranker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "AsyncNullReranker()"
