"""Telemetry set-up for applications (and our CLI): tracing to OTLP and JSON logs.

Library code never calls these: it asks `trace.get_tracer` and `structlog.get_logger` and lets
the application decide. An application calls `configure_tracing()` once at start-up and gets a
TracerProvider whose spans leave through a BatchSpanProcessor, so a collector that is down,
slow or failing never blocks or breaks a rerank: `span.end()` only enqueues.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import structlog
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

__all__ = [
    "DEFAULT_SPAN_ATTRIBUTE_LIMIT",
    "BoundedBatchSpanProcessor",
    "add_trace_context",
    "configure_logging",
    "configure_metrics",
    "configure_tracing",
    "otlp_span_exporter",
]

DEFAULT_SPAN_ATTRIBUTE_LIMIT = 2048
"""Room for 200 documents in and 200 out at four attributes each, plus the span's own."""

DEFAULT_SERVICE_NAME = "retrieval-stage"
DEFAULT_EXPORT_TIMEOUT_S = 5.0


def _protocol(signal: str) -> str:
    raw = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    return raw.strip().lower()


def otlp_span_exporter(
    endpoint: str | None = None,
    *,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_EXPORT_TIMEOUT_S,
) -> SpanExporter:
    """An OTLP span exporter: http/protobuf by default, gRPC when the protocol says ``grpc``.

    `protocol` falls back to ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` then
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` (the SDK reads these only in auto-configuration, so code that
    builds its exporter must). `endpoint` is the collector's base URL: for HTTP ``/v1/traces`` is
    appended unless already there; for gRPC it is used as given. When None the exporter reads
    the standard ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables itself.
    """
    chosen = (protocol or _protocol("TRACES")).lower()
    if chosen == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(
            endpoint=endpoint, headers=dict(headers) if headers else None, timeout=timeout
        )
    if chosen not in ("http/protobuf", "http"):
        raise ValueError(f"unsupported OTLP protocol {chosen!r}: use 'http/protobuf' or 'grpc'")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(
        endpoint=endpoint, headers=dict(headers) if headers else None, timeout=timeout
    )


def configure_tracing(
    service_name: str | None = None,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    span_limits: SpanLimits | None = None,
    set_global: bool = False,
    resource_attributes: Mapping[str, Any] | None = None,
    export_timeout: float = DEFAULT_EXPORT_TIMEOUT_S,
) -> TracerProvider:
    """An SDK TracerProvider exporting over OTLP through a BatchSpanProcessor.

    `endpoint` is the collector's base URL (``http://localhost:4318`` for HTTP, ``localhost:4317``
    for gRPC); None defers to the ``OTEL_EXPORTER_OTLP_*`` variables. `exporter` replaces the
    OTLP exporter (tests pass an in-memory one). The span limits fit 200 documents in and 200 out
    (an explicit ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` wins). `service_name` falls back to
    ``OTEL_SERVICE_NAME``, then ``retrieval-stage``. Set `set_global` to install the provider as
    OpenTelemetry's global one; it is returned either way, and flushed at process exit.
    `export_timeout` (seconds) bounds each export of the exporter built here and the flush at
    shutdown, so a stuck collector never holds process exit longer than that.
    """
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    attributes: dict[str, Any] = dict(resource_attributes or {})
    attributes[SERVICE_NAME] = name
    resource = Resource.create(attributes)
    if span_limits is None:
        env_limit = os.environ.get("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT")
        span_limits = SpanLimits(
            max_span_attributes=None if env_limit else DEFAULT_SPAN_ATTRIBUTE_LIMIT
        )
    provider = TracerProvider(resource=resource, span_limits=span_limits)
    span_exporter = exporter or otlp_span_exporter(
        endpoint, protocol=protocol, headers=headers, timeout=export_timeout
    )
    provider.add_span_processor(
        BoundedBatchSpanProcessor(span_exporter, shutdown_timeout=export_timeout)
    )
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


class BoundedBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor whose shutdown waits at most `shutdown_timeout` seconds.

    The SDK's shutdown joins its worker for up to 30 s and exports every queued batch, one
    exporter timeout each: with a stuck collector and a full queue, process exit would wait a
    multiple of the exporter's timeout. Past the bound, what is still queued is dropped.
    """

    def __init__(self, span_exporter: SpanExporter, *, shutdown_timeout: float) -> None:
        super().__init__(span_exporter)
        self._shutdown_timeout_ms = max(int(shutdown_timeout * 1000), 1)

    def shutdown(self) -> None:
        """Flush what fits in the bound, then stop."""
        inner: Any = getattr(self, "_batch_processor", None)
        if inner is None:  # pragma: no cover - an SDK without the shared batch processor
            base: Any = super()
            base.shutdown()
            return
        inner.shutdown(timeout_millis=self._shutdown_timeout_ms)


def configure_metrics(*args: Any, **kwargs: Any) -> Any:
    """A MeterProvider exporting rerank metrics over OTLP; see `retrieval_stage.metrics`."""
    from .metrics import configure_metrics as _configure_metrics

    return _configure_metrics(*args, **kwargs)


def add_trace_context(
    logger: Any, method_name: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    """structlog processor: add the current span's ``trace_id``/``span_id`` as lowercase hex.

    32 and 16 hex digits, the form Grafana's trace-to-logs and logs-to-trace links match.
    """
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict["trace_id"] = format(context.trace_id, "032x")
        event_dict["span_id"] = format(context.span_id, "016x")
    return event_dict


def configure_logging(
    level: int | str = logging.INFO,
    *,
    stream: TextIO | None = None,
    json: bool = True,
) -> None:
    """Configure structlog to write one JSON object per line, correlated with traces.

    Each line carries ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``event``, the
    event's fields and, inside a span, ``trace_id`` and ``span_id``. `json=False` renders for
    a terminal instead. Writes to `stream` (default stderr).
    """
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_context,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
