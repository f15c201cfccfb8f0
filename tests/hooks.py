"""Test hooks for the clients: the retry jitter and the deadline clock.

They are not constructor arguments (issue 27: the public signatures carry only what a user
sets); a test replaces them in the client's plan (``random``: 0..1, as `random.random`;
``clock``: seconds, as `time.monotonic`) before using it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

C = TypeVar("C")


def hooked(
    client: C,
    *,
    random: Callable[[], float] | None = None,
    clock: Callable[[], float] | None = None,
) -> C:
    """`client` itself, with its jitter source and/or clock replaced."""
    plan = client._plan  # type: ignore[attr-defined]
    client._plan = dataclasses.replace(  # type: ignore[attr-defined]
        plan,
        random=plan.random if random is None else random,
        clock=plan.clock if clock is None else clock,
    )
    return client


def hooked_chain(chain: C, *, clock: Callable[[], float]) -> C:
    """`chain` (a `RerankerChain` or `AsyncRerankerChain`) itself, its deadline and every
    tier's breaker on `clock` (seconds, as `time.monotonic`)."""
    chain._clock = clock  # type: ignore[attr-defined]
    for breaker in chain.breakers:  # type: ignore[attr-defined]
        breaker._clock = clock
    return chain
