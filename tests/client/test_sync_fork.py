"""`RerankClient` sends a split call's sub-batches concurrently (issue 41, point 9).

Against a real HTTP server on loopback (the standard library's threading server) that holds
each request at a barrier until the others it expects have arrived: a client sending its
sub-batches one after another never gets past the barrier (its first request waits out the
barrier's timeout and is answered 503), so these tests fail on a sequential driver without
timing anything. The server answers TEI's shape, sorted by score, and releases the batches in
reverse, so the last batch's answer arrives first: every score must still land on its own text.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from retrieval_stage import RerankClient, RerankStatusError

BARRIER_TIMEOUT = 10.0
"""How long a request waits for its siblings: far beyond a loopback round trip, so only a
client that never sends them concurrently hits it."""
SEQUENTIAL_TIMEOUT = 1.0
"""The barrier's timeout where the test expects it to break (one request at a time)."""


def score_of(text: str) -> float:
    """A score the test can recompute from the text alone: a mislabel shows."""
    return (sum(map(ord, text)) % 997) / 997


@dataclass
class Gate:
    """What the server saw: requests in flight now and at most, and every traceparent."""

    parties: int
    timeout: float = BARRIER_TIMEOUT
    barrier: threading.Barrier = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    most_in_flight: int = 0
    requests: int = 0
    traceparents: list[str | None] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)
    """The first text's number of each batch, in the order the answers went out."""
    another_answered: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.parties, timeout=self.timeout)


def handler_for(gate: Gate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            texts: list[str] = body["texts"]
            with gate.lock:
                gate.requests += 1
                gate.in_flight += 1
                gate.most_in_flight = max(gate.most_in_flight, gate.in_flight)
                gate.traceparents.append(self.headers.get("traceparent"))
            try:
                try:
                    gate.barrier.wait()
                except threading.BrokenBarrierError:
                    self.answer(503, {"error": "siblings never came", "error_type": "Overloaded"})
                    return
                if texts[0] == first_text(0):
                    # The call's first batch answers after another one: out of order.
                    gate.another_answered.wait(BARRIER_TIMEOUT)
                results = sorted(
                    ({"index": i, "score": score_of(t)} for i, t in enumerate(texts)),
                    key=lambda r: -r["score"],
                )
                with gate.lock:
                    gate.answered.append(int(texts[0].split()[1]))
                if texts[0] != first_text(0):
                    gate.another_answered.set()
                self.answer(200, results)
            finally:
                with gate.lock:
                    gate.in_flight -= 1

        def answer(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def serving(parties: int, timeout: float = BARRIER_TIMEOUT) -> Iterator[tuple[str, Gate]]:
    gate = Gate(parties, timeout)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(gate))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", gate
    finally:
        server.shutdown()
        server.server_close()


def first_text(i: int) -> str:
    return f"doc {i} about rust and {'x' * (i % 7)}"


def texts(n: int) -> list[str]:
    return [first_text(i) for i in range(n)]


def test_a_split_call_sends_its_sub_batches_at_once_and_keeps_every_label() -> None:
    docs = texts(10)  # batch_size 4: batches of 4, 4 and 2
    with serving(parties=3) as (url, gate), RerankClient(url, batch_size=4, max_retries=0) as c:
        response = c.rerank_response("rust", docs)
    assert gate.requests == 3
    assert gate.most_in_flight == 3
    assert gate.answered[0] != 0, "the answers came back out of order"
    assert sorted(i for i in response.indices) == list(range(10))
    for (doc, score), i in zip(response.results, response.indices, strict=True):
        assert doc == docs[i]
        assert score == score_of(docs[i])
    scores = [s for _, s in response.results]
    assert scores == sorted(scores, reverse=True)
    assert (response.requests, response.batches) == (3, 3)


def test_max_concurrency_bounds_the_requests_of_one_call() -> None:
    docs = texts(12)  # six batches of 2, two at a time
    with (
        serving(parties=2) as (url, gate),
        RerankClient(url, batch_size=2, max_concurrency=2, max_retries=0) as client,
    ):
        # The barrier holds 2 parties: each pair of requests passes it together.
        response = client.rerank_response("rust", docs, top_k=5)
    assert gate.requests == 6
    assert gate.most_in_flight == 2
    assert [doc for doc, _ in response.results] == sorted(docs, key=score_of, reverse=True)[:5]
    assert (response.requests, response.batches) == (6, 6)


def test_one_at_a_time_with_max_concurrency_one() -> None:
    """``max_concurrency=1`` keeps the old order: the barrier of 2 is never passed."""
    with (
        serving(parties=2, timeout=SEQUENTIAL_TIMEOUT) as (url, gate),
        RerankClient(url, batch_size=2, max_concurrency=1, max_retries=0, timeout=60) as client,
        pytest.raises(RerankStatusError) as raised,
    ):
        client.rerank("rust", texts(4))
    assert raised.value.status_code == 503
    assert gate.requests == 1
    assert gate.most_in_flight == 1


def test_every_sub_batch_carries_the_callers_trace_context() -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    with serving(parties=3) as (url, gate), RerankClient(url, batch_size=2) as client:
        with tracer.start_as_current_span("caller") as span:
            client.rerank("rust", texts(6))
        context = span.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    assert len(gate.traceparents) == 3
    assert all(t is not None and t.startswith(expected) for t in gate.traceparents)
    assert trace.get_current_span() is trace.INVALID_SPAN
