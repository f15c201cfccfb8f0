"""The ``rstage=rr`` tracestate entry (`retrieval_stage.spans.handoff`): our client sends it
only from inside a recording, sampled RERANKER span of our writer, and keeps the caller's
other tracestate entries; anywhere else the trace context goes out as the propagator made it.

A loopback server records the headers each request arrived with (`tests.client.hostile`).
"""

from __future__ import annotations

import socket
from typing import Any

from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.span import TraceState

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.spans.handoff import TRACESTATE_KEY, TRACESTATE_VALUE
from tests.client.hostile.server import Request, json_response, serve

CANDIDATES = [Candidate("a", "alpha"), Candidate("b", "beta")]
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def _ok(request: Request, conn: socket.socket) -> None:
    n = len(request.json()["texts"])
    conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))


def _remote_parent(state: TraceState) -> context.Context:
    """A context whose current span is a sampled remote parent carrying `state`."""
    parent = SpanContext(TRACE_ID, 0x00F067AA0BA902B7, True, TraceFlags(TraceFlags.SAMPLED), state)
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _headers_through_stage(provider: TracerProvider, state: TraceState) -> dict[str, str]:
    token = context.attach(_remote_parent(state))
    try:
        with serve(_ok) as server, RerankClient(server.url, model="m") as client:
            RerankStage(client, tracer_provider=provider).run("q", CANDIDATES)
            (request,) = [r for r in server.requests if r.path == "/rerank"]
            return request.headers
    finally:
        context.detach(token)


def test_the_stages_reranker_span_marks_the_trace_context_first_keeping_the_rest() -> None:
    provider = TracerProvider()
    headers = _headers_through_stage(provider, TraceState([("vendor", "opaque7")]))
    assert headers["tracestate"] == f"{TRACESTATE_KEY}={TRACESTATE_VALUE},vendor=opaque7"
    assert headers["traceparent"].endswith("-01")


def test_a_caller_without_tracestate_sends_the_marker_alone() -> None:
    headers = _headers_through_stage(TracerProvider(), TraceState())
    assert headers["tracestate"] == f"{TRACESTATE_KEY}={TRACESTATE_VALUE}"
    assert TraceState.from_header([headers["tracestate"]]).get(TRACESTATE_KEY) == "rr"


def test_a_marker_already_in_the_callers_state_is_not_repeated() -> None:
    state = TraceState([("vendor", "v"), (TRACESTATE_KEY, "old")])
    headers = _headers_through_stage(TracerProvider(), state)
    assert headers["tracestate"] == f"{TRACESTATE_KEY}={TRACESTATE_VALUE},vendor=v"


def test_a_full_tracestate_drops_its_rightmost_entry_for_the_marker() -> None:
    state = TraceState([(f"k{i}", "v") for i in range(32)])
    sent = _headers_through_stage(TracerProvider(), state)["tracestate"].split(",")
    assert len(sent) == 32
    assert sent[0] == f"{TRACESTATE_KEY}={TRACESTATE_VALUE}"
    assert sent[-1] == "k30=v"


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
    headers = _headers_through_stage(
        TracerProvider(sampler=RecordOnly()), TraceState([("vendor", "opaque7")])
    )
    assert headers["traceparent"].endswith("-00")
    assert headers["tracestate"] == "vendor=opaque7"


def test_a_sampled_out_reranker_span_sends_no_marker() -> None:
    # The server's span must then be the RERANKER span: the caller's never reaches the trace.
    headers = _headers_through_stage(
        TracerProvider(sampler=ALWAYS_OFF), TraceState([("vendor", "opaque7")])
    )
    assert headers["tracestate"] == "vendor=opaque7"


def test_the_client_outside_any_reranker_span_sends_no_marker() -> None:
    tracer = TracerProvider().get_tracer("the-app")
    with (
        serve(_ok) as server,
        RerankClient(server.url, model="m") as client,
        tracer.start_as_current_span("app-step"),
    ):
        client.rerank("q", ["alpha", "beta"])
    (request,) = [r for r in server.requests if r.path == "/rerank"]
    assert "traceparent" in request.headers
    assert TRACESTATE_KEY not in request.headers.get("tracestate", "")


def test_another_writers_reranker_span_sends_no_marker() -> None:
    # Only our writer's span is known to hold the documents as our client saw them.
    tracer = TracerProvider().get_tracer("someone-else")
    attributes = {"openinference.span.kind": "RERANKER"}
    with (
        serve(_ok) as server,
        RerankClient(server.url, model="m") as client,
        tracer.start_as_current_span("their-rerank", attributes=attributes),
    ):
        client.rerank("q", ["alpha", "beta"])
    (request,) = [r for r in server.requests if r.path == "/rerank"]
    assert TRACESTATE_KEY not in request.headers.get("tracestate", "")
