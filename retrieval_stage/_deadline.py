"""Every deadline: one call's time budget (`Deadline`), and the one a chain shares with its tiers.

A `Deadline` is one total budget for a call, over every attempt and every sub-batch: httpx only
has per-phase timeouts (encode/httpx#1450), so a client asks it for the time left before each
request and before each wait. A `RerankerChain` arms one overall deadline and tries its tiers
inside it (`sharing`); each of our clients, when a call starts, takes the smaller of its own
`timeout` and the time the shared deadline has left (`remaining`), so a tier that hangs uses
only its share and the next tier gets the rest. The shared deadline travels in a context
variable: through `asyncio.to_thread`, tasks and any user code between the chain and a client,
with no argument to thread through.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["Deadline", "remaining", "sharing"]


@dataclass
class Deadline:
    """One total time budget for a call, over every attempt and every sub-batch."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = math.nan

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(self.seconds - (self.clock() - self.started), 0.0)

    def expired(self) -> bool:
        """Whether no time is left."""
        return self.remaining() <= 0.0


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
