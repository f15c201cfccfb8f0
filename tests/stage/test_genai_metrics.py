"""``gen_ai.client.operation.duration``: recorded by the stage with its GenAI attributes when
metrics are configured and the GenAI opt-in is on, never otherwise (issue 39).

Real WireMock behind our real client; points read through the SDK's `InMemoryMetricReader`.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.spans.genai import server_of

from ..conftest import WireMock

DURATION = "gen_ai.client.operation.duration"
# OpenTelemetry's GenAI metrics conventions advise these boundaries for the histogram.
OTEL_ADVISED_BOUNDARIES = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip


def three() -> list[Candidate]:
    return [Candidate(f"d{i}", f"text number {i}", score=1.0 - i / 10) for i in range(3)]


def metrics_named(reader: InMemoryMetricReader, name: str) -> list[Metric]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
    ]


def duration_points(reader: InMemoryMetricReader) -> tuple[Metric, list[HistogramDataPoint]]:
    (metric,) = metrics_named(reader, DURATION)
    points = list(metric.data.data_points)
    assert all(isinstance(p, HistogramDataPoint) for p in points)
    return metric, points  # type: ignore[return-value]


def test_duration_is_recorded_with_the_genai_attributes(wm: WireMock) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    address, port = server_of(wm.url) or ("", 0)
    with RerankClient(wm.url + "/vllm/all", provider="vllm", model="configured-alias") as client:
        stage = RerankStage(client, meter_provider=meters, genai_conventions=True)
        stage.run("capital?", three())
        stage.run("capital?", three())
    metric, (point,) = duration_points(reader)
    assert metric.unit == "s"
    assert point.count == 2
    assert tuple(point.explicit_bounds) == OTEL_ADVISED_BOUNDARIES
    assert dict(point.attributes or {}) == {
        "gen_ai.operation.name": "rerank",
        "gen_ai.provider.name": "vllm",
        # The configured model, never the server's answer (one series per configuration).
        "gen_ai.request.model": "configured-alias",
        "server.address": address,
        "server.port": port,
    }
    # The existing duration histogram is still there, under its own name.
    assert metrics_named(reader, "retrieval_stage.rerank.duration")
    meters.shutdown()


def test_a_failed_call_has_error_type_on_its_point(wm: WireMock) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    base = wm.url + "/cohere/error"
    with RerankClient(base, provider="cohere", model="rerank-v3.5", max_retries=0) as client:
        RerankStage(client, meter_provider=meters, genai_conventions=True).run("q", three())
        stage = RerankStage(client, meter_provider=meters, genai_conventions=True, on_error="raise")
        with pytest.raises(Exception, match="HTTP 400"):
            stage.run("q", three())
    _, (point,) = duration_points(reader)  # fallback and raise: the same failure, one series
    assert point.count == 2
    attributes = dict(point.attributes or {})
    assert attributes.pop("error.type") == "400"
    assert attributes.pop("gen_ai.provider.name") == "cohere"
    assert attributes.pop("gen_ai.request.model") == "rerank-v3.5"
    assert attributes.pop("gen_ai.operation.name") == "rerank"
    assert set(attributes) == {"server.address", "server.port"}
    meters.shutdown()


@pytest.mark.parametrize("opt_in", ["", "http"])
def test_no_genai_instrument_without_the_opt_in(
    wm: WireMock, monkeypatch: pytest.MonkeyPatch, opt_in: str
) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    with RerankClient(wm.url + "/vllm/all", provider="vllm", model="m") as client:
        RerankStage(client, meter_provider=meters).run("capital?", three())
    assert metrics_named(reader, "retrieval_stage.rerank.duration")
    assert not metrics_named(reader, DURATION)
    meters.shutdown()


def test_the_environment_opt_in_reaches_the_metrics(
    wm: WireMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    with RerankClient(wm.url + "/vllm/all", provider="vllm", model="m") as client:
        RerankStage(client, meter_provider=meters).run("capital?", three())
    _, (point,) = duration_points(reader)
    assert point.count == 1
    meters.shutdown()


def test_a_sampled_out_call_still_records_the_duration(wm: WireMock) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    tracer_provider = TracerProvider(sampler=ALWAYS_OFF)
    with RerankClient(wm.url + "/vllm/all", provider="vllm", model="m") as client:
        stage = RerankStage(
            client, tracer_provider=tracer_provider, meter_provider=meters, genai_conventions=True
        )
        stage.run("capital?", three())
    _, (point,) = duration_points(reader)
    assert point.count == 1
    assert dict(point.attributes or {})["gen_ai.provider.name"] == "vllm"
    meters.shutdown()
