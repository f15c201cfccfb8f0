"""configure_tracing and configure_logging: real OTLP/HTTP export and trace-correlated logs."""

from __future__ import annotations

import io
import json

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.telemetry import (
    DEFAULT_SPAN_ATTRIBUTE_LIMIT,
    configure_logging,
    configure_tracing,
    otlp_span_exporter,
)

from .conftest import WireMock


def _values(attributes: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in attributes:  # type: ignore[attr-defined]
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


def test_reranker_span_arrives_over_real_otlp_http(wm: WireMock) -> None:
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/v1/traces"},
            "response": {"status": 200, "headers": {"Content-Type": "application/x-protobuf"}},
        }
    )
    provider = configure_tracing("otlp-test", endpoint=wm.url)
    cands = [Candidate("doc-a", "first text", 0.9), Candidate("doc-b", "second text", 0.4)]
    with RerankClient(wm.url + "/tei/out-of-order", model="bge") as client:
        RerankStage(client, tracer_provider=provider).run("what moved?", cands)
    assert provider.force_flush(10_000)
    provider.shutdown()

    (raw,) = wm.raw_bodies("/v1/traces")
    request = ExportTraceServiceRequest.FromString(raw)
    (resource_spans,) = request.resource_spans
    resource = _values(resource_spans.resource.attributes)
    assert resource["service.name"] == "otlp-test"
    (scope_spans,) = resource_spans.scope_spans
    assert scope_spans.scope.name == "retrieval_stage"
    (span,) = scope_spans.spans
    attributes = _values(span.attributes)
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["reranker.query"] == "what moved?"
    assert attributes["reranker.model_name"] == "bge"
    assert attributes["reranker.input_documents.0.document.id"] == "doc-a"
    assert attributes["reranker.input_documents.0.document.score"] == 0.9
    assert attributes["reranker.output_documents.0.document.id"] == "doc-b"
    assert attributes["reranker.output_documents.0.document.score"] == 0.97
    assert attributes["reranker.output_documents.1.document.content"] == "first text"


def test_configure_tracing_fits_200_documents_in_and_out() -> None:
    provider = configure_tracing("limits", exporter=_NullExporter())
    assert provider._span_limits.max_span_attributes == DEFAULT_SPAN_ATTRIBUTE_LIMIT
    assert DEFAULT_SPAN_ATTRIBUTE_LIMIT >= 400 * 4 + 32
    provider.shutdown()


def test_configure_tracing_does_not_set_the_global_unless_asked() -> None:
    before = trace.get_tracer_provider()
    provider = configure_tracing("no-global", exporter=_NullExporter())
    assert trace.get_tracer_provider() is before
    provider.shutdown()


def test_protocol_env_selects_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert isinstance(otlp_span_exporter("http://127.0.0.1:4317"), GrpcSpanExporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    exporter = otlp_span_exporter("http://127.0.0.1:4318")
    assert isinstance(exporter, HttpSpanExporter)
    assert exporter._endpoint == "http://127.0.0.1:4318/v1/traces"


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="http/json"):
        otlp_span_exporter("http://127.0.0.1:4318", protocol="http/json")


def test_log_lines_are_json_with_trace_and_span_ids() -> None:
    import structlog

    stream = io.StringIO()
    configure_logging(stream=stream)
    provider = TracerProvider()
    try:
        tracer = provider.get_tracer("t")
        with tracer.start_as_current_span("outer") as span:
            structlog.get_logger("x").warning("rerank.fallback", caused_by="RerankStatusError")
            context = span.get_span_context()
        line = json.loads(stream.getvalue().splitlines()[-1])
        assert line["event"] == "rerank.fallback"
        assert line["level"] == "warning"
        assert line["caused_by"] == "RerankStatusError"
        assert line["trace_id"] == format(context.trace_id, "032x")
        assert line["span_id"] == format(context.span_id, "016x")
        assert "timestamp" in line
    finally:
        structlog.reset_defaults()
        provider.shutdown()


class _NullExporter(HttpSpanExporter):
    def __init__(self) -> None:
        super().__init__(endpoint="http://127.0.0.1:9/v1/traces")

    def export(self, spans: object) -> object:  # type: ignore[override]
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS
