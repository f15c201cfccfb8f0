"""A call's outcome counts only in the circuit generation its permit was issued in: a call
that started before the circuit changed state can neither close it nor reset its count."""

from __future__ import annotations

from retrieval_stage.failover import BreakerState, CircuitBreaker


def test_a_stale_success_cannot_close_a_half_open_circuit() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=1, cooldown=10.0, clock=lambda: now[0])
    stale, _ = breaker.acquire()  # started while closed, answers very late
    failing, _ = breaker.acquire()
    assert stale is not None
    assert failing is not None
    breaker.failure(failing)
    assert breaker.state is BreakerState.open
    now[0] = 11.0
    probe, change = breaker.acquire()
    assert probe is not None
    assert probe.probe
    assert change is not None
    assert breaker.state is BreakerState.half_open
    assert breaker.success(stale) is None
    assert breaker.state is BreakerState.half_open, "only the probe may close the circuit"
    closed = breaker.success(probe)
    assert closed is not None
    assert breaker.state is BreakerState.closed


def test_a_stale_success_does_not_reset_the_count_of_an_open_circuit() -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown=10.0, clock=lambda: 0.0)
    stale, _ = breaker.acquire()
    first, _ = breaker.acquire()
    second, _ = breaker.acquire()
    assert stale is not None
    assert first is not None
    assert second is not None
    breaker.failure(first)
    breaker.failure(second)
    assert (breaker.state, breaker.failures) == (BreakerState.open, 2)
    breaker.success(stale)
    assert (breaker.state, breaker.failures) == (BreakerState.open, 2)
