"""The neutral reranker contract, how any reranker is called, and how its answer is checked.

Anything with this `rerank` method can drive the stage or be a chain's tier.

`RerankClient`, `NullReranker` and any user class with a matching `rerank` satisfy `Reranker`;
`AsyncRerankClient` and `AsyncNullReranker` satisfy `AsyncReranker`. Conformance is structural:
no base class to inherit. mypy checks the full signature; ``isinstance`` (both protocols are
runtime-checkable) only checks that a `rerank` attribute exists, so at run time it cannot tell
a sync reranker from an async one (`RerankStage` looks at the method itself for that).

`RerankStage` and the failover chain call a reranker the same way (`call_reranker`,
`acall_reranker`: ``rerank_response`` when it has one, else ``rerank``) and check what it
answered the same way (`map_results`, `checked_answer`): every result one of the items given,
by identity, at most once, with a finite score.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Protocol, TypeVar, runtime_checkable

from .errors import RerankProtocolError
from .models import RerankResponse

__all__ = [
    "AsyncReranker",
    "Reranker",
    "acall_reranker",
    "call_reranker",
    "checked_answer",
    "map_results",
    "str_attr",
]

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


def str_attr(obj: Any, name: str) -> str | None:
    """`obj.name` when it is a str (a reranker's ``provider``, ``model_name``...), else None."""
    value = getattr(obj, name, None)
    return value if isinstance(value, str) else None


def call_reranker(
    reranker: Any,
    query: str,
    items: Sequence[T],
    *,
    text: Callable[[T], str] | None,
    top_k: int | None,
) -> RerankResponse[T]:
    """A sync reranker's answer: ``rerank_response`` (usage, model, request counts) when it
    has one, else ``rerank``'s results."""
    detailed = getattr(reranker, "rerank_response", None)
    if callable(detailed):
        result: RerankResponse[T] = detailed(query, items, text=text, top_k=top_k)
        return result
    return RerankResponse(results=reranker.rerank(query, items, text=text, top_k=top_k))


async def acall_reranker(
    reranker: Any,
    query: str,
    items: Sequence[T],
    *,
    text: Callable[[T], str] | None,
    top_k: int | None,
) -> RerankResponse[T]:
    """The awaitable twin of `call_reranker`, for an async reranker."""
    detailed = getattr(reranker, "rerank_response", None)
    if callable(detailed):
        result: RerankResponse[T] = await detailed(query, items, text=text, top_k=top_k)
        return result
    return RerankResponse(results=await reranker.rerank(query, items, text=text, top_k=top_k))


def map_results(
    candidates: Sequence[Any],
    results: Sequence[tuple[Any, Any]],
    top_k: int | None = None,
) -> list[tuple[int, float]]:
    """(input position, score) for each result, checked against the candidates given.

    Any reranker's output passes through here: an item that is not one of the candidates (by
    identity), a candidate returned more often than given, a malformed pair, a score that is
    not a finite number, or fewer results than min(top_k, n) (a candidate silently dropped)
    raises `RerankProtocolError`. Sorted best first, ties in input order.
    """
    wanted = len(candidates) if top_k is None else min(top_k, len(candidates))
    if len(results) < wanted:
        raise RerankProtocolError(
            f"reranker returned {len(results)} results for {len(candidates)} candidates; "
            f"expected {wanted}"
        )
    mapped = _mapped_plain(candidates, results)
    if mapped is None:  # anything unusual: the checks below, result by result
        mapped = _mapped_checked(candidates, results)
    # Best first, ties in input order: a sort by position, then a stable sort by score
    # descending (reverse=True keeps equal keys in order), both without a Python key function.
    mapped.sort()
    mapped.sort(key=itemgetter(1), reverse=True)
    return mapped


def checked_answer(
    items: Sequence[Any], results: Any, top_k: int | None, *, who: str
) -> list[tuple[int, float]]:
    """`map_results`, for an answer that may not even be a list of pairs (a user's
    reranker): anything that is not a valid answer raises `RerankProtocolError`, which
    names `who` answered when the answer could not be read at all."""
    try:
        return map_results(items, results, top_k)
    except RerankProtocolError:
        raise
    except Exception as exc:
        raise RerankProtocolError(
            f"{who} answered something that is not a list of (item, score) pairs "
            f"({type(exc).__name__})"
        ) from None


def _mapped_plain(
    candidates: Sequence[Any], results: Sequence[tuple[Any, Any]]
) -> list[tuple[int, float]] | None:
    """The common case in one pass: distinct candidates, each result an (item, float) tuple
    naming a candidate not yet returned, every score finite. None when anything differs, so
    that `_mapped_checked` finds and names the first offending result."""
    positions = {id(candidate): i for i, candidate in enumerate(candidates)}
    if len(positions) != len(candidates):  # one object given twice: positions are lists there
        return None
    take = positions.pop
    mapped: list[tuple[int, float]] = []
    append = mapped.append
    for pair in results:
        if type(pair) is not tuple or len(pair) != 2:
            return None
        i = take(id(pair[0]), None)
        score = pair[1]
        if i is None or type(score) is not float:
            return None
        append((i, score))
    if not all(map(math.isfinite, map(itemgetter(1), mapped))):
        return None
    return mapped


def _mapped_checked(
    candidates: Sequence[Any], results: Sequence[tuple[Any, Any]]
) -> list[tuple[int, float]]:
    """(input position, score) per result, unsorted, each result checked in turn; raises
    `RerankProtocolError` naming the first one that is not a valid answer."""
    positions: dict[int, list[int]] = {}
    for i, candidate in enumerate(candidates):
        positions.setdefault(id(candidate), []).append(i)
    mapped: list[tuple[int, float]] = []
    for n, pair in enumerate(results):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise RerankProtocolError(f"reranker result {n} is not an (item, score) pair")
        item, score = pair
        free = positions.get(id(item))
        if not free:
            raise RerankProtocolError(
                f"reranker result {n} is not one of the candidates given, or is returned twice"
            )
        if type(score) is float:  # the common case; the ABC check below is slow
            value = score
        elif isinstance(score, bool) or not isinstance(score, numbers.Real):
            raise RerankProtocolError(f"reranker result {n}: score is a {type(score).__name__}")
        else:
            try:
                value = float(score)
            except OverflowError:
                value = math.inf
        if not math.isfinite(value):
            raise RerankProtocolError(f"reranker result {n}: score is not a finite number")
        mapped.append((free.pop(0), value))
    return mapped
