"""`CircuitBreaker`: one reranker tier's circuit, as a small state machine with no I/O.

Closed, a tier is tried on every call; after `failure_threshold` consecutive failures it opens
and is skipped (no request at all) until `cooldown` seconds have passed on the injected
`clock`; then one call is let through as a probe (half-open): its success closes the circuit,
its failure opens it again for another cooldown. While the probe is out, other calls skip the
tier.

Every decision is taken under one lock and never waits while holding it, so the breaker is
safe across threads and across asyncio tasks alike. Each `Permit` names the generation of the
circuit it was issued in (a generation ends with every state change): the outcome of a call
started before the circuit changed (a slow success arriving after the circuit opened, say) is
ignored, so a stale answer cannot close a circuit or count against a new one. State changes
are returned as `Transition` values; the caller logs them, outside the lock.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import validate

__all__ = [
    "DEFAULT_COOLDOWN_S",
    "DEFAULT_FAILURE_THRESHOLD",
    "BreakerState",
    "CircuitBreaker",
    "Permit",
    "Transition",
]

DEFAULT_FAILURE_THRESHOLD = 3
"""Consecutive failures that open a tier's circuit."""

DEFAULT_COOLDOWN_S = 30.0
"""Seconds an open circuit waits before letting one probe through."""


class BreakerState(str, enum.Enum):
    """Where a circuit stands; the value is what logs and metrics show."""

    closed = "closed"
    open = "open"
    half_open = "half_open"


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to call the tier once; hand it back with `success`, `failure` or `release`."""

    generation: int
    probe: bool


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change: from `before` to `after`, after `failures` consecutive failures."""

    before: BreakerState
    after: BreakerState
    failures: int


class CircuitBreaker:
    """A per-tier circuit: closed, open (skip, no request) or half-open (one probe)."""

    def __init__(
        self,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        cooldown: float = DEFAULT_COOLDOWN_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = validate.count(failure_threshold, "failure_threshold")
        self.cooldown = validate.seconds(cooldown, "cooldown")
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.closed
        self._generation = 0
        self._failures = 0
        self._opened_at = 0.0
        self._probe_out = False

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(state={self._state.value!r}, failures={self._failures}, "
            f"failure_threshold={self.failure_threshold}, cooldown={self.cooldown:g})"
        )

    @property
    def state(self) -> BreakerState:
        """The state as last decided (an open circuit whose cooldown has passed still reads
        open until a call asks for a permit and becomes the probe)."""
        return self._state

    @property
    def failures(self) -> int:
        """Consecutive failures counted in the current state."""
        return self._failures

    def acquire(self) -> tuple[Permit | None, Transition | None]:
        """A permit to call the tier, or None when the circuit says skip it; and the state
        change this caused (open to half-open when this call becomes the probe)."""
        with self._lock:
            if self._state is BreakerState.closed:
                return Permit(self._generation, probe=False), None
            if self._state is BreakerState.open:
                if self._clock() - self._opened_at < self.cooldown:
                    return None, None
                change = self._move(BreakerState.half_open)
                self._probe_out = True
                return Permit(self._generation, probe=True), change
            if self._probe_out:  # half-open, and another call is probing
                return None, None
            self._probe_out = True  # half-open after a probe that was released
            return Permit(self._generation, probe=True), None

    def success(self, permit: Permit) -> Transition | None:
        """The call answered: the consecutive-failure count restarts; a probe closes."""
        with self._lock:
            if permit.generation != self._generation:
                return None
            if self._state is BreakerState.half_open:
                self._probe_out = False
                return self._move(BreakerState.closed)
            self._failures = 0
            return None

    def failure(self, permit: Permit) -> Transition | None:
        """The call failed: count it; the threshold, or a failed probe, opens the circuit."""
        with self._lock:
            if permit.generation != self._generation:
                return None
            self._failures += 1
            if self._state is BreakerState.half_open:
                self._probe_out = False
                return self._open()
            if self._failures >= self.failure_threshold:
                return self._open()
            return None

    def release(self, permit: Permit) -> None:
        """The call ended with neither answer nor `RerankError` (cancelled, or a bug raised):
        nothing is counted, and a probe's slot is freed so the next call can probe."""
        with self._lock:
            if permit.generation == self._generation and permit.probe:
                self._probe_out = False

    # -- under the lock ----------------------------------------------------------------------

    def _open(self) -> Transition:
        self._opened_at = self._clock()
        return self._move(BreakerState.open)

    def _move(self, after: BreakerState) -> Transition:
        change = Transition(self._state, after, self._failures)
        self._state = after
        self._generation += 1
        if after is not BreakerState.open:
            self._failures = 0
        return change
