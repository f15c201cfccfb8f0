"""RerankMetrics and configure_metrics: the names, units and attributes dashboards rely on."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.exporter.otlp.proto.http import metric_exporter as otlp_http
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics import export as sdk_export
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    NumberDataPoint,
    PeriodicExportingMetricReader,
    Sum,
)

from retrieval_stage.metrics import RerankMetrics, metrics_configured
from retrieval_stage.telemetry import configure_metrics

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


class CountingNoOpMeter(metrics.NoOpMeter):
    """The API's no-op meter, remembering which instruments were asked of it."""

    def __init__(self) -> None:
        super().__init__("retrieval_stage")
        self.created: list[str] = []

    def create_histogram(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.created.append(name)
        return super().create_histogram(name, *args, **kwargs)

    def create_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.created.append(name)
        return super().create_counter(name, *args, **kwargs)


def test_record_with_a_no_op_provider_records_through_no_op_instruments_only() -> None:
    meter = CountingNoOpMeter()

    class Provider(metrics.NoOpMeterProvider):
        def get_meter(self, name: str, *args: Any, **kwargs: Any) -> metrics.Meter:
            assert name == "retrieval_stage"
            return meter

    rerank_metrics = RerankMetrics(Provider())
    rerank_metrics.record(**OK_CALL)
    rerank_metrics.record(**(OK_CALL | {"model": None, "provider": None, "top1_changed": None}))

    assert sorted(meter.created) == sorted(
        [
            "retrieval_stage.rerank.duration",
            "retrieval_stage.rerank.documents",
            "retrieval_stage.rerank.batches",
            "retrieval_stage.rerank.requests",
            "retrieval_stage.rerank.retries",
            "retrieval_stage.rerank.fallbacks",
            "retrieval_stage.rerank.top1_changes",
            "retrieval_stage.rerank.kendall_tau_normalized",
            "retrieval_stage.rerank.kendall_tau",  # deprecated: the same points, one release
            "retrieval_stage.rerank.topk_overlap",
            "retrieval_stage.rerank.max_promotion",
            "retrieval_stage.rerank.top_score",
            "retrieval_stage.rerank.score_margin",
            "retrieval_stage.rerank.rbo",
            "retrieval_stage.rerank.score_spread",
        ]
    )
    assert not rerank_metrics.enabled  # a no-op provider: the stage skips the quality signals


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


def test_configure_metrics_builds_the_exporter_otlp_target_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The resolution rules themselves are tested in test_otlp.py; here: metrics use them.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.invalid:4318")
    reader_exporters: list[object] = []
    real_reader = PeriodicExportingMetricReader

    def recording_reader(exporter: object, **kwargs: Any) -> PeriodicExportingMetricReader:
        reader_exporters.append(exporter)
        return real_reader(exporter, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdk_export, "PeriodicExportingMetricReader", recording_reader)
    provider = configure_metrics(export_interval_millis=3_600_000)
    provider.shutdown()

    (exporter,) = reader_exporters
    assert isinstance(exporter, otlp_http.OTLPMetricExporter)
    assert exporter._endpoint == "http://collector.invalid:4318/v1/metrics"


def test_an_unsupported_protocol_is_refused_like_for_tracing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")

    with pytest.raises(ValueError, match="http/json"):
        configure_metrics()


def test_otel_metrics_exporter_none_builds_no_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setattr(sdk_export, "PeriodicExportingMetricReader", None)  # would fail if used

    provider = configure_metrics()
    RerankMetrics(provider).record(**OK_CALL)  # instruments exist and do nothing
    assert provider._metric_readers == []  # SDK-private, but nothing public lists the readers
    provider.shutdown()


def test_metrics_arrive_over_real_otlp_http_with_names_units_attributes_and_values() -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from retrieval_stage.telemetry import shutdown_telemetry

    from ..otlp_receivers import http_receiver

    with http_receiver() as receiver:
        provider = configure_metrics(
            "wire-test", endpoint=receiver.url, export_interval_millis=3_600_000
        )
        RerankMetrics(provider).record(**OK_CALL)
        assert not shutdown_telemetry(provider, timeout=10.0)
        (body,) = receiver.received("/v1/metrics")

    (resource_metrics,) = ExportMetricsServiceRequest.FromString(body).resource_metrics
    resource = {kv.key: kv.value.string_value for kv in resource_metrics.resource.attributes}
    assert resource["service.name"] == "wire-test"
    (scope_metrics,) = resource_metrics.scope_metrics
    assert scope_metrics.scope.name == "retrieval_stage"
    found = {metric.name: metric for metric in scope_metrics.metrics}

    def attributes(point: Any) -> dict[str, str]:
        return {kv.key: kv.value.string_value for kv in point.attributes}

    histograms = {
        "retrieval_stage.rerank.duration": ("s", 0.042),
        "retrieval_stage.rerank.documents": ("{document}", 50),
        "retrieval_stage.rerank.batches": ("{batch}", 2),
    }
    counters = {
        "retrieval_stage.rerank.requests": ("{request}", 3),
        "retrieval_stage.rerank.retries": ("{retry}", 1),
        "retrieval_stage.rerank.fallbacks": ("{fallback}", 0),
        "retrieval_stage.rerank.top1_changes": ("{change}", 1),
    }
    assert set(found) == set(histograms) | set(counters)
    for name, (unit, value) in histograms.items():
        metric = found[name]
        assert metric.unit == unit
        (point,) = metric.histogram.data_points
        assert (point.count, point.sum) == (1, pytest.approx(value))
        assert attributes(point) == OK_ATTRS
    for name, (unit, value) in counters.items():
        metric = found[name]
        assert metric.unit == unit
        assert metric.sum.is_monotonic
        (point,) = metric.sum.data_points
        assert point.as_int == value
        assert attributes(point) == OK_ATTRS


# Whether a MeterProvider is set has no public API: these pin the metrics API's private
# placeholder provider and global slot that `metrics_configured` and `global_meter_provider`
# read, so a release that moves them fails here instead of silencing (or waking) the metrics.


def test_metrics_count_as_configured_only_with_a_real_meter_provider() -> None:
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.metrics import MeterProvider

    assert metrics_configured(MeterProvider())
    assert not metrics_configured(NoOpMeterProvider())
    # The global: the API's placeholder until an application sets one. In a fresh process, so
    # that this suite's other tests (which may set a global provider) cannot decide it.
    script = (
        "from opentelemetry import metrics\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from retrieval_stage.metrics import metrics_configured\n"
        "before = metrics_configured(None)\n"
        "metrics.set_meter_provider(MeterProvider())\n"
        "print(before, metrics_configured(None))\n"
    )
    assert _printed(script) == ["False", "True"]


def test_the_global_meter_provider_is_read_from_the_apis_own_slot() -> None:
    """`global_meter_provider` reads the API's private slot: None until set, then the provider;
    `RerankMetrics.enabled` follows it (and OTEL_PYTHON_METER_PROVIDER, which the API loads at
    the lookup `RerankMetrics` makes when built). In fresh processes: this suite's other tests
    may set a global provider."""
    import os

    script = (
        "from opentelemetry import metrics\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from retrieval_stage.metrics import RerankMetrics, global_meter_provider\n"
        "built = RerankMetrics()\n"
        "before = (global_meter_provider() is None, built.enabled)\n"
        "provider = MeterProvider()\n"
        "metrics.set_meter_provider(provider)\n"
        "print(*before, global_meter_provider() is provider, built.enabled)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_METER_PROVIDER"}
    assert _printed(script, env) == ["True", "False", "True", "True"]
    named = "from retrieval_stage.metrics import RerankMetrics\nprint(RerankMetrics().enabled)\n"
    env["OTEL_PYTHON_METER_PROVIDER"] = "sdk_meter_provider"
    assert _printed(named, env) == ["True"]


def _printed(script: str, env: dict[str, str] | None = None) -> list[str]:
    """The words `script` prints, run in a fresh interpreter (a global provider can be set
    only once per process)."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return done.stdout.split()
