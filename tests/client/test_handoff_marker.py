"""The ``x-rstage-reranker`` header (`retrieval_stage.spans.handoff`): our client sends it only
from inside a recording, sampled RERANKER span of our writer that something will export, naming
that span, and sends the caller's tracestate on without the legacy ``rstage`` entry; anywhere
else the trace context goes out as the propagator made it.

A loopback server records the headers each request arrived with (`tests.client.hostile`).
"""

from __future__ import annotations

import socket
from typing import Any

from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.span import TraceState

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.spans.handoff import HEADER, handed_off
from retrieval_stage.telemetry import configure_tracing
from tests.client.hostile.server import Request, json_response, serve
from tests.otlp_receivers import closed_port, http_receiver

CANDIDATES = [Candidate("a", "alpha"), Candidate("b", "beta")]
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def _ok(request: Request, conn: socket.socket) -> None:
    n = len(request.json()["texts"])
    conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))


def _remote_parent(state: TraceState) -> context.Context:
    """A context whose current span is a sampled remote parent carrying `state`."""
    parent = SpanContext(TRACE_ID, 0x00F067AA0BA902B7, True, TraceFlags(TraceFlags.SAMPLED), state)
    return trace.set_span_in_context(NonRecordingSpan(parent))


def exporting(**kwargs: Any) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider whose spans are exported (to memory), and its exporter."""
    provider = TracerProvider(**kwargs)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _headers_through_stage(provider: TracerProvider, state: TraceState) -> dict[str, str]:
    token = context.attach(_remote_parent(state))
    try:
        with serve(_ok) as server, RerankClient(server.url, model="m") as client:
            RerankStage(client, tracer_provider=provider).run("q", CANDIDATES)
            (request,) = [r for r in server.requests if r.path == "/rerank"]
            return request.headers
    finally:
        context.detach(token)


def _reranker_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "rerank"]
    return span


def test_the_stages_exported_reranker_span_is_named_in_the_header() -> None:
    provider, exporter = exporting()
    headers = _headers_through_stage(provider, TraceState([("vendor", "opaque7")]))
    span = _reranker_span(exporter).get_span_context()
    assert headers[HEADER] == f"{span.trace_id:032x}-{span.span_id:016x}"
    assert headers["traceparent"] == f"00-{span.trace_id:032x}-{span.span_id:016x}-01"
    assert headers["tracestate"] == "vendor=opaque7", "the caller's state goes on as it was"
    # What the server reads back from it: the named span is in the request's trace.
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    assert handed_off(raw, span)


def test_a_caller_without_tracestate_sends_none() -> None:
    provider, _ = exporting()
    headers = _headers_through_stage(provider, TraceState())
    assert HEADER in headers
    assert "tracestate" not in headers


def test_a_legacy_rstage_entry_from_upstream_is_dropped_and_the_rest_kept() -> None:
    provider, _ = exporting()
    state = TraceState([("vendor", "v"), ("rstage", "rr"), ("other", "o")])
    headers = _headers_through_stage(provider, state)
    assert headers["tracestate"] == "vendor=v,other=o"


def test_a_legacy_rstage_entry_alone_leaves_no_tracestate() -> None:
    provider = TracerProvider()  # nothing exports: no marker either
    headers = _headers_through_stage(provider, TraceState([("rstage", "rr")]))
    assert "tracestate" not in headers
    assert HEADER not in headers


def test_a_reranker_span_that_nothing_exports_sends_no_marker() -> None:
    # A provider without an exporting processor (the span records, is sampled, and goes
    # nowhere): the server must write the RERANKER span itself.
    headers = _headers_through_stage(TracerProvider(), TraceState([("vendor", "opaque7")]))
    assert headers["traceparent"].endswith("-01")
    assert HEADER not in headers


class Enriching(SpanProcessor):
    """A processor that only looks at spans (as counting or enriching ones do)."""


def test_a_processor_that_does_not_export_does_not_count() -> None:
    provider = TracerProvider()
    provider.add_span_processor(Enriching())
    assert HEADER not in _headers_through_stage(provider, TraceState())


class Discard(InMemorySpanExporter):
    delivers = False


def test_an_exporter_that_says_it_delivers_nowhere_does_not_count() -> None:
    # The CLI's counting-only provider: configure_tracing with an exporter that discards.
    provider = configure_tracing("t", exporter=Discard())
    try:
        assert HEADER not in _headers_through_stage(provider, TraceState())
    finally:
        provider.shutdown()


def test_configure_tracing_without_a_collector_sends_no_marker() -> None:
    # The README's library example where nothing listens at the OTLP endpoint: the probe finds
    # the port closed before the first rerank, so the server writes the RERANKER span.
    provider = configure_tracing("t", endpoint=f"http://127.0.0.1:{closed_port()}")
    try:
        (processor,) = provider._active_span_processor._span_processors
        _wait_for(lambda: processor.delivery.reachable is not None)
        assert processor.delivery.reachable is False
        assert HEADER not in _headers_through_stage(provider, TraceState())
    finally:
        provider.shutdown()


def test_configure_tracing_with_a_collector_sends_the_marker() -> None:
    with http_receiver() as receiver:
        provider = configure_tracing("t", endpoint=receiver.url)
        try:
            (processor,) = provider._active_span_processor._span_processors
            _wait_for(lambda: processor.delivery.reachable is not None)
            assert processor.delivery.reachable is True
            assert HEADER in _headers_through_stage(provider, TraceState())
        finally:
            provider.shutdown()


def test_a_failed_export_stops_the_marker_until_one_succeeds() -> None:
    with http_receiver(statuses={"/v1/traces": 400}) as receiver:
        provider = configure_tracing("t", endpoint=receiver.url)
        try:
            (processor,) = provider._active_span_processor._span_processors
            _headers_through_stage(provider, TraceState())
            provider.force_flush()
            assert processor.delivery.reachable is False
            assert HEADER not in _headers_through_stage(provider, TraceState())
        finally:
            provider.shutdown()


PROBE_WAIT_S = 10.0
"""Generous: the probe's connection to a loopback port answers in well under a second."""


def _wait_for(condition: Any) -> None:
    import time

    deadline = time.monotonic() + PROBE_WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the collector probe never answered"
        time.sleep(0.01)


class RecordOnly(Sampler):
    """Spans that record but are not sampled: the SDK keeps them from every exporter."""

    def should_sample(
        self,
        parent_context: context.Context | None,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> SamplingResult:
        # The span keeps the attributes and the trace state a sampler hands back.
        state = trace.get_current_span(parent_context).get_span_context().trace_state
        return SamplingResult(Decision.RECORD_ONLY, attributes=attributes, trace_state=state)

    def get_description(self) -> str:
        return "RecordOnly"


def test_a_recording_but_unsampled_reranker_span_sends_no_marker() -> None:
    # It records, so it looks like ours from the inside, but it never reaches the trace.
    provider, _ = exporting(sampler=RecordOnly())
    headers = _headers_through_stage(provider, TraceState([("vendor", "opaque7")]))
    assert headers["traceparent"].endswith("-00")
    assert headers["tracestate"] == "vendor=opaque7"
    assert HEADER not in headers


def test_a_sampled_out_reranker_span_sends_no_marker() -> None:
    # The server's span must then be the RERANKER span: the caller's never reaches the trace.
    provider, _ = exporting(sampler=ALWAYS_OFF)
    headers = _headers_through_stage(provider, TraceState([("vendor", "opaque7")]))
    assert headers["tracestate"] == "vendor=opaque7"
    assert HEADER not in headers


def test_the_client_outside_any_reranker_span_sends_no_marker() -> None:
    provider, _ = exporting()
    tracer = provider.get_tracer("the-app")
    with (
        serve(_ok) as server,
        RerankClient(server.url, model="m") as client,
        tracer.start_as_current_span("app-step"),
    ):
        client.rerank("q", ["alpha", "beta"])
    (request,) = [r for r in server.requests if r.path == "/rerank"]
    assert "traceparent" in request.headers
    assert HEADER not in request.headers


def test_another_writers_reranker_span_sends_no_marker() -> None:
    # Only our writer's span is known to hold the documents as our client saw them.
    provider, _ = exporting()
    tracer = provider.get_tracer("someone-else")
    attributes = {"openinference.span.kind": "RERANKER"}
    with (
        serve(_ok) as server,
        RerankClient(server.url, model="m") as client,
        tracer.start_as_current_span("their-rerank", attributes=attributes),
    ):
        client.rerank("q", ["alpha", "beta"])
    (request,) = [r for r in server.requests if r.path == "/rerank"]
    assert HEADER not in request.headers
