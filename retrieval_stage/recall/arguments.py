"""The argument rules every recaller shares: a str query, a k >= 1, unique document ids."""

from __future__ import annotations

from collections.abc import Sequence

from ..models import Candidate

__all__ = ["check_query", "check_unique_ids"]


def check_query(query: str, k: int) -> None:
    """TypeError or ValueError naming what is wrong with a recall call's arguments."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")


def check_unique_ids(documents: Sequence[Candidate]) -> None:
    """ValueError naming the first id that appears twice: recall results join by id."""
    seen: set[str] = set()
    for document in documents:
        if document.id in seen:
            raise ValueError(f"document ids must be unique; {document.id!r} appears twice")
        seen.add(document.id)
