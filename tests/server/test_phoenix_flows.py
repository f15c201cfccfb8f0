"""Exactly one RERANKER span per rerank in every trace a user can make, read back from a real
Arize Phoenix (issue 50).

``retrieval-stage serve`` runs as a user runs it, exporting to the session's Phoenix. Each
test makes one flow a user makes and reads the trace back from every Phoenix project (Phoenix
files a whole cross-process trace under the project of whichever span reached it first, so a
trace is looked up in all of them):

- the CLI exporting nothing (no ``OTEL_EXPORTER_OTLP_ENDPOINT``) against a traced ``serve``;
- the README's library example where no collector listens;
- a service A (our traced stage) calling a service B that calls ``serve`` with a plain
  httpx client (B forwards the trace context as W3C propagation does, nothing more);
- two hops both ours: A's stage calls B, whose handler runs a stage of its own against ``serve``;
- another tool's RERANKER span as the caller: the documented limit (two RERANKER spans), and
  the header that lifts it.

Where a process exports its spans, nothing in the trace is left without its parent; every
span that succeeded is OK.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.spans.handoff import HEADER, marker_value
from retrieval_stage.telemetry import configure_tracing
from tests.otlp_receivers import closed_port
from tests.phoenix_server import INGEST_SECONDS

from .served import ROOT, SCRIPT, Served, server_env, start_server

pytestmark = pytest.mark.phoenix

CANDIDATES = [
    Candidate("json", "json.dumps serializes an object to a JSON formatted str", score=9.0),
    Candidate("rmtree", "shutil.rmtree deletes an entire directory tree", score=8.0),
    Candidate("rmdir", "os.rmdir removes an empty directory", score=7.0),
]
QUERY = "delete a directory tree"
PROBE_WAIT_S = 10.0
"""Generous: the collector probe's connection to a closed loopback port fails at once."""


@pytest.fixture(scope="module")
def serve(phoenix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    env = server_env(OTEL_EXPORTER_OTLP_ENDPOINT=phoenix, OTEL_BSP_SCHEDULE_DELAY="100")
    tmp = tmp_path_factory.mktemp("phoenix-flows")
    with start_server(tmp, "--reranker", "lexical", env=env) as served:
        yield served


def _projects(phoenix: str) -> list[str]:
    reply = httpx.get(f"{phoenix}/v1/projects", params={"limit": 100}, timeout=10.0)
    reply.raise_for_status()
    return [str(p["name"]) for p in reply.json()["data"]]


def _spans_where(phoenix: str, **params: str) -> list[dict[str, Any]]:
    """Spans of every project matching `params` (Phoenix's span query), each with its project."""
    found = []
    for project in _projects(phoenix):
        reply = httpx.get(
            f"{phoenix}/v1/projects/{project}/spans", params={"limit": 1000, **params}, timeout=10.0
        )
        if reply.status_code == 404:
            continue
        reply.raise_for_status()
        found += [{**s, "project": project} for s in reply.json()["data"]]
    return found


def _trace(
    phoenix: str, trace_id: str, done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The trace's spans from every project once `done` says all have arrived."""
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        spans = _spans_where(phoenix, trace_id=trace_id)
        if done(spans):
            return spans
        assert time.monotonic() < deadline, [s["name"] for s in spans]
        time.sleep(0.25)


def _has(*names: str) -> Callable[[list[dict[str, Any]]], bool]:
    def check(spans: list[dict[str, Any]]) -> bool:
        seen = [s["name"] for s in spans]
        return all(seen.count(n) >= names.count(n) for n in set(names))

    return check


def _rerankers(spans: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{s['project']}:{s['name']}" for s in spans if s["span_kind"] == "RERANKER")


def _assert_no_orphans(spans: list[dict[str, Any]]) -> None:
    ids = {s["context"]["span_id"] for s in spans}
    orphans = [s["name"] for s in spans if s["parent_id"] and s["parent_id"] not in ids]
    assert not orphans, f"spans whose parent never arrived: {orphans}"


THE_TESTS_OWN = frozenset({"search", "B POST /rerank", "their rerank"})
"""Spans this module makes itself, standing in for an application (their status is theirs)."""


def _assert_all_ok(spans: list[dict[str, Any]]) -> None:
    """Every span of ours that succeeded (everything but the test's own) is OK."""
    not_ok = {
        s["name"]: s["status_code"]
        for s in spans
        if s["status_code"] != "OK" and s["name"] not in THE_TESTS_OWN
    }
    assert not_ok == {}


def _assert_servers_reranker(span: dict[str, Any], texts: int) -> None:
    """`serve`'s request span as the rerank's RERANKER: its documents are there, by position."""
    assert span["span_kind"] == "RERANKER"
    attributes = span["attributes"]
    assert attributes["reranker.top_k"] == texts
    outputs = {attributes[f"reranker.output_documents.{i}.document.id"] for i in range(texts)}
    assert outputs == {str(i) for i in range(texts)}
    inputs = {attributes.get(f"reranker.input_documents.{i}.document.id") for i in range(texts)}
    assert inputs == {str(i) for i in range(texts)}, "the input documents, by position"


def _exporting(phoenix: str, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=phoenix + "/v1/traces"))
    )
    return provider


Handler = Callable[[dict[str, str], bytes], bytes]


@contextmanager
def _service(handle: Handler) -> Iterator[str]:
    """A TEI-shaped ``POST /rerank`` service on loopback whose answer `handle` makes from the
    request's headers and body; its base URL. ``GET /info`` answers 404 (no cap to learn)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            answer = handle({k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _rerank_from(provider: TracerProvider, url: str) -> str:
    """Our traced stage reranks the candidates through `url` under an app span; the trace id."""
    tracer = provider.get_tracer("the-app")
    with (
        RerankClient(url) as client,
        tracer.start_as_current_span("search") as root,
    ):
        results = RerankStage(client, tracer_provider=provider).run(QUERY, CANDIDATES)
    assert all(r.reranked for r in results)
    return format(root.get_span_context().trace_id, "032x")


def test_the_cli_exporting_nothing_gets_the_servers_reranker_span(
    phoenix: str, serve: Served
) -> None:
    # The README's two terminals with OTEL_EXPORTER_OTLP_ENDPOINT set only for serve.
    env = server_env(COLUMNS="200")
    before = {s["context"]["span_id"] for s in _spans_where(phoenix)}
    done = subprocess.run(
        [str(SCRIPT), "rerank", "-q", QUERY, "--endpoint", serve.url],
        input="".join(
            json.dumps({"id": c.id, "text": c.text, "score": c.score}) + "\n" for c in CANDIDATES
        ),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        new = [s for s in _spans_where(phoenix) if s["context"]["span_id"] not in before]
        if {"POST /rerank", "rerank.batch"} <= {s["name"] for s in new}:
            break
        assert time.monotonic() < deadline, [s["name"] for s in new]
        time.sleep(0.25)
    (trace_id,) = {s["context"]["trace_id"] for s in new}
    spans = [s for s in new if s["context"]["trace_id"] == trace_id]
    (request,) = [s for s in spans if s["name"] == "POST /rerank"]
    _assert_servers_reranker(request, len(CANDIDATES))
    assert _rerankers(spans) == ["retrieval-stage:POST /rerank"]
    _assert_all_ok(spans)


def test_the_library_without_a_collector_gets_the_servers_reranker_span(
    phoenix: str, serve: Served
) -> None:
    provider = configure_tracing("my-search", endpoint=f"http://127.0.0.1:{closed_port()}")
    try:
        (processor,) = provider._active_span_processor._span_processors
        deadline = time.monotonic() + PROBE_WAIT_S
        while processor.delivery.reachable is None:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        trace_id = _rerank_from(provider, serve.url)
    finally:
        provider.shutdown()
    spans = _trace(phoenix, trace_id, _has("GET /info", "POST /rerank", "rerank.batch"))
    (request,) = [s for s in spans if s["name"] == "POST /rerank"]
    _assert_servers_reranker(request, len(CANDIDATES))
    assert _rerankers(spans) == ["retrieval-stage:POST /rerank"]
    assert "rerank" not in {s["name"] for s in spans}, "the client's span went nowhere"
    _assert_all_ok(spans)


def _forwarding(provider: TracerProvider, serve_url: str) -> Handler:
    """Service B: continues the caller's trace (W3C propagation, tracestate included) and
    calls `serve` with a plain httpx client, making no RERANKER span of its own."""
    tracer = provider.get_tracer("service-b")

    def handle(headers: dict[str, str], body: bytes) -> bytes:
        parent = propagate.extract(headers)
        with tracer.start_as_current_span("B POST /rerank", context=parent, kind=SpanKind.SERVER):
            sent = {"content-type": "application/json"}
            propagate.inject(sent)
            reply = httpx.post(serve_url + "/rerank", content=body, headers=sent, timeout=30.0)
            return reply.content

    return handle


def _through_b(phoenix: str, serve: Served, b_handler: Callable[..., Handler]) -> str:
    """Service A (ours, exporting) reranks through service B (exporting), whose handler
    `b_handler` makes with B's provider and serve's URL; the trace id."""
    a, b = _exporting(phoenix, "service-a"), _exporting(phoenix, "service-b")
    try:
        with _service(b_handler(b, serve.url)) as b_url:
            return _rerank_from(a, b_url)
    finally:
        a.shutdown()
        b.shutdown()


def test_a_service_forwarding_the_trace_to_serve_gets_the_servers_reranker_span(
    phoenix: str, serve: Served
) -> None:
    trace_id = _through_b(phoenix, serve, _forwarding)
    spans = _trace(phoenix, trace_id, _has("search", "rerank", "B POST /rerank", "rerank.batch"))
    # Two reranks: A's (through B), held by A's span; B's call to serve, made without a
    # RERANKER span, so serve's request span is one.
    (request,) = [s for s in spans if s["name"] == "POST /rerank"]
    _assert_servers_reranker(request, len(CANDIDATES))
    assert [s["name"] for s in spans if s["span_kind"] == "RERANKER"].count("rerank") == 1
    assert len(_rerankers(spans)) == 2
    _assert_no_orphans(spans)
    _assert_all_ok(spans)


def _reranking(provider: TracerProvider, serve_url: str) -> Handler:
    """Service B, ours: its handler reranks through `serve` with a stage of its own."""
    tracer = provider.get_tracer("service-b")

    def handle(headers: dict[str, str], body: bytes) -> bytes:
        asked = json.loads(body)
        parent = propagate.extract(headers)
        with (
            tracer.start_as_current_span("B POST /rerank", context=parent, kind=SpanKind.SERVER),
            RerankClient(serve_url) as client,
        ):
            candidates = [Candidate(str(i), t) for i, t in enumerate(asked["texts"])]
            results = RerankStage(client, tracer_provider=provider).run(asked["query"], candidates)
        return json.dumps([{"index": r.input_index, "score": r.score} for r in results]).encode()

    return handle


def test_two_hops_both_ours_have_one_reranker_span_each_and_serve_none(
    phoenix: str, serve: Served
) -> None:
    trace_id = _through_b(phoenix, serve, _reranking)
    names = ("search", "rerank", "B POST /rerank", "rerank", "POST /rerank", "rerank.batch")
    spans = _trace(phoenix, trace_id, _has(*names))
    kinds = [(s["name"], s["span_kind"]) for s in spans if s["name"] in ("rerank", "POST /rerank")]
    assert sorted(kinds) == [
        ("POST /rerank", "CHAIN"),
        ("rerank", "RERANKER"),
        ("rerank", "RERANKER"),
    ]
    _assert_no_orphans(spans)
    _assert_all_ok(spans)


def _their_rerank(provider: TracerProvider, url: str, *, with_header: bool) -> str:
    """Another tool's RERANKER span around a plain traced HTTP call to `serve`."""
    tracer = provider.get_tracer("another-tool")
    attributes = {"openinference.span.kind": "RERANKER"}
    with tracer.start_as_current_span("their rerank", attributes=attributes) as span:
        headers = {"content-type": "application/json"}
        propagate.inject(headers)
        if with_header:  # what docs/server.md tells such a tool to send
            headers[HEADER] = marker_value(span.get_span_context())
        texts = [c.text for c in CANDIDATES]
        reply = httpx.post(url + "/rerank", json={"query": QUERY, "texts": texts}, headers=headers)
        assert reply.status_code == 200
    return format(span.get_span_context().trace_id, "032x")


@pytest.mark.parametrize("with_header", [False, True], ids=["documented-limit", "header"])
def test_another_tools_reranker_span_and_the_header_that_lifts_the_limit(
    phoenix: str, serve: Served, with_header: bool
) -> None:
    provider = _exporting(phoenix, "another-tool")
    try:
        trace_id = _their_rerank(provider, serve.url, with_header=with_header)
    finally:
        provider.shutdown()
    spans = _trace(phoenix, trace_id, _has("their rerank", "POST /rerank", "rerank.batch"))
    request = next(s for s in spans if s["name"] == "POST /rerank")
    assert request["span_kind"] == ("CHAIN" if with_header else "RERANKER")
    assert len(_rerankers(spans)) == (1 if with_header else 2)
    _assert_no_orphans(spans)


def test_the_header_is_what_a_client_of_ours_would_send() -> None:
    # The value docs/server.md shows: <32 hex trace id>-<16 hex span id>.
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        context = span.get_span_context()
        assert marker_value(context) == f"{context.trace_id:032x}-{context.span_id:016x}"
