"""`create_app` served by uvicorn in this process, with scorers that fail or hold on purpose:
every failure is answered in TEI's shape with the status that is logged and metered (and the
traceback logged); a client that hangs up takes its work out of the queue; a full queue is
refused before any thread work; spans carry the route, never the raw target."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import structlog.testing
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage.server import ServerSettings, create_app
from retrieval_stage.server.scorers import Group

from .served import running_in_process

uvicorn = pytest.importorskip("uvicorn")

WAIT_S = 30.0
"""Generous bound for anything the test waits on (a busy shared machine)."""


class ControlledScorer:
    """A scorer whose token count and scoring can be held, or made to fail, by the test."""

    kind = "local"
    splittable = True
    model_id = "controlled"
    max_input_length = 512

    def __init__(self, *, fail_count: bool = False) -> None:
        self.fail_count = fail_count
        self.hold_count = threading.Event()
        self.hold_count.set()
        self.hold_score = threading.Event()
        self.hold_score.set()
        self.scoring = threading.Event()
        self.counting = threading.Event()
        self.scored: list[str] = []

    def load(self) -> None:
        return None

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        self.counting.set()
        assert self.hold_count.wait(WAIT_S)
        if self.fail_count:
            raise RuntimeError("an error nobody foresaw")
        return 1, [1 for _ in texts]

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        self.scoring.set()
        assert self.hold_score.wait(WAIT_S)
        self.scored.extend(g.query for g in groups)
        return [[1.0 / (1 + i) for i in range(len(g.texts))] for g in groups]


@contextmanager
def serving(scorer: Any, **settings: Any) -> Iterator[tuple[str, InMemorySpanExporter, Any]]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    app = create_app(
        ServerSettings(reranker="lexical", batch_wait_ms=0, **settings),
        scorer=scorer,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
    try:
        with running_in_process(app, WAIT_S) as url:
            try:
                yield url, spans, reader
            finally:  # held requests go on before the server stops
                scorer.hold_count.set()
                scorer.hold_score.set()
    finally:
        tracer_provider.shutdown()


def body(query: str, texts: int = 2) -> dict[str, Any]:
    return {"query": query, "texts": [f"text {i}" for i in range(texts)]}


def request_statuses(reader: Any) -> list[int]:
    data = reader.get_metrics_data()
    statuses = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "retrieval_stage.server.request.duration":
                    statuses += [
                        p.attributes["http.response.status_code"] for p in metric.data.data_points
                    ]
    return statuses


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Every event the library logged during the test (structlog's capture: the library logs
    through structlog once it is configured, and this configures it)."""
    with structlog.testing.capture_logs() as captured:
        yield captured


def logged(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in logs if line.get("event") == event]


def test_an_unexpected_error_is_a_teis_shaped_500_logged_and_metered_as_500(
    logs: list[dict[str, Any]],
) -> None:
    with serving(ControlledScorer(fail_count=True)) as (url, _spans, reader):
        reply = httpx.post(url + "/rerank", json=body("q"), timeout=WAIT_S)
        statuses = request_statuses(reader)
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "error": "Internal error (RuntimeError); the server logged it",
        "error_type": "Internal",
    }
    assert [line["status"] for line in logged(logs, "server.request")] == [500]
    assert statuses == [500]
    (unexpected,) = logged(logs, "server.unexpected_error")
    assert unexpected["error_type"] == "RuntimeError"
    assert "Traceback" in unexpected["traceback"]
    assert "an error nobody foresaw" in unexpected["traceback"]


@pytest.mark.parametrize("where", ["query", "texts"])
def test_a_lone_surrogate_is_a_teis_shaped_422(where: str, logs: list[dict[str, Any]]) -> None:
    lone = "\\ud800"
    raw = (
        '{"query": "a' + lone + '", "texts": ["t"]}'
        if where == "query"
        else '{"query": "q", "texts": ["t", "b' + lone + '"]}'
    )
    with serving(ControlledScorer()) as (url, _spans, reader):
        reply = httpx.post(
            url + "/rerank", content=raw, headers={"content-type": "application/json"}
        )
        statuses = request_statuses(reader)
    assert reply.status_code == 422
    field = "query" if where == "query" else "texts[1]"
    assert reply.json() == {
        "error": f"`{field}` is not valid Unicode: it holds a lone surrogate",
        "error_type": "Validation",
    }
    assert [line["status"] for line in logged(logs, "server.request")] == [422]
    assert statuses == [422]


def _hang_up_after_sending(url: str, payload: dict[str, Any]) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    data = json.dumps(payload).encode()
    sock.sendall(
        b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def _queue_depth(url: str) -> int:
    depth: int = httpx.get(url + "/info", timeout=WAIT_S).json()["queue_depth"]
    return depth


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_work_for_clients_that_hung_up_leaves_the_queue_unscored() -> None:
    scorer = ControlledScorer()
    scorer.hold_score.clear()
    with (
        serving(scorer) as (url, _spans, _reader),
        httpx.Client(timeout=WAIT_S) as client,
        concurrent_post(client, url, "first") as first,
    ):
        _until(scorer.scoring.is_set, "the first request never reached the model")
        gone = [_hang_up_after_sending(url, body(f"gone-{i}")) for i in range(4)]
        _until(lambda: _queue_depth(url) == 4, "the four requests never queued")
        for sock in gone:
            sock.close()
        _until(lambda: _queue_depth(url) == 0, "the hung-up requests stayed queued")
        scorer.hold_score.set()
        assert first.result().status_code == 200
        after = client.post(url + "/rerank", json=body("after"))
        assert after.status_code == 200
    assert scorer.scored == ["first", "after"]


def test_a_client_that_hung_up_is_logged_and_metered_as_499(logs: list[dict[str, Any]]) -> None:
    # Not 200: nobody got an answer (a mutation recording it as 200 went unnoticed: issue 51).
    scorer = ControlledScorer()
    scorer.hold_score.clear()
    with (
        serving(scorer) as (url, _spans, reader),
        httpx.Client(timeout=WAIT_S) as client,
        concurrent_post(client, url, "first") as first,
    ):
        _until(scorer.scoring.is_set, "the first request never reached the model")
        gone = _hang_up_after_sending(url, body("gone"))
        _until(lambda: _queue_depth(url) == 1, "the request never queued")
        gone.close()
        _until(lambda: _queue_depth(url) == 0, "the hung-up request stayed queued")
        scorer.hold_score.set()
        assert first.result().status_code == 200
        _until(lambda: len(logged(logs, "server.request")) >= 2, "no line for the hang-up")
        statuses = request_statuses(reader)
    assert sorted(line["status"] for line in logged(logs, "server.request")) == [200, 499]
    assert sorted(statuses) == [200, 499]


@contextmanager
def concurrent_post(client: httpx.Client, url: str, query: str) -> Iterator[Any]:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool.submit(client.post, url + "/rerank", json=body(query))


def test_a_full_queue_is_refused_before_the_token_count_thread() -> None:
    scorer = ControlledScorer()
    scorer.hold_count.clear()
    import concurrent.futures

    with (
        serving(scorer, max_queue=2) as (url, _spans, _reader),
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        held = [
            pool.submit(httpx.post, url + "/rerank", json=body(f"q{i}"), timeout=WAIT_S)
            for i in range(2)
        ]
        _until(scorer.counting.is_set, "no request reached the token count")
        time.sleep(0.2)  # the second request is waiting for the count thread too
        refused = httpx.post(url + "/rerank", json=body("third"), timeout=WAIT_S / 3)
        assert refused.status_code == 429
        assert refused.json() == {"error": "Model is overloaded", "error_type": "Overloaded"}
        scorer.hold_count.set()
        assert [f.result().status_code for f in held] == [200, 200]


def test_server_spans_carry_the_route_never_the_raw_target() -> None:
    with serving(ControlledScorer()) as (url, spans, _reader):
        httpx.post(url + "/rerank?token=SECRETQUERY", json=body("q"), timeout=WAIT_S)
        httpx.get(url + "/SECRETPATH/x?y=SECRETQUERY", timeout=WAIT_S)

        def servers_ended() -> list[Any]:
            return [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]

        # A server span ends just after its response is sent: wait for both to end.
        _until(lambda: len(servers_ended()) == 2, "the two server spans never ended")
        servers = servers_ended()
    by_name = {s.name: dict(s.attributes or {}) for s in servers}
    rerank, unmatched = by_name["POST /rerank"], by_name["GET"]
    assert rerank["http.target"] == "/rerank"
    assert str(rerank["http.url"]).endswith("/rerank")
    assert unmatched["http.target"] == "(unmatched)"
    for attributes in (rerank, unmatched):
        assert "SECRET" not in json.dumps(attributes, default=str)


class LengthScorer(ControlledScorer):
    """Counts a text's characters as its tokens: lengths the test chooses exactly."""

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        return len(query), [len(t) for t in texts]


def test_truncate_false_refuses_a_text_over_the_model_length_and_true_cuts_it() -> None:
    long = "x" * 600  # over the 512 the scorer reads
    with serving(LengthScorer()) as (url, _spans, _reader):
        refused = httpx.post(
            url + "/rerank", json={"query": "q", "texts": ["ok", long], "truncate": False}
        )
        cut = httpx.post(
            url + "/rerank", json={"query": "q", "texts": ["ok", long], "truncate": True}
        )
        default = httpx.post(url + "/rerank", json={"query": "q", "texts": [long]})
    assert refused.status_code == 422
    assert refused.json()["error"].startswith(
        "Input validation error: `inputs` must have less than 512 tokens. Given: 600"
    )
    assert "texts[1]" in refused.json()["error"]
    assert cut.status_code == 200
    # The count charged is what the model reads: 2 + 512, never the 600 sent.
    assert cut.headers["x-compute-tokens"] == str(2 + 512)
    assert default.status_code == 200
    assert default.headers["x-compute-tokens"] == "512"


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read() -> None:
    with serving(ControlledScorer(), payload_limit=1000) as (url, _spans, _reader):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S / 3) as sock:
            sock.sendall(
                b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1001\r\n\r\n"  # and not one byte of the body
            )
            head = b""
            while b"\r\n\r\n" not in head or not head.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)  # head and body may come in two segments
                if not chunk:
                    break
                head += chunk
    assert head.startswith(b"HTTP/1.1 413 "), head[:80]
    assert b'"error_type": "PayloadTooLarge"' in head
