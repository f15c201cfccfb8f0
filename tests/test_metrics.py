"""RerankMetrics and configure_metrics: the names, units and attributes dashboards rely on."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest
from opentelemetry import metrics
from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as otlp_grpc
from opentelemetry.exporter.otlp.proto.http import metric_exporter as otlp_http
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    Sum,
)

from retrieval_stage.metrics import RerankMetrics, configure_metrics

OK_CALL: dict[str, Any] = {
    "duration_s": 0.042,
    "documents": 50,
    "batches": 2,
    "requests": 3,
    "retries": 1,
    "outcome": "ok",
    "fallback": False,
    "top1_changed": True,
    "model": "BAAI/bge-reranker-base",
    "provider": "tei",
}

OK_ATTRS = {
    "retrieval_stage.outcome": "ok",
    "retrieval_stage.model": "BAAI/bge-reranker-base",
    "retrieval_stage.provider": "tei",
}


def collect(reader: InMemoryMetricReader) -> dict[str, Metric]:
    """Every metric the reader holds, by name, asserting they all come from our meter."""
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, Metric] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            assert scope_metrics.scope.name == "retrieval_stage"
            for metric in scope_metrics.metrics:
                found[metric.name] = metric
    return found


def points(metric: Metric) -> list[Any]:
    return list(metric.data.data_points)


def test_record_emits_every_instrument_with_its_unit_and_value() -> None:
    reader = InMemoryMetricReader()
    RerankMetrics(MeterProvider(metric_readers=[reader])).record(**OK_CALL)

    found = collect(reader)

    assert {name: m.unit for name, m in found.items()} == {
        "retrieval_stage.rerank.duration": "s",
        "retrieval_stage.rerank.documents": "{document}",
        "retrieval_stage.rerank.batches": "{batch}",
        "retrieval_stage.rerank.requests": "{request}",
        "retrieval_stage.rerank.retries": "{retry}",
        "retrieval_stage.rerank.fallbacks": "{fallback}",
        "retrieval_stage.rerank.top1_changes": "{change}",
    }
    histograms = {
        "retrieval_stage.rerank.duration": 0.042,
        "retrieval_stage.rerank.documents": 50,
        "retrieval_stage.rerank.batches": 2,
    }
    for name, value in histograms.items():
        (point,) = points(found[name])
        assert isinstance(point, HistogramDataPoint)
        assert point.count == 1
        assert point.sum == pytest.approx(value)
        assert dict(point.attributes or {}) == OK_ATTRS
    counters = {
        "retrieval_stage.rerank.requests": 3,
        "retrieval_stage.rerank.retries": 1,
        "retrieval_stage.rerank.fallbacks": 0,
        "retrieval_stage.rerank.top1_changes": 1,
    }
    for name, value in counters.items():
        metric = found[name]
        assert isinstance(metric.data, Sum)
        assert metric.data.is_monotonic  # a counter, so Prometheus gets `_total`
        (point,) = points(metric)
        assert isinstance(point, NumberDataPoint)
        assert point.value == value
        assert dict(point.attributes or {}) == OK_ATTRS


def test_duration_buckets_span_five_milliseconds_to_thirty_seconds() -> None:
    reader = InMemoryMetricReader()
    RerankMetrics(MeterProvider(metric_readers=[reader])).record(**OK_CALL)

    (point,) = points(collect(reader)["retrieval_stage.rerank.duration"])

    bounds = list(point.explicit_bounds)
    assert bounds[0] == 0.005
    assert bounds[-1] == 30.0
    assert bounds == sorted(bounds)
    # 42 ms lands in a bucket of its own scale, not in a catch-all first bucket
    assert point.bucket_counts[bounds.index(0.05)] == 1


def test_none_model_and_provider_are_omitted_not_sent_as_none() -> None:
    reader = InMemoryMetricReader()
    call = OK_CALL | {"model": None, "provider": None}
    RerankMetrics(MeterProvider(metric_readers=[reader])).record(**call)

    for metric in collect(reader).values():
        for point in points(metric):
            assert dict(point.attributes or {}) == {"retrieval_stage.outcome": "ok"}


def test_fallback_counts_once_and_leaves_top1_unrecorded_when_unknown() -> None:
    reader = InMemoryMetricReader()
    rerank_metrics = RerankMetrics(MeterProvider(metric_readers=[reader]))
    call = OK_CALL | {"outcome": "fallback", "fallback": True, "top1_changed": None}
    rerank_metrics.record(**call)
    rerank_metrics.record(**call)

    found = collect(reader)

    (fallbacks,) = points(found["retrieval_stage.rerank.fallbacks"])
    assert fallbacks.value == 2
    assert fallbacks.attributes["retrieval_stage.outcome"] == "fallback"
    assert "retrieval_stage.rerank.top1_changes" not in found


def test_points_are_split_by_outcome() -> None:
    reader = InMemoryMetricReader()
    rerank_metrics = RerankMetrics(MeterProvider(metric_readers=[reader]))
    rerank_metrics.record(**OK_CALL)
    rerank_metrics.record(**(OK_CALL | {"outcome": "error", "top1_changed": None}))

    (ok, error) = sorted(
        points(collect(reader)["retrieval_stage.rerank.duration"]),
        key=lambda p: p.attributes["retrieval_stage.outcome"] != "ok",
    )
    assert (ok.attributes["retrieval_stage.outcome"], ok.count) == ("ok", 1)
    assert (error.attributes["retrieval_stage.outcome"], error.count) == ("error", 1)


SILENT_THEN_LIVE = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from retrieval_stage.metrics import RerankMetrics

call = dict(duration_s=0.1, documents=3, batches=1, requests=1, retries=0, outcome="ok",
            fallback=False, top1_changed=None, model=None, provider=None)
rerank_metrics = RerankMetrics()          # nobody has set a MeterProvider yet
rerank_metrics.record(**call)             # must be a silent no-op
assert not isinstance(metrics.get_meter_provider(), MeterProvider), "library set a global"

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # the application's choice
rerank_metrics.record(**call)
data = reader.get_metrics_data()
(rm,) = data.resource_metrics
(sm,) = rm.scope_metrics
counts = {m.name: m.data.data_points[0] for m in sm.metrics}
# only the call recorded after the application configured metrics is there
print(counts["retrieval_stage.rerank.duration"].count)
"""


def test_record_is_a_silent_no_op_until_the_application_sets_a_meter_provider() -> None:
    # A fresh interpreter: the global provider can be set only once per process.
    result = subprocess.run(
        [sys.executable, "-c", SILENT_THEN_LIVE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    assert result.stderr == ""


def test_record_with_a_no_op_provider_raises_nothing() -> None:
    rerank_metrics = RerankMetrics(metrics.NoOpMeterProvider())

    rerank_metrics.record(**OK_CALL)
    rerank_metrics.record(**(OK_CALL | {"model": None, "provider": None, "top1_changed": None}))


def test_configure_metrics_returns_a_provider_and_leaves_the_global_alone() -> None:
    before = metrics.get_meter_provider()
    reader = InMemoryMetricReader()

    provider = configure_metrics("rerank-demo", reader=reader)
    try:
        assert isinstance(provider, MeterProvider)
        assert metrics.get_meter_provider() is before
        RerankMetrics(provider).record(**OK_CALL)
        data = reader.get_metrics_data()
        assert data is not None
        (resource_metrics,) = data.resource_metrics
        assert resource_metrics.resource.attributes["service.name"] == "rerank-demo"
    finally:
        provider.shutdown()


def test_configure_metrics_service_name_falls_back_to_env_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def service_name() -> object:
        reader = InMemoryMetricReader()
        provider = configure_metrics(reader=reader)
        try:
            RerankMetrics(provider).record(**OK_CALL)
            data = reader.get_metrics_data()
            assert data is not None
            return data.resource_metrics[0].resource.attributes["service.name"]
        finally:
            provider.shutdown()

    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    assert service_name() == "from-env"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    assert service_name() == "retrieval-stage"


class RecordingExporter(MetricExporter):
    """Stands in for an OTLP exporter class: remembers how it was built, sends nothing."""

    built: ClassVar[list[tuple[str, str | None]]] = []
    protocol: ClassVar[str] = ""

    def __init__(self, endpoint: str | None = None, **_: object) -> None:
        super().__init__()
        RecordingExporter.built.append((self.protocol, endpoint))

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        return None


class RecordingGrpc(RecordingExporter):
    protocol = "grpc"


class RecordingHttp(RecordingExporter):
    protocol = "http/protobuf"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """Swap both OTLP metric exporters for recorders and clear the protocol/endpoint env."""
    monkeypatch.setattr(otlp_grpc, "OTLPMetricExporter", RecordingGrpc)
    monkeypatch.setattr(otlp_http, "OTLPMetricExporter", RecordingHttp)
    for name in (
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    RecordingExporter.built = []
    return RecordingExporter.built


@pytest.mark.parametrize(
    ("env", "protocol"),
    [
        ({}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}, "grpc"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            },
            "http/protobuf",
        ),
    ],
)
def test_configure_metrics_picks_the_exporter_protocol_from_env(
    monkeypatch: pytest.MonkeyPatch,
    built: list[tuple[str, str | None]],
    env: dict[str, str],
    protocol: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    configure_metrics(export_interval_millis=3_600_000).shutdown()

    assert [p for p, _ in built] == [protocol]


def test_an_unsupported_protocol_is_refused_like_for_tracing(
    monkeypatch: pytest.MonkeyPatch, built: list[tuple[str, str | None]]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")

    with pytest.raises(ValueError, match="http/json"):
        configure_metrics()
    assert built == []


def test_http_endpoint_is_a_base_url_like_otel_exporter_otlp_endpoint(
    built: list[tuple[str, str | None]],
) -> None:
    configure_metrics(
        endpoint="http://collector:4318/", export_interval_millis=3_600_000
    ).shutdown()
    configure_metrics(
        endpoint="http://collector:4318/v1/metrics", export_interval_millis=3_600_000
    ).shutdown()

    assert built == [
        ("http/protobuf", "http://collector:4318/v1/metrics"),
        ("http/protobuf", "http://collector:4318/v1/metrics"),
    ]


def test_grpc_endpoint_is_passed_as_given(
    monkeypatch: pytest.MonkeyPatch, built: list[tuple[str, str | None]]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")

    configure_metrics(endpoint="http://collector:4317", export_interval_millis=3_600_000).shutdown()

    assert built == [("grpc", "http://collector:4317")]


def test_without_an_endpoint_the_exporter_reads_the_env_itself(
    built: list[tuple[str, str | None]],
) -> None:
    # The OTLP exporters resolve OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (as given) and
    # OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/metrics) on their own; passing anything would
    # override that.
    configure_metrics(export_interval_millis=3_600_000).shutdown()

    assert built == [("http/protobuf", None)]


def test_real_http_exporter_appends_the_signal_path_to_the_env_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.invalid:4318")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", raising=False)

    exporter = otlp_http.OTLPMetricExporter()

    assert exporter._endpoint == "http://collector.invalid:4318/v1/metrics"
