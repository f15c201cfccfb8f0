"""Argument helpers every reranker shares: checking and copying a call's inputs, ranking.

Kept apart from the HTTP client so `NullReranker` and the in-process rerankers (`local`)
validate and rank exactly as the clients do without importing httpx or the client's flow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from . import validate

__all__ = [
    "check_sendable",
    "default_text",
    "masked_url",
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
    extract: Callable[[Any], str] = text if text is not None else default_text
    kept = list(items)
    texts: list[str] = []
    for i, item in enumerate(kept):
        value = extract(item)
        if not isinstance(value, str):
            raise TypeError(f"text of item {i} must be a str, got {type(value).__name__}")
        texts.append(value)
    return kept, texts, cap


def check_sendable(query: str, texts: Sequence[str]) -> None:
    """ValueError, before any I/O, for text that cannot be sent as UTF-8 JSON (a lone
    surrogate, say): httpx would fail mid-call with an error outside the `RerankError` tree."""
    for i, text in enumerate((query, *texts)):
        if text.isascii():
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            what = "the query" if i == 0 else f"the text of item {i - 1}"
            where = f"lone surrogate at {exc.start}"
            raise ValueError(f"{what} is not valid Unicode ({where})") from None


def masked_url(url: object) -> object:
    """`url` with any ``user:password@`` part replaced, for reprs and messages.

    Whatever stands before the last ``@`` is taken for userinfo, whatever the scheme (``host``
    alone, as gRPC endpoints are written, too) and even when a password holds an unencoded
    ``/`` or ``?``: masking too much is harmless, showing a password is not.
    """
    if not isinstance(url, str) or "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"


def rank(pairs: list[tuple[int, float]], top_k: int | None) -> list[tuple[int, float]]:
    """Best first; ties keep input order so equal scores never reorder the caller's items."""
    ordered = sorted(pairs, key=lambda p: (-p[1], p[0]))
    return ordered if top_k is None else ordered[:top_k]
