"""Metrics set-up for applications (and our CLI): `configure_metrics` to OTLP.

The instruments the stage records into are `retrieval_stage.metrics.RerankMetrics`; they stay
no-ops until an application installs a MeterProvider, for example this one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from .exporters import Delivery, metric_exporter, quiet_exporter_loggers
from .otlp import DEFAULT_EXPORT_TIMEOUT_S, DEFAULT_SERVICE_NAME, exporter_off, otlp_target
from .shutdown import forget, register

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

__all__ = ["configure_metrics"]


def configure_metrics(
    service_name: str | None = None,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    export_interval_millis: int = 10_000,
    set_global: bool = False,
    reader: MetricReader | None = None,
    export_timeout: float | None = None,
    shutdown_timeout: float = 1.0,
    resource_attributes: Mapping[str, Any] | None = None,
) -> SdkMeterProvider:
    """Build an SDK MeterProvider that exports rerank metrics over OTLP.

    For applications, never for library code. ``service_name`` falls back to
    ``OTEL_SERVICE_NAME`` and then ``"retrieval-stage"``. Without ``reader``, a periodic reader
    pushes to an OTLP exporter whose endpoint, protocol (http/protobuf or grpc, the latter with
    the ``[grpc]`` extra), headers and timeout follow
    `retrieval_stage.telemetry.otlp.otlp_target`, as for tracing: an ``endpoint`` given here is
    a base URL (``/v1/metrics`` is appended for HTTP). ``OTEL_METRICS_EXPORTER=none`` builds no
    reader (instruments stay no-ops). When the endpoint answers 404 or 405 (it does not take
    metrics: Arize Phoenix), that is said once as ``telemetry.metrics_disabled`` and no more
    metrics are sent by this process.

    The global provider is set only if ``set_global``. ``export_timeout`` (seconds; default
    from ``OTEL_EXPORTER_OTLP_METRICS_TIMEOUT``/``..._TIMEOUT``, else 5) bounds each export;
    ``shutdown_timeout`` bounds ``provider.shutdown()`` and the exit hook, which shuts this
    provider down together with `configure_tracing`'s under one deadline
    (`retrieval_stage.telemetry.shutdown_telemetry`).
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    class BoundedMeterProvider(MeterProvider):
        """Shutdown defaults to `shutdown_timeout`, and tells the exit hook it happened."""

        def shutdown(self, timeout_millis: float | None = None) -> None:
            forget(self)
            super().shutdown(
                timeout_millis=shutdown_timeout * 1000 if timeout_millis is None else timeout_millis
            )

    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    deliveries: list[Delivery] = []
    readers: list[MetricReader] = []
    if reader is not None:
        readers.append(reader)
    elif not exporter_off("METRICS"):
        target = otlp_target(
            "metrics",
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            timeout=export_timeout,
            default_timeout=DEFAULT_EXPORT_TIMEOUT_S,
        )
        delivery = Delivery("metrics", target.shown)
        exporter = metric_exporter(target, delivery)
        quiet_exporter_loggers()
        deliveries.append(delivery)
        readers.append(
            PeriodicExportingMetricReader(
                exporter,
                export_interval_millis=export_interval_millis,
                export_timeout_millis=target.timeout * 1000,
            )
        )
    attributes: dict[str, Any] = dict(resource_attributes or {})
    attributes[SERVICE_NAME] = name
    provider = BoundedMeterProvider(
        resource=Resource.create(attributes), metric_readers=readers, shutdown_on_exit=False
    )
    register(provider, deliveries, shutdown_timeout)
    if set_global:
        metrics.set_meter_provider(provider)
    return provider
