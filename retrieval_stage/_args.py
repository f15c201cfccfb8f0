"""Argument helpers every reranker shares: checking and copying a call's inputs, ranking.

Kept apart from the HTTP client so `NullReranker` and the in-process rerankers (`local`)
validate and rank exactly as the clients do without importing httpx or the client's flow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, TypeVar, cast

from . import validate

__all__ = [
    "check_sendable",
    "default_text",
    "rank",
    "snapshot",
]

T = TypeVar("T")

_MISSING = object()


def default_text(item: object) -> str:
    """The text of an item: the item itself when it is a str, else its ``.text``."""
    if isinstance(item, str):
        return item
    value = getattr(item, "text", _MISSING)
    if value is _MISSING:
        raise TypeError(
            f"cannot take the text of a {type(item).__name__}: pass text=... to rerank()"
        )
    if not isinstance(value, str):
        raise TypeError(f"{type(item).__name__}.text must be a str, got {type(value).__name__}")
    return value


def snapshot(
    query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
) -> tuple[list[T], list[str], int | None]:
    """Validate arguments and copy items and texts before any I/O.

    The copies fix the indices a response refers to: a caller changing its list while an async
    call is in flight cannot shift them.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    cap = validate.top_k(top_k)
    kept = list(items)
    # The common cases at C speed (one `map`, one set of types): a list of str with no `text`,
    # or a `text` function whose every answer is a str. Anything else is found and named in
    # the loop below, on the texts already taken: `text` is called once per item, in order.
    if text is None and set(map(type, kept)) <= _STR:
        return kept, cast("list[str]", kept.copy()), cap
    extract: Callable[[Any], str] = text if text is not None else default_text
    texts: list[Any] = list(map(extract, kept))
    if not set(map(type, texts)) <= _STR:
        for i, value in enumerate(texts):
            if not isinstance(value, str):
                raise TypeError(f"text of item {i} must be a str, got {type(value).__name__}")
    return kept, texts, cap


_STR = frozenset((str,))


def check_sendable(query: str, texts: Sequence[str]) -> None:
    """ValueError, before any I/O, for text that cannot be sent as UTF-8 JSON (a lone
    surrogate, say): httpx would fail mid-call with an error outside the `RerankError` tree."""
    if query.isascii() and all(map(str.isascii, texts)):  # the usual case, at C speed
        return
    for i, text in enumerate((query, *texts)):
        if text.isascii():
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            what = "the query" if i == 0 else f"the text of item {i - 1}"
            where = f"lone surrogate at {exc.start}"
            raise ValueError(f"{what} is not valid Unicode ({where})") from None


def rank(pairs: list[tuple[int, float]], top_k: int | None) -> list[tuple[int, float]]:
    """Best first; ties keep input order so equal scores never reorder the caller's items.

    The order of the key ``(-score, index)``, by two sorts without a Python key function: by
    index, then stably by score descending (``reverse=True`` keeps equal scores in order).
    """
    ordered = sorted(pairs, key=_INDEX)
    ordered.sort(key=_SCORE, reverse=True)
    return ordered if top_k is None else ordered[:top_k]


_INDEX = itemgetter(0)
_SCORE = itemgetter(1)
