"""The sync client's threads under a server that forces tiny batches (issue 51, point 7).

A server can make one call many sub-batches (a cap of 1 learned from its 422, or a
``batch_size`` of 1): the call must then run on a bounded number of threads
(`MAX_CALL_THREADS`, whatever ``max_concurrency`` says), its deadline must hold, and an
interrupt anywhere in the call, waiting for the other threads included, must stop every other
thread's sends and retry backoffs. A loopback server (`tests.client.hostile`) records what
arrived and when.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from retrieval_stage import RerankClient, RerankTransportError
from retrieval_stage.client import sync
from retrieval_stage.client.sync import MAX_CALL_THREADS
from tests.client.hostile.server import Request, json_response, raw_response, serve

DEADLINE_MARGIN_S = 5.0
"""Generous: what a loaded 2-core machine may add to a call's deadline before it returns."""


class Peak:
    """Requests in flight now and at most, as the server saw them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0


def _slow(peak: Peak, seconds: float) -> Any:
    def answer(request: Request, conn: socket.socket) -> None:
        with peak.lock:
            peak.now += 1
            peak.most = max(peak.most, peak.now)
        try:
            time.sleep(seconds)
            n = len(request.json()["texts"])
            conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))
        finally:
            with peak.lock:
                peak.now -= 1

    return answer


def test_a_call_of_many_sub_batches_runs_on_at_most_the_thread_cap() -> None:
    peak = Peak()
    texts = [f"t{i}" for i in range(120)]
    with (
        serve(_slow(peak, 0.02), keep_alive=True) as server,
        RerankClient(server.url, model="m", batch_size=1, max_concurrency=2_000) as client,
    ):
        results = client.rerank("q", texts)
        left = [t.name for t in threading.enumerate() if t.name.startswith("retrieval-stage-batch")]
    assert sorted(t for t, _ in results) == sorted(texts)
    assert len([r for r in server.requests if r.path == "/rerank"]) == len(texts)
    assert peak.most <= MAX_CALL_THREADS
    assert peak.most > 1, "the sub-batches still go concurrently"
    assert left == [], "no thread of the call outlives it"


def test_the_deadline_holds_at_any_max_concurrency() -> None:
    # 2,000 sub-batches of 50 ms each could never finish in a second on 16 threads.
    peak = Peak()
    texts = [f"t{i}" for i in range(2_000)]
    with (
        serve(_slow(peak, 0.05), keep_alive=True) as server,
        RerankClient(
            server.url, model="m", batch_size=1, max_concurrency=2_000, timeout=1.0
        ) as client,
    ):
        began = time.monotonic()
        with pytest.raises(RerankTransportError) as raised:
            client.rerank("q", texts)
        took = time.monotonic() - began
    assert raised.value.kind == "deadline"
    assert took < 1.0 + DEADLINE_MARGIN_S, took
    assert peak.most <= MAX_CALL_THREADS


def _busy(retry_after: int) -> bytes:
    """TEI's 503 Overloaded, asking the client to come back after `retry_after` seconds."""
    headers = {"Content-Type": "application/json", "Retry-After": str(retry_after)}
    return raw_response(503, headers, b'{"error":"busy","error_type":"Overloaded"}')


class JoinInterrupted(threading.Thread):
    """A worker thread that starts its work only once the caller's thread has sent its own
    request (so the caller's thread has the first sub-batch, the worker the second), and whose
    first join is interrupted, as a Ctrl-C landing there is."""

    caller_sent = threading.Event()
    interrupted = threading.Event()

    def run(self) -> None:
        JoinInterrupted.caller_sent.wait(timeout=30)
        super().run()

    def join(self, timeout: float | None = None) -> None:
        if not JoinInterrupted.interrupted.is_set():
            JoinInterrupted.interrupted.set()
            raise KeyboardInterrupt
        super().join(timeout)


CALLER_ANSWER_DELAY_S = 1.0
"""How long the caller's sub-batch is held: the worker takes the other one meanwhile (a thread
waking on a loaded machine takes milliseconds)."""
RETRY_AFTER_S = 2
"""The backoff the server asks of the worker's sub-batch: it is still waiting it out when the
caller's thread, answered, waits in join and is interrupted."""


def test_an_interrupt_while_waiting_for_the_other_threads_stops_their_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    JoinInterrupted.caller_sent.clear()
    JoinInterrupted.interrupted.clear()
    monkeypatch.setattr(sync, "_Thread", JoinInterrupted)
    arrivals: list[tuple[float, str]] = []
    lock = threading.Lock()

    def answer(request: Request, conn: socket.socket) -> None:
        texts = request.json()["texts"]
        with lock:
            arrivals.append((time.monotonic(), texts[0]))
            first = len(arrivals) == 1
        if first:  # the caller's thread: answered after the worker has asked
            JoinInterrupted.caller_sent.set()
            time.sleep(CALLER_ANSWER_DELAY_S)
            conn.sendall(json_response([{"index": 0, "score": 0.5}]))
            return
        conn.sendall(_busy(RETRY_AFTER_S))

    with (
        serve(answer) as server,
        RerankClient(server.url, model="m", batch_size=1, max_concurrency=2) as client,
    ):
        with pytest.raises(KeyboardInterrupt):
            client.rerank("q", ["a", "b"])
        interrupted_at = time.monotonic()
        time.sleep(RETRY_AFTER_S + 1.0)  # past the backoff the worker was waiting out
    assert len(arrivals) == 2, "each sub-batch asked once before the interrupt"
    after = [text for at, text in arrivals if at > interrupted_at]
    assert after == [], f"requests sent after the interrupt surfaced: {after}"


def _failing_first(fail_text: str, retry_after: int | None) -> tuple[Any, list[tuple[float, str]]]:
    """A server that refuses `fail_text`'s sub-batch at once (400: not retried) and holds every
    other one: with `retry_after`, a 503 asking for that backoff; without, an answer after
    `SLOW_ANSWER_S`. Returns the handler and the arrivals it records."""
    arrivals: list[tuple[float, str]] = []
    lock = threading.Lock()

    def answer(request: Request, conn: socket.socket) -> None:
        texts = request.json()["texts"]
        with lock:
            arrivals.append((time.monotonic(), texts[0]))
        if texts[0] == fail_text:
            time.sleep(FAILURE_DELAY_S)  # the others are in flight or waiting by now
            body = b'{"error":"bad input","error_type":"Validation"}'
            conn.sendall(raw_response(400, {"Content-Type": "application/json"}, body))
            return
        if retry_after is not None:
            conn.sendall(_busy(retry_after))
            return
        time.sleep(SLOW_ANSWER_S)
        conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(len(texts))]))

    return answer, arrivals


FAILURE_DELAY_S = 0.3
"""How long the failing sub-batch's answer is held, so its siblings have asked first."""
SLOW_ANSWER_S = 0.5
"""How long every other sub-batch's answer takes."""
LONG_BACKOFF_S = 20
"""A backoff the call must not wait out once a sibling has failed."""


def test_the_first_failure_stops_the_other_sub_batches_before_their_next_request() -> None:
    # 12 sub-batches on 2 threads: after the failure, nobody takes another one.
    from retrieval_stage import RerankStatusError

    answer, arrivals = _failing_first("t0", retry_after=None)
    texts = [f"t{i}" for i in range(12)]
    with (
        serve(answer, keep_alive=True) as server,
        RerankClient(server.url, model="m", batch_size=1, max_concurrency=2) as client,
        pytest.raises(RerankStatusError),
    ):
        client.rerank("q", texts)
    assert len(arrivals) <= 3, f"sub-batches sent after the failure: {[t for _, t in arrivals]}"


def test_a_failure_wakes_a_sibling_waiting_out_a_retry_backoff() -> None:
    from retrieval_stage import RerankStatusError

    answer, arrivals = _failing_first("t0", retry_after=LONG_BACKOFF_S)
    with (
        serve(answer, keep_alive=True) as server,
        RerankClient(
            server.url, model="m", batch_size=1, max_concurrency=2, timeout=LONG_BACKOFF_S * 3
        ) as client,
    ):
        began = time.monotonic()
        with pytest.raises(RerankStatusError):
            client.rerank("q", ["t0", "t1"])
        took = time.monotonic() - began
    assert took < LONG_BACKOFF_S / 2, f"the call waited out the sibling's backoff: {took:.1f} s"
    assert sorted(t for _, t in arrivals) == ["t0", "t1"], "no retry after the failure"
