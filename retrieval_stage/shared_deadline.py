"""A deadline shared by the calls made in one context: the time a `RerankerChain` has left.

The chain arms one overall deadline and tries its tiers one after another inside it; each of
our clients, when a call starts, takes the smaller of its own `timeout` and the time the shared
deadline has left (`remaining`), so a tier that hangs uses only its share and the next tier
gets the rest. The deadline travels in a context variable: through `asyncio.to_thread`, tasks
and any user code between the chain and a client, with no argument to thread through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["remaining", "sharing"]

_SHARED: ContextVar[Callable[[], float] | None] = ContextVar(
    "retrieval_stage_shared_deadline", default=None
)


def remaining() -> float | None:
    """Seconds the shared deadline has left (never negative), or None when none is armed."""
    left = _SHARED.get()
    return None if left is None else max(left(), 0.0)


@contextmanager
def sharing(left: Callable[[], float]) -> Iterator[None]:
    """Within the block, calls that start take at most `left()` seconds (an inner deadline
    armed inside an outer one can only shorten it)."""
    outer = _SHARED.get()
    if outer is None:
        combined = left
    else:

        def combined() -> float:
            return min(left(), outer())

    token = _SHARED.set(combined)
    try:
        yield
    finally:
        _SHARED.reset(token)
