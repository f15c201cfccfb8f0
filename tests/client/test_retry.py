"""The retry policy as pure functions: injected clock and randomness, no sleeping, no network.

What is retried, how long the client waits, which server hint wins, and that no wait ever
reaches past the call's deadline. The last tests drive a real client through
`httpx.MockTransport` with a fake clock to pin the same rules at the client's edge.
"""

from __future__ import annotations

import email.utils
import math
import types
from collections.abc import Callable, Iterator

import httpx
import pytest

from retrieval_stage import RerankClient, RerankStatusError, RerankTransportError
from retrieval_stage._deadline import Deadline
from retrieval_stage.client import core as client_core
from retrieval_stage.client import sync as sync_client
from retrieval_stage.client.retry import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    backoff_delay,
    is_retryable_error,
    is_retryable_status,
    parse_retry_after,
    retry_wait,
)
from tests.hooks import hooked

NOW = 1_750_000_000.0
"""A fixed wall-clock time for HTTP-date arithmetic."""


def fixed(value: float) -> Callable[[], float]:
    """A `random` that always returns `value`."""
    return lambda: value


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- which statuses are retried ------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried(status: int) -> None:
    assert is_retryable_status(status)
    assert is_retryable_status(status, previous_424s=3), "only 424 is limited"


@pytest.mark.parametrize(
    "status", [400, 401, 403, 404, 405, 409, 410, 413, 415, 418, 422, 451, 501, 505]
)
def test_client_errors_and_other_statuses_are_never_retried(status: int) -> None:
    assert not is_retryable_status(status)


def test_424_is_retried_at_most_once() -> None:
    assert is_retryable_status(424, previous_424s=0)
    assert not is_retryable_status(424, previous_424s=1)
    assert not is_retryable_status(424, previous_424s=2)


# -- which transport errors are retried ----------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("slow connect"),
        httpx.ReadTimeout("slow read"),
        httpx.WriteTimeout("slow write"),
        httpx.PoolTimeout("no connection free"),
        httpx.ReadError("connection reset by peer"),
        httpx.WriteError("broken pipe"),
        httpx.RemoteProtocolError("server disconnected without sending a response"),
        httpx.ProxyError("proxy refused"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_transport_errors_are_retried(exc: httpx.HTTPError) -> None:
    assert is_retryable_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.LocalProtocolError("illegal header value"),
        httpx.UnsupportedProtocol("ftp://"),
        httpx.DecodingError("bad gzip"),
        httpx.TooManyRedirects("loop"),
        ValueError("not an httpx error"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_that_would_repeat_are_not_retried(exc: Exception) -> None:
    assert not is_retryable_error(exc)


# -- backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize("retry_num", range(8))
def test_backoff_lies_between_75_and_100_percent_of_the_capped_exponential(retry_num: int) -> None:
    capped = min(BACKOFF_BASE_S * 2**retry_num, BACKOFF_MAX_S)
    assert backoff_delay(retry_num, fixed(0.0)) == pytest.approx(capped)
    assert backoff_delay(retry_num, fixed(1.0)) == pytest.approx(0.75 * capped)
    assert 0.75 * capped <= backoff_delay(retry_num, fixed(0.5)) <= capped


def test_backoff_doubles_from_half_a_second_up_to_eight() -> None:
    waits = [backoff_delay(n, fixed(0.0)) for n in range(7)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_backoff_jitter_comes_only_from_the_injected_random() -> None:
    draws = iter([0.2, 0.2, 0.9])
    first, second, third = (backoff_delay(1, lambda: next(draws)) for _ in range(3))
    assert first == second
    assert third < first


# -- server hints --------------------------------------------------------------------------


def test_retry_after_seconds() -> None:
    assert parse_retry_after({"Retry-After": "3"}, now=NOW) == 3.0
    assert parse_retry_after({"retry-after": " 1.5 "}, now=NOW) == 1.5


def test_retry_after_http_date_is_relative_to_now() -> None:
    when = email.utils.formatdate(NOW + 7, usegmt=True)
    assert parse_retry_after({"Retry-After": when}, now=NOW) == pytest.approx(7.0)


def test_retry_after_date_in_the_past_means_no_wait() -> None:
    when = email.utils.formatdate(NOW - 30, usegmt=True)
    assert parse_retry_after({"Retry-After": when}, now=NOW) == 0.0


def test_retry_after_ms_wins_over_retry_after() -> None:
    headers = {"Retry-After": "9", "retry-after-ms": "250"}
    assert parse_retry_after(headers, now=NOW) == 0.25


def test_unusable_retry_after_ms_falls_back_to_retry_after() -> None:
    assert parse_retry_after({"retry-after-ms": "soon", "Retry-After": "2"}, now=NOW) == 2.0
    assert parse_retry_after({"retry-after-ms": "nan", "Retry-After": "2"}, now=NOW) == 2.0


def test_an_infinite_retry_after_means_not_now() -> None:
    """inf (or 1e400, which float() reads as inf) asks for more than any deadline: kept as
    asked, so the deadline refuses the retry (issue 23)."""
    for headers in ({"retry-after-ms": "inf", "Retry-After": "2"}, {"Retry-After": "1e400"}):
        assert parse_retry_after(headers, now=NOW) == math.inf
        assert retry_wait(0, headers=headers, remaining=30.0, random=fixed(0.0), now=NOW) is None


def test_negative_retry_after_counts_as_zero() -> None:
    assert parse_retry_after({"Retry-After": "-5"}, now=NOW) == 0.0
    assert parse_retry_after({"retry-after-ms": "-5"}, now=NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    ["", "soon", "nan", "Sun, 99 Foo 2024 00:00:00 GMT", "Wed, 21 Oct 99999999999999999999 07:28"],
)
def test_garbage_retry_after_is_ignored(value: str) -> None:
    assert parse_retry_after({"Retry-After": value}, now=NOW) is None


def test_long_retry_after_is_kept_and_the_deadline_refuses_the_retry() -> None:
    assert parse_retry_after({"Retry-After": "61"}, now=NOW) == 61.0
    later = email.utils.formatdate(NOW + 3600, usegmt=True)
    assert parse_retry_after({"Retry-After": later}, now=NOW) == pytest.approx(3600.0)
    # A server asking for an hour is not hammered after the backoff: no retry at all.
    headers = {"Retry-After": later}
    assert retry_wait(0, headers=headers, remaining=30.0, random=fixed(0.0), now=NOW) is None


def test_no_hint_means_none() -> None:
    assert parse_retry_after({}, now=NOW) is None
    assert parse_retry_after({"Content-Type": "application/json"}, now=NOW) is None


# -- the wait before a retry ---------------------------------------------------------------


def test_wait_is_the_backoff_without_a_hint() -> None:
    wait = retry_wait(2, headers=None, remaining=30.0, random=fixed(0.0), now=NOW)
    assert wait == 2.0


def test_server_hint_wins_over_backoff() -> None:
    wait = retry_wait(0, headers={"Retry-After": "4"}, remaining=30.0, random=fixed(0.0), now=NOW)
    assert wait == 4.0


def test_server_hint_of_zero_retries_at_once() -> None:
    wait = retry_wait(3, headers={"Retry-After": "0"}, remaining=30.0, random=fixed(0.0), now=NOW)
    assert wait == 0.0


def test_a_hint_past_the_deadline_forbids_the_retry() -> None:
    headers = {"Retry-After": "5"}
    assert retry_wait(0, headers=headers, remaining=4.9, random=fixed(0.0), now=NOW) is None
    assert retry_wait(0, headers=headers, remaining=5.0, random=fixed(0.0), now=NOW) is None
    assert retry_wait(0, headers=headers, remaining=5.1, random=fixed(0.0), now=NOW) == 5.0


def test_a_backoff_past_the_deadline_forbids_the_retry() -> None:
    assert retry_wait(3, headers=None, remaining=3.9, random=fixed(0.0), now=NOW) is None
    assert retry_wait(3, headers=None, remaining=4.1, random=fixed(0.0), now=NOW) == 4.0


def test_no_time_left_means_no_retry_even_for_a_zero_wait() -> None:
    headers = {"Retry-After": "0"}
    assert retry_wait(0, headers=headers, remaining=0.0, random=fixed(0.0), now=NOW) is None


@pytest.mark.parametrize("remaining", [0.0, 0.1, 0.4, 1.0, 3.0, 7.5, 20.0])
@pytest.mark.parametrize("retry_num", range(6))
@pytest.mark.parametrize("hint", [None, "0", "2", "30", "61"])
def test_no_wait_ever_ends_past_the_deadline(
    remaining: float, retry_num: int, hint: str | None
) -> None:
    headers = {"Retry-After": hint} if hint is not None else None
    for draw in (0.0, 0.5, 1.0):
        wait = retry_wait(
            retry_num, headers=headers, remaining=remaining, random=fixed(draw), now=NOW
        )
        assert wait is None or 0.0 <= wait < remaining


# -- the deadline --------------------------------------------------------------------------


def test_deadline_counts_down_on_the_injected_clock() -> None:
    clock = FakeClock()
    deadline = Deadline(10.0, clock)
    assert deadline.remaining() == 10.0
    clock.advance(4.0)
    assert deadline.remaining() == 6.0
    assert not deadline.expired()


def test_deadline_never_goes_negative_and_expires() -> None:
    clock = FakeClock()
    deadline = Deadline(1.0, clock)
    clock.advance(5.0)
    assert deadline.remaining() == 0.0
    assert deadline.expired()


# -- the same rules at the client's edge (MockTransport, fake clock, no sleeping) ----------


def scripted(
    answers: list[httpx.Response | Exception], clock: FakeClock, cost: float = 0.0
) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport that plays `answers` in order, each request costing `cost` fake seconds."""
    seen: list[httpx.Request] = []
    queue: Iterator[httpx.Response | Exception] = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        clock.advance(cost)
        answer = next(queue)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handler), seen


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fake clock that the client's sleeps advance, so retries take no real time."""
    fake = FakeClock()
    shim = types.SimpleNamespace(sleep=fake.advance, time=lambda: NOW + fake.now, monotonic=fake)
    monkeypatch.setattr(sync_client, "time", shim)
    monkeypatch.setattr(client_core, "time", shim)
    return fake


def client_with(transport: httpx.MockTransport, clock: FakeClock, **kw: object) -> RerankClient:
    client = RerankClient(
        "http://reranker.test",
        model="BAAI/bge-reranker-base",  # no /info question: every request is a rerank
        http_client=httpx.Client(transport=transport),
        **kw,  # type: ignore[arg-type]
    )
    return hooked(client, clock=clock, random=fixed(0.0))


def test_client_gives_up_at_once_when_retry_after_reaches_past_the_deadline(
    clock: FakeClock,
) -> None:
    transport, seen = scripted(
        [httpx.Response(429, headers={"Retry-After": "20"}, json={"error": "busy"})], clock
    )
    with (
        client_with(transport, clock, timeout=10.0) as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank("q", ["a"])
    assert caught.value.status_code == 429
    assert len(seen) == 1


def test_client_stops_retrying_when_the_deadline_is_spent_by_slow_attempts(
    clock: FakeClock,
) -> None:
    transport, seen = scripted([httpx.ReadError("reset")] * 5, clock, cost=4.0)
    with (
        client_with(transport, clock, timeout=10.0, max_retries=5) as client,
        pytest.raises(RerankTransportError),
    ):
        client.rerank("q", ["a"])
    # 4 s, wait 0.5, 4 s (8.5 spent), wait 1.0 (9.5), 4 s: the deadline is gone, a 2 s wait
    # is refused, and the fourth attempt is never made.
    assert len(seen) == 3
    assert clock.now - 100.0 == pytest.approx(13.5)


def test_client_does_not_retry_an_error_in_its_own_request(clock: FakeClock) -> None:
    transport, seen = scripted([httpx.LocalProtocolError("illegal header value")], clock)
    with client_with(transport, clock) as client, pytest.raises(RerankTransportError):
        client.rerank("q", ["a"])
    assert len(seen) == 1


def test_client_retries_a_424_once_and_only_once(clock: FakeClock) -> None:
    backend = httpx.Response(424, json={"error": "backend", "error_type": "Backend"})
    transport, seen = scripted([backend, backend, backend], clock)
    with (
        client_with(transport, clock, max_retries=5) as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank("q", ["a"])
    assert caught.value.status_code == 424
    assert len(seen) == 2
    # One backoff (0.5 s with random 0.0) on the clock the deadline reads, then no second wait.
    assert clock.now - 100.0 == pytest.approx(0.5)


def test_client_retries_until_max_retries_within_the_deadline(clock: FakeClock) -> None:
    unavailable = httpx.Response(503, json={"error": "down", "error_type": "Unhealthy"})
    transport, seen = scripted([unavailable] * 4, clock, cost=0.1)
    with client_with(transport, clock, timeout=30.0) as client, pytest.raises(RerankStatusError):
        client.rerank("q", ["a"])
    assert len(seen) == 3, "max_retries=2 by default: three attempts"


def test_client_honours_retry_after_then_succeeds(clock: FakeClock) -> None:
    transport, seen = scripted(
        [
            httpx.Response(429, headers={"Retry-After": "3"}, json={"error": "busy"}),
            httpx.Response(200, json=[{"index": 0, "score": 0.5}]),
        ],
        clock,
    )
    with client_with(transport, clock, timeout=10.0) as client:
        response = client.rerank_response("q", ["a"])
    assert response.results == [("a", 0.5)]
    assert (response.requests, response.retries) == (2, 1)
    assert len(seen) == 2
    assert clock.now - 100.0 == pytest.approx(3.0), "waited exactly what the server asked"
