"""The circuit breaker's state machine, against a reference model written from the issue.

Closed until `failure_threshold` consecutive failures; open (no permit: no request) until
`cooldown` has passed on the clock; then one probe (half-open) whose success closes and whose
failure opens again. A fake clock: no test sleeps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage.failover import BreakerState, CircuitBreaker, Permit, Transition
from retrieval_stage.validate import InvalidSetting


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Model:
    """The rules, written out plainly, for sequential calls (each resolved before the next)."""

    threshold: int
    cooldown: float
    state: str = "closed"
    failures: int = 0
    opened_at: float = 0.0

    def call(self, now: float, outcome: str) -> tuple[bool, list[str]]:
        """Whether the call was let through, and the states entered on the way."""
        entered: list[str] = []
        if self.state == "open":
            if now - self.opened_at < self.cooldown:
                return False, entered
            self.state = "half_open"
            entered.append("half_open")
        probe = self.state == "half_open"
        if outcome == "cancel":
            return True, entered
        if outcome == "ok":
            self.failures = 0
            if probe:
                self.state = "closed"
                entered.append("closed")
            return True, entered
        self.failures += 1
        if probe or self.failures >= self.threshold:
            self.state, self.opened_at = "open", now
            entered.append("open")
        return True, entered


operations = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.sampled_from(["ok", "fail", "fail", "cancel"])),
        st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=20.0)),
    ),
    max_size=60,
)


@settings(max_examples=120, deadline=None)
@given(
    threshold=st.integers(min_value=1, max_value=4),
    cooldown=st.floats(min_value=0.0, max_value=15.0),
    ops=operations,
)
def test_breaker_follows_the_reference_model(
    threshold: int, cooldown: float, ops: list[tuple[str, object]]
) -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold, cooldown, clock=clock)
    model = Model(threshold, cooldown)
    for op, arg in ops:
        if op == "tick":
            assert isinstance(arg, float)
            clock.now += arg
            continue
        outcome = str(arg)
        permit, change = breaker.acquire()
        changes: list[Transition | None] = [change]
        allowed, entered = model.call(clock.now, outcome)
        assert (permit is not None) == allowed, (model, breaker)
        if permit is not None:
            if outcome == "ok":
                changes.append(breaker.success(permit))
            elif outcome == "fail":
                changes.append(breaker.failure(permit))
            else:
                breaker.release(permit)
        assert [c.after.value for c in changes if c is not None] == entered
        assert breaker.state.value == model.state
        if model.state == "closed":
            assert breaker.failures == model.failures


def test_threshold_failures_open_and_an_open_circuit_gives_no_permit() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(3, 10.0, clock=clock)
    for _ in range(2):
        permit, _ = breaker.acquire()
        assert permit is not None
        assert breaker.failure(permit) is None
    permit, _ = breaker.acquire()
    assert permit is not None
    opened = breaker.failure(permit)
    assert opened is not None
    assert (opened.before, opened.after, opened.failures) == (
        BreakerState.closed,
        BreakerState.open,
        3,
    )
    clock.now += 9.999
    assert breaker.acquire() == (None, None)


def test_a_success_between_failures_restarts_the_count() -> None:
    breaker = CircuitBreaker(2, 10.0, clock=FakeClock())
    for outcome in ["fail", "ok", "fail", "ok", "fail"]:
        permit, _ = breaker.acquire()
        assert permit is not None
        (breaker.failure if outcome == "fail" else breaker.success)(permit)
    assert breaker.state is BreakerState.closed


def _opened(clock: FakeClock, cooldown: float = 5.0) -> CircuitBreaker:
    breaker = CircuitBreaker(1, cooldown, clock=clock)
    permit, _ = breaker.acquire()
    assert permit is not None
    breaker.failure(permit)
    assert breaker.state is BreakerState.open
    return breaker


def test_after_the_cooldown_exactly_one_probe_goes_out_at_a_time() -> None:
    clock = FakeClock()
    breaker = _opened(clock)
    clock.now += 5.0
    probe, change = breaker.acquire()
    assert probe is not None
    assert probe.probe
    assert change is not None
    assert change.after is BreakerState.half_open
    assert [breaker.acquire()[0] for _ in range(5)] == [None] * 5  # the probe is out
    closed = breaker.success(probe)
    assert closed is not None
    assert closed.after is BreakerState.closed
    assert breaker.acquire()[0] is not None


def test_a_failed_probe_opens_for_another_full_cooldown() -> None:
    clock = FakeClock()
    breaker = _opened(clock)
    clock.now += 6.0
    probe, _ = breaker.acquire()
    assert probe is not None
    reopened = breaker.failure(probe)
    assert reopened is not None
    assert reopened.before is BreakerState.half_open
    clock.now += 4.9
    assert breaker.acquire()[0] is None
    clock.now += 0.1
    assert breaker.acquire()[0] is not None


def test_a_released_probe_lets_the_next_call_probe() -> None:
    clock = FakeClock()
    breaker = _opened(clock)
    clock.now += 5.0
    probe, _ = breaker.acquire()
    assert probe is not None
    breaker.release(probe)  # cancelled: neither answer nor failure
    assert breaker.state is BreakerState.half_open
    again, change = breaker.acquire()
    assert again is not None
    assert again.probe
    assert change is None


def test_a_stale_outcome_from_before_a_change_is_ignored() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1, 5.0, clock=clock)
    slow, _ = breaker.acquire()  # a call still in flight when the circuit opens
    fast, _ = breaker.acquire()
    assert slow is not None
    assert fast is not None
    breaker.failure(fast)
    assert breaker.state is BreakerState.open
    assert breaker.success(slow) is None  # a late success cannot close an open circuit
    assert breaker.state is BreakerState.open
    clock.now += 5.0
    probe, _ = breaker.acquire()
    assert probe is not None
    assert breaker.failure(slow) is None  # nor a late failure end the probe
    assert breaker.state.value == "half_open"


@pytest.mark.parametrize(
    ("threshold", "cooldown"), [(0, 1.0), (True, 1.0), (1.5, 1.0), (1, -1.0), (1, float("nan"))]
)
def test_bad_settings_are_refused(threshold: object, cooldown: object) -> None:
    with pytest.raises(ValueError, match=r"failure_threshold|cooldown"):
        CircuitBreaker(threshold, cooldown)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("threshold", "cooldown", "field"),
    [
        (0, 1.0, "failure_threshold"),
        (True, 1.0, "failure_threshold"),
        (1.5, 1.0, "failure_threshold"),
        (1, -1.0, "cooldown"),
        (1, float("inf"), "cooldown"),
        (1, "1", "cooldown"),
    ],
)
def test_a_refused_setting_is_an_invalid_setting_naming_it(
    threshold: object, cooldown: object, field: str
) -> None:
    """The breaker applies the shared count and seconds rules: `InvalidSetting` with `field`."""
    with pytest.raises(InvalidSetting) as refused:
        CircuitBreaker(threshold, cooldown)  # type: ignore[arg-type]
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field} must be")


def test_zero_cooldown_is_allowed() -> None:
    assert CircuitBreaker(1, 0).cooldown == 0.0


def test_threads_never_get_two_probes_out_at_once() -> None:
    """Eight threads hammering one breaker: while half-open, at most one permit is a probe in
    flight."""
    clock = FakeClock()
    breaker = CircuitBreaker(2, 0.0, clock=clock)  # cooldown 0: half-open at every chance
    lock = threading.Lock()
    probes_out = 0
    worst = 0
    openings = 0
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        nonlocal probes_out, worst, openings
        barrier.wait()
        for n in range(400):
            permit: Permit | None
            permit, _ = breaker.acquire()
            if permit is None:
                continue
            if permit.probe:
                with lock:
                    probes_out += 1
                    worst = max(worst, probes_out)
            fail = (n * 7 + seed) % 3 != 0
            change = breaker.failure(permit) if fail else breaker.success(permit)
            if permit.probe:
                with lock:
                    probes_out -= 1
            if change is not None and change.after is BreakerState.open:
                with lock:
                    openings += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert worst == 1
    assert openings > 0
