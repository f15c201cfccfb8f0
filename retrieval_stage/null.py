"""`NullReranker`: the reranker that changes nothing, for when no service is configured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from .client import snapshot

__all__ = ["NullReranker"]

T = TypeVar("T")


class NullReranker:
    """One result per item, in input order, each with the uniform score 0.0.

    The uniform score carries no ranking signal, so a stable sort keeps the caller's order, and
    the result has the same shape as a real reranker's, so callers need no special case.
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
        """The items in input order with score 0.0, cut to `top_k`."""
        kept, _, cap = snapshot(query, items, text, top_k)
        chosen = kept if cap is None else kept[:cap]
        return [(item, 0.0) for item in chosen]

    def __repr__(self) -> str:
        return "NullReranker()"
