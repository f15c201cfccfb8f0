"""One trace from the caller through the server's model batch, read back over real OTLP.

The server runs as a user runs it, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` at an OTLP/HTTP
receiver on loopback (`tests.otlp_receivers`). This process runs a `Pipeline` (CHAIN, with its
RETRIEVER) whose `RerankStage` (RERANKER) calls the server through `RerankClient`, and exports
its own spans to the same receiver. Decoded, the receiver's bodies hold one trace: CHAIN ->
RERANKER -> the server's SERVER span -> its ``rerank.batch`` span, exactly one RERANKER span
(the client's ``x-rstage-reranker`` header keeps the server's spans CHAINs), and no document
text on any span the server sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.pipeline import Pipeline
from tests.otlp_receivers import HttpReceiver, http_receiver

from .served import Served, server_env, start_server

DOC_MARKER = "DOCMARK5c2e"
QUERY_MARKER = "QRYMARK81ad"
QUERY = f"remove a directory tree {QUERY_MARKER}"
DOCUMENTS = [
    Candidate(f"d{i}", f"{text} {DOC_MARKER}", score=float(10 - i))
    for i, text in enumerate(
        [
            "os.rmdir removes an empty directory",
            "shutil.rmtree deletes a directory and all its contents",
            "json.dumps serializes an object",
            "pathlib.Path.unlink removes a file",
        ]
    )
]
INGEST_SECONDS = 30.0


@dataclass(frozen=True)
class Exported:
    """A decoded OTLP span, with the service that sent it."""

    service: str
    span: Any

    @property
    def attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kv in self.span.attributes:
            value = kv.value
            out[kv.key] = (
                getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
            )
        return out


def exported_spans(receiver: HttpReceiver) -> list[Exported]:
    spans = []
    for body in receiver.received("/v1/traces"):
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = next(
                kv.value.string_value
                for kv in resource_spans.resource.attributes
                if kv.key == "service.name"
            )
            for scope_spans in resource_spans.scope_spans:
                spans.extend(Exported(service, span) for span in scope_spans.spans)
    return spans


class Recalled:
    """A recall that hands over the fixed candidates."""

    def recall(self, query: str, k: int) -> list[Candidate]:
        return DOCUMENTS[:k]


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as found:
        yield found


@pytest.fixture(scope="module")
def traced_server(
    receiver: HttpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    env = server_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    tmp = tmp_path_factory.mktemp("traced-server")
    with start_server(tmp, "--reranker", "lexical", env=env) as served:
        yield served


@dataclass(frozen=True)
class Run:
    trace_id: str
    spans: list[Exported]
    server_log: list[dict[str, Any]]


@pytest.fixture(scope="module")
def run(traced_server: Served, receiver: HttpReceiver) -> Run:
    provider = TracerProvider(resource=Resource.create({"service.name": "the-caller"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.url + "/v1/traces"))
    )
    try:
        with RerankClient(traced_server.url) as client:
            stage = RerankStage(client, tracer_provider=provider)
            result = Pipeline(Recalled(), stage, recall_k=4, tracer_provider=provider).run(QUERY)
    finally:
        provider.shutdown()
    assert result.trace_id is not None
    assert all(r.reranked for r in result.results)
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        spans = [s for s in exported_spans(receiver) if s.span.trace_id.hex() == result.trace_id]
        names = {s.span.name for s in spans}
        if {"POST /rerank", "rerank.batch"} <= names or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return Run(result.trace_id, spans, traced_server.log_lines())


def _one(run: Run, name: str) -> Exported:
    found = [s for s in run.spans if s.span.name == name]
    assert len(found) == 1, f"{name}: {[s.span.name for s in run.spans]}"
    return found[0]


def test_one_trace_holds_the_chain_the_reranker_the_server_span_and_its_batch(run: Run) -> None:
    chain = _one(run, "pipeline")
    reranker = _one(run, "rerank")
    server = _one(run, "POST /rerank")
    batch = _one(run, "rerank.batch")
    assert chain.attributes["openinference.span.kind"] == "CHAIN"
    assert reranker.attributes["openinference.span.kind"] == "RERANKER"
    assert reranker.span.parent_span_id == chain.span.span_id
    assert server.span.parent_span_id == reranker.span.span_id, "the server continued the trace"
    assert batch.span.parent_span_id == server.span.span_id
    assert server.span.kind == server.span.SPAN_KIND_SERVER
    assert (chain.service, server.service) == ("the-caller", "retrieval-stage-server")
    assert [link.span_id for link in batch.span.links] == [server.span.span_id]


def test_the_trace_has_exactly_one_reranker_span_the_callers(run: Run) -> None:
    # The client named its RERANKER span in x-rstage-reranker: the server's spans are CHAINs,
    # and nothing of the marker travels on in the trace state.
    kinds = {s.span.name: s.attributes.get("openinference.span.kind") for s in run.spans}
    assert [name for name, kind in kinds.items() if kind == "RERANKER"] == ["rerank"]
    server = [s for s in run.spans if s.service == "retrieval-stage-server"]
    assert {s.attributes["openinference.span.kind"] for s in server} == {"CHAIN"}
    assert "rstage" not in _one(run, "POST /rerank").span.trace_state


def test_the_batch_span_says_what_ran_and_how_long_the_request_waited(run: Run) -> None:
    batch = _one(run, "rerank.batch").attributes
    assert batch["retrieval_stage.model"] == "lexical-coverage-proximity"
    assert batch["retrieval_stage.server.reranker"] == "lexical"
    assert batch["retrieval_stage.batch.pairs"] == len(DOCUMENTS)
    assert batch["retrieval_stage.batch.request_pairs"] == len(DOCUMENTS)
    assert batch["retrieval_stage.batch.requests"] == 1
    assert batch["retrieval_stage.batch.tokens"] > 0
    assert batch["retrieval_stage.batch.queue_wait_s"] >= 0
    server = _one(run, "POST /rerank").attributes
    assert server["http.route"] == "/rerank"
    assert server["retrieval_stage.documents"] == len(DOCUMENTS)
    assert server["retrieval_stage.shape"] == "tei"


def test_documents_are_recorded_once_on_the_callers_span_never_on_the_servers(run: Run) -> None:
    server_spans = [s for s in run.spans if s.service == "retrieval-stage-server"]
    # The request, its model batch, and the traced client's one question to /info for the model.
    assert len(server_spans) == 3
    for exported in server_spans:
        text = str(exported.span)
        assert DOC_MARKER not in text
        assert QUERY_MARKER not in text
    reranker = _one(run, "rerank").attributes
    assert any(DOC_MARKER in str(v) for v in reranker.values()), "the RERANKER span has them"


def test_the_servers_log_line_carries_the_callers_trace_id(run: Run) -> None:
    # Other tests send the module's server requests of their own, in any order: the run's
    # request is the one line carrying its trace id, and there must be exactly one.
    lines = [
        line
        for line in run.server_log
        if line["event"] == "server.request" and line.get("trace_id") == run.trace_id
    ]
    assert len(lines) == 1, [line for line in run.server_log if line["event"] == "server.request"]
    assert lines[0]["span_id"] == _one(run, "POST /rerank").span.span_id.hex()


def test_traceparent_tracestate_from_any_client_are_continued(
    traced_server: Served, receiver: HttpReceiver
) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    reply = httpx.post(
        traced_server.url + "/rerank",
        json={"query": "q", "texts": ["a q", "b"]},
        headers={
            "traceparent": f"00-{trace_id}-{parent}-01",
            "tracestate": "vendor=opaque7",
            "baggage": "tenant=t1",
        },
        timeout=30.0,
    )
    assert reply.status_code == 200
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        spans = [s for s in exported_spans(receiver) if s.span.trace_id.hex() == trace_id]
        if len(spans) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (server,) = [s for s in spans if s.span.name == "POST /rerank"]
    assert server.span.parent_span_id.hex() == parent
    assert server.span.trace_state == "vendor=opaque7"
    (batch,) = [s for s in spans if s.span.name == "rerank.batch"]
    assert batch.span.trace_state == "vendor=opaque7"


def test_metrics_leave_over_otlp_when_the_server_stops(
    tmp_path: Path, receiver: HttpReceiver
) -> None:
    # A server of its own: stopping the module's would fail any test the random order puts
    # after this one with "connection refused".
    env = server_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100")
    with start_server(tmp_path, "--reranker", "lexical", env=env) as served:
        reply = httpx.post(
            served.url + "/rerank", json={"query": "q", "texts": ["a q", "b"]}, timeout=30.0
        )
        assert reply.status_code == 200
        assert served.stop() == 0, served.log_text()[-2000:]
    names = set()
    for body in receiver.received("/v1/metrics"):
        request = ExportMetricsServiceRequest.FromString(body)
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                names.update(m.name for m in scope_metrics.metrics)
    assert {
        "retrieval_stage.server.request.duration",
        "retrieval_stage.server.batch.size",
        "retrieval_stage.server.batch.tokens",
        "retrieval_stage.server.queue.depth",
    } <= names
