"""The neutral reranker contract: anything with this `rerank` method can drive the stage.

`RerankClient`, `NullReranker` and any user class with a matching `rerank` satisfy `Reranker`;
`AsyncRerankClient` and `AsyncNullReranker` satisfy `AsyncReranker`. Conformance is structural:
no base class to inherit. mypy checks the full signature; ``isinstance`` (both protocols are
runtime-checkable) only checks that a `rerank` attribute exists, so at run time it cannot tell
a sync reranker from an async one (`RerankStage` looks at the method itself for that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["AsyncReranker", "Reranker"]

T = TypeVar("T")


@runtime_checkable
class Reranker(Protocol):
    """Scores items against a query and returns them best first, as the caller's own objects."""

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with their scores, best first; `top_k` keeps the best k (0/None: all)."""
        ...


@runtime_checkable
class AsyncReranker(Protocol):
    """The awaitable twin of `Reranker`."""

    async def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with their scores, best first; `top_k` keeps the best k (0/None: all)."""
        ...
