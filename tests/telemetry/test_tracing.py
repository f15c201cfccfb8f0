"""configure_tracing and configure_logging: real OTLP export (HTTP and gRPC), the span limits,
the Phoenix project, the global provider, and trace-correlated logs."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.telemetry import (
    DEFAULT_SPAN_ATTRIBUTE_LIMIT,
    PROJECT_NAME,
    configure_tracing,
    otlp_span_exporter,
    shutdown_telemetry,
)

from ..conftest import WireMock
from ..fakes import ByLength
from ..otlp_receivers import http_receiver, json_log_lines


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
    assert not shutdown_telemetry(provider, timeout=10.0)

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


def _exported_spans(bodies: list[bytes]) -> list[tuple[dict[str, object], Any]]:
    """(resource attributes, span) for every span in OTLP/HTTP trace export bodies."""
    found: list[tuple[dict[str, object], Any]] = []
    for body in bodies:
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            resource = _values(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                found.extend((resource, span) for span in scope_spans.spans)
    return found


def _documents(n: int) -> list[Candidate]:
    return [Candidate(f"doc-{i}", "text " * (i % 7 + 1), float(n - i)) for i in range(n)]


def test_a_200_document_span_is_built_and_exported_whole_under_the_documented_set_up() -> None:
    with http_receiver() as receiver:
        provider = configure_tracing("docs-200", endpoint=receiver.url)
        RerankStage(ByLength(), tracer_provider=provider).run("q", _documents(200))
        assert not shutdown_telemetry(provider, timeout=10.0)
        ((_, span),) = _exported_spans(receiver.received("/v1/traces"))

    attributes = _values(span.attributes)
    assert span.dropped_attributes_count == 0
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["reranker.query"] == "q"
    for side in ("input", "output"):
        ids = {attributes[f"reranker.{side}_documents.{i}.document.id"] for i in range(200)}
        assert ids == {f"doc-{i}" for i in range(200)}
        assert f"reranker.{side}_documents.200.document.id" not in attributes


def test_spans_with_no_attribute_limit_keep_every_document() -> None:
    exporter = InMemorySpanExporter()
    provider = configure_tracing(
        "no-limit",
        exporter=exporter,
        span_limits=SpanLimits(max_span_attributes=SpanLimits.UNSET),
    )
    RerankStage(ByLength(), tracer_provider=provider).run("q", _documents(600))
    provider.force_flush()
    (span,) = exporter.get_finished_spans()
    shutdown_telemetry(provider)

    attributes = dict(span.attributes or {})
    assert len(attributes) > DEFAULT_SPAN_ATTRIBUTE_LIMIT  # past the default limit, all kept
    assert span.dropped_attributes == 0
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["reranker.input_documents.0.document.id"] == "doc-0"
    assert "reranker.output_documents.599.document.id" in attributes


def test_the_default_limit_drops_past_it_and_says_so() -> None:
    """The control for the test above: the same span under the default limit loses some."""
    exporter = InMemorySpanExporter()
    provider = configure_tracing("limit", exporter=exporter)
    RerankStage(ByLength(), tracer_provider=provider).run("q", _documents(600))
    provider.force_flush()
    (span,) = exporter.get_finished_spans()
    shutdown_telemetry(provider)

    assert len(span.attributes or {}) <= DEFAULT_SPAN_ATTRIBUTE_LIMIT


def test_configure_tracing_does_not_set_the_global_unless_asked() -> None:
    before = trace.get_tracer_provider()
    provider = configure_tracing("no-global", exporter=InMemorySpanExporter())
    assert trace.get_tracer_provider() is before
    shutdown_telemetry(provider)


SET_GLOBAL = """
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from retrieval_stage.telemetry import configure_tracing, shutdown_telemetry

exporter = InMemorySpanExporter()
provider = configure_tracing("global", exporter=exporter, set_global=True)
assert trace.get_tracer_provider() is provider
with trace.get_tracer("app").start_as_current_span("through-the-global"):
    pass
provider.force_flush()
print([span.name for span in exporter.get_finished_spans()])
shutdown_telemetry(provider)
"""


def test_set_global_installs_the_provider_as_opentelemetrys_global() -> None:
    # A fresh interpreter: the global can be set once per process, and this test process's
    # global stays untouched (nothing to restore).
    result = subprocess.run(
        [sys.executable, "-c", SET_GLOBAL], capture_output=True, text=True, timeout=60, check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['through-the-global']"
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("project", "resource_attributes", "env", "expected"),
    [
        ("search-eval", None, "openinference.project.name=from-env", "search-eval"),
        (None, {PROJECT_NAME: "from-attributes"}, "", "from-attributes"),
        (None, None, "openinference.project.name=from-env,team=search", "from-env"),
        (None, None, "", "my-service"),
    ],
)
def test_the_phoenix_project_is_given_then_from_resource_attributes_then_the_service(
    monkeypatch: pytest.MonkeyPatch,
    project: str | None,
    resource_attributes: dict[str, str] | None,
    env: str,
    expected: str,
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", env)
    provider = configure_tracing(
        "my-service",
        project=project,
        resource_attributes=resource_attributes,
        exporter=InMemorySpanExporter(),
    )
    shutdown_telemetry(provider)

    assert PROJECT_NAME == "openinference.project.name"
    assert provider.resource.attributes[PROJECT_NAME] == expected
    assert provider.resource.attributes["service.name"] == "my-service"


def test_protocol_env_selects_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert isinstance(otlp_span_exporter("http://127.0.0.1:4317"), GrpcSpanExporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert isinstance(otlp_span_exporter("http://127.0.0.1:4318"), HttpSpanExporter)


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="http/json"):
        otlp_span_exporter("http://127.0.0.1:4318", protocol="http/json")


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver: keeps each request."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def Export(
        self, request: ExportTraceServiceRequest, context: object
    ) -> ExportTraceServiceResponse:
        self.requests.append(request)
        return ExportTraceServiceResponse()


def test_reranker_span_arrives_over_real_otlp_grpc() -> None:
    grpc = pytest.importorskip("grpc", reason="the [grpc] extra is not installed")
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    collector = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        provider = configure_tracing(
            "grpc-test", endpoint=f"http://127.0.0.1:{port}", protocol="grpc"
        )
        RerankStage(ByLength(), tracer_provider=provider).run("q", _documents(3))
        assert not shutdown_telemetry(provider, timeout=10.0)
    finally:
        server.stop(grace=None)

    (request,) = collector.requests
    (resource_spans,) = request.resource_spans
    assert _values(resource_spans.resource.attributes)["service.name"] == "grpc-test"
    (span,) = resource_spans.scope_spans[0].spans
    attributes = _values(span.attributes)
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["reranker.output_documents.0.document.id"] == "doc-2"  # the longest text
    assert attributes["reranker.output_documents.0.document.score"] == float(len("text " * 3))


def test_log_lines_are_json_with_trace_and_span_ids() -> None:
    import structlog

    provider = TracerProvider()
    with json_log_lines() as lines:
        tracer = provider.get_tracer("t")
        with tracer.start_as_current_span("outer") as span:
            structlog.get_logger("x").warning("rerank.fallback", caused_by="RerankStatusError")
            context = span.get_span_context()
        line = lines()[-1]
        assert line["event"] == "rerank.fallback"
        assert line["level"] == "warning"
        assert line["caused_by"] == "RerankStatusError"
        assert line["trace_id"] == format(context.trace_id, "032x")
        assert line["span_id"] == format(context.span_id, "016x")
        assert "timestamp" in line
    provider.shutdown()


def test_sdk_log_records_are_rendered_in_our_format_and_exporter_chatter_is_off() -> None:
    with json_log_lines() as lines:
        logging.getLogger("opentelemetry.sdk.trace").warning("attribute %s dropped", "x")
        logging.getLogger("opentelemetry.exporter.otlp.proto.http").error("Failed to export")
        (line,) = lines()

    assert line["event"] == "attribute x dropped"
    assert line["level"] == "warning"
    assert line["sdk_logger"] == "opentelemetry.sdk.trace"


# -- the queued copy of a finished span --------------------------------------------------------


def _finished(events: bool = False, links: bool = False, limits: SpanLimits | None = None) -> Any:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    link = Link(SpanContext(1, 2, False, TraceFlags(1)), {"l": 1})
    with provider.get_tracer("t", "1").start_as_current_span("parent"):
        span = provider.get_tracer("t", "1").start_span(
            "s", attributes={"a": "b", "n": 1}, links=[link] if links else []
        )
        if events:
            span.add_event("e", {"k": "v"})
        span.set_status(trace.Status(trace.StatusCode.ERROR, "why"))
        span.end()
    return exporter.get_finished_spans()[0]


@pytest.mark.filterwarnings("ignore:You should use instrumentation_scope:DeprecationWarning")
def test_a_queued_span_without_its_empty_lists_is_the_same_span_to_every_reader() -> None:
    from opentelemetry.sdk.util import BoundedList

    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans
    from retrieval_stage.telemetry.tracing import drop_empty_lists

    span = _finished()
    before = {
        name: getattr(span, name)
        for name in (
            "name", "context", "parent", "resource", "kind", "status", "start_time", "end_time",
            "instrumentation_scope", "instrumentation_info", "events", "links",
            "dropped_attributes", "dropped_events", "dropped_links",
        )
    }  # fmt: skip
    attributes, as_json, body = span._attributes, span.to_json(), sdk_serialize_spans([span])
    drop_empty_lists(span)
    assert not isinstance(span._events, BoundedList)
    assert not isinstance(span._links, BoundedList)
    assert {name: getattr(span, name) for name in before} == before
    assert span._attributes is attributes
    assert span.to_json() == as_json
    assert sdk_serialize_spans([span]) == body
    assert encode_spans_fast([span]) == body


@pytest.mark.parametrize(
    "kind",
    ["events", "links", "dropped events"],
)
def test_a_span_with_events_links_or_drops_keeps_its_lists(kind: str) -> None:
    from retrieval_stage.telemetry.tracing import drop_empty_lists

    if kind == "dropped events":
        span = _finished(events=True, limits=SpanLimits(max_events=0))
        assert span.dropped_events == 1
    else:
        span = _finished(events=kind == "events", links=kind == "links")
    kept = span._links if kind == "links" else span._events
    drop_empty_lists(span)
    assert (span._links if kind == "links" else span._events) is kept


def test_configure_tracing_queues_the_span_every_processor_shares() -> None:
    """The span our processor queues is the one the provider hands every processor: one
    added after ours that edits it (a redaction, say) is exported as it left it."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.util import BoundedList

    exported: list[Any] = []

    class Keeping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            exported.extend(spans)
            return SpanExportResult.SUCCESS

    class Renaming(SpanProcessor):
        def on_end(self, span: Any) -> None:
            span._name = "renamed after ours"

    provider = configure_tracing("lean", exporter=Keeping())
    provider.add_span_processor(Renaming())
    RerankStage(ByLength(), tracer_provider=provider).run("q", [Candidate("a", "x")])
    provider.force_flush()
    (span,) = exported
    assert span.name == "renamed after ours"
    assert not isinstance(span._events, BoundedList)
    assert (span.attributes or {})["openinference.span.kind"] == "RERANKER"
    provider.shutdown()


# -- exported spans, released a few at a time ----------------------------------------------------


def _kept_processor() -> tuple[Any, list[Any]]:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from retrieval_stage.telemetry.tracing import BoundedBatchSpanProcessor

    exported: list[int] = []

    class Counting(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            exported.append(len(spans))
            return SpanExportResult.SUCCESS

    return BoundedBatchSpanProcessor(Counting(), shutdown_timeout=5.0), exported


def test_an_exported_batch_is_released_by_the_spans_that_end_next() -> None:
    """Kept after its export, dropped one span per later `on_end`: not all at once on the
    worker thread (the collector counts those frees), and not kept for good."""
    import gc
    import weakref

    processor, exported = _kept_processor()
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    first = []
    for _ in range(10):
        span = tracer.start_span("first")
        span.end()
        first.append(weakref.ref(span))
    del span
    processor.force_flush()
    assert exported == [10]
    gc.collect()
    assert all(ref() is None for ref in first)  # the SDK span itself is not what is kept
    batch = processor._exported._batches[0]
    kept = [weakref.ref(s) for s in batch]
    del batch
    for _ in range(8):  # 8 ends release 8 of the 10
        tracer.start_span("next").end()
    gc.collect()
    assert sum(ref() is None for ref in kept) == 8
    for _ in range(2):
        tracer.start_span("next").end()
    gc.collect()
    assert all(ref() is None for ref in kept)
    processor.shutdown()


def test_two_spans_are_released_per_end_while_a_second_batch_waits() -> None:
    """A second exported batch behind the first doubles the pace until the first is gone, so
    what is kept stays about one batch however the exports fall."""
    import gc
    import weakref

    processor, exported = _kept_processor()
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    waiting = processor._exported._batches
    for _ in range(6):
        tracer.start_span("first").end()
    processor.force_flush()
    kept = [weakref.ref(s) for s in waiting[0]]
    for _ in range(4):  # one each: 4 of the first 6 go, the 4 spans themselves queue
        tracer.start_span("second").end()
    processor.force_flush()
    assert exported == [6, 4]
    assert len(waiting) == 2
    gc.collect()
    assert sum(ref() is None for ref in kept) == 4
    tracer.start_span("third").end()  # two at once: the first batch's last two
    gc.collect()
    assert all(ref() is None for ref in kept)
    assert [len(batch) for batch in waiting] == [4]
    tracer.start_span("fourth").end()
    assert [len(batch) for batch in waiting] == [3]  # one at a time again
    processor.shutdown()


def test_a_release_that_meets_a_batch_emptied_but_not_removed_removes_it_and_goes_on() -> None:
    """Another thread may empty the first batch and be stopped before removing it: the next
    release removes it and frees a span of the batch behind."""
    from retrieval_stage.telemetry.tracing import _Exported

    exported = _Exported()
    exported.keep(["a", "b", "c"])  # type: ignore[list-item]
    exported._batches.appendleft([])  # emptied elsewhere, not yet removed
    exported.release()
    assert list(exported._batches) == [["a", "b"]]
    exported._batches[0].clear()
    exported.release()  # the emptied batch goes; nothing is behind it
    assert list(exported._batches) == []
    exported.release()  # nothing kept: nothing to do
    assert list(exported._batches) == []


def test_keep_survives_the_batches_being_released_between_its_check_and_its_drop() -> None:
    import collections

    from retrieval_stage.telemetry.tracing import _Exported

    class Raced(collections.deque):  # type: ignore[type-arg]
        def popleft(self) -> object:
            self.clear()  # the threads ending spans released both batches meanwhile
            return super().popleft()

    exported = _Exported()
    exported._batches = Raced([["e"], ["f"]])
    exported.keep(["h"])  # type: ignore[list-item]
    assert list(exported._batches) == [["h"]]


def test_what_the_exports_left_is_dropped_two_exports_later_and_at_shutdown() -> None:
    """With no span ended to release them, a kept batch goes when the second export after its
    own keeps a batch: at most two are kept."""
    import gc
    import weakref

    processor, _ = _kept_processor()
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    tracer.start_span("a").end()
    processor.force_flush()
    kept = weakref.ref(processor._exported._batches[0][0])
    elsewhere = TracerProvider().get_tracer("o")  # spans this processor never saw end
    others = [elsewhere.start_span("o") for _ in range(2)]
    for span in others:
        span.end()
    processor.exporter.export(others[:1])  # the next export, with no span ended in between
    gc.collect()
    assert kept() is not None
    assert len(processor._exported._batches) == 2
    processor.exporter.export([])  # nothing exported: nothing kept, nothing dropped
    assert kept() is not None
    assert len(processor._exported._batches) == 2
    processor.exporter.export(others[1:])
    gc.collect()
    assert kept() is None
    assert [batch[0] for batch in processor._exported._batches] == others
    tracer.start_span("b").end()
    processor.force_flush()
    assert processor._exported._batches
    processor.shutdown()
    assert not processor._exported._batches


def test_releasing_from_many_threads_while_batches_are_exported_loses_nothing() -> None:
    import threading

    processor, exported = _kept_processor()
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    errors: list[BaseException] = []

    def end_spans() -> None:
        try:
            for _ in range(500):
                tracer.start_span("s").end()
        except BaseException as exc:  # any exception here would end a caller's span badly
            errors.append(exc)

    threads = [threading.Thread(target=end_spans) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(20):
        processor.force_flush()
    for thread in threads:
        thread.join()
    processor.force_flush()
    assert errors == []
    assert sum(exported) == 2000
    processor.shutdown()
