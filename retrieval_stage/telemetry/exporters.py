"""OTLP exporters built from an `OtlpTarget`, each with a `Delivery` that counts what arrived.

The count lets shutdown say once, in our log format, how many spans or metric points never
reached the collector, instead of the SDK's per-attempt lines. The metrics exporter also notices
an endpoint that refuses metrics (HTTP 404/405: Arize Phoenix accepts traces only), says so once
and stops sending them for the process. Everything here uses the exporters' public API: a
wrapping `SpanExporter`, subclasses overriding `export`/`shutdown`, and a `requests.Session`
response hook to see the status code.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .._log import get_logger
from .otlp import GRPC_EXTRA_HINT, OtlpExtraMissingError, OtlpTarget, Signal

if TYPE_CHECKING:
    import requests
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

__all__ = [
    "CountingSpanExporter",
    "Delivery",
    "metric_exporter",
    "probe_collector",
    "quiet_exporter_loggers",
    "span_exporter",
]

_log = get_logger("retrieval_stage.telemetry")

REFUSING_STATUSES = frozenset({404, 405})
"""What an OTLP endpoint answers for a signal it does not take (Phoenix: metrics)."""


class Delivery:
    """Thread-safe counts for one exporter: items handed over, items delivered.

    `closed` makes every later export a no-op that fails at once: set at the shutdown deadline,
    so a batch processor's worker stops working through a queue nobody waits for.
    `refused` is set when the endpoint answered 404/405; items offered after that are dropped
    by choice and not counted as undelivered (the one ``telemetry.metrics_disabled`` line
    already said why).
    `reachable` is what is known of the collector: None until something is known, then
    whether the last export (or, before the first, `probe_collector`'s connection) went
    through. Our client reads it to decide whether to tell a rerank server that the caller's
    RERANKER span will reach the trace (`retrieval_stage.spans.handoff`).
    """

    def __init__(self, signal: Signal, shown: str) -> None:
        self.signal = signal
        self.shown = shown
        self.handed = 0
        self.delivered = 0
        self.refused_status: int | None = None
        self.reachable: bool | None = None
        self.closed = False
        self.closer: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Refuse every later export and run `closer` (the exporter's shutdown) once."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            closer = self.closer
        if closer is not None:
            closer()

    @property
    def refused(self) -> bool:
        return self.refused_status is not None

    @property
    def not_delivered(self) -> int:
        """Items handed over that never arrived: failed, in flight, or still queued."""
        with self._lock:
            return max(self.handed - self.delivered, 0)

    def hand(self, items: int) -> None:
        """`items` entered the pipeline (a span ended, points were collected)."""
        with self._lock:
            self.handed += items

    def send(self, items: int, export: Callable[[], bool]) -> bool:
        """Run one `export` of `items` already counted by `hand`; record what arrived."""
        if self.closed or self.refused:
            if self.refused:
                self._forget(items)
            return False
        ok = export()
        self.reachable = ok
        if ok:
            with self._lock:
                self.delivered += items
        elif self.refused:
            self._forget(items)
            _log.warning(
                f"telemetry.{self.signal}_disabled",
                endpoint=self.shown,
                status=self.refused_status,
                reason=f"the endpoint does not accept OTLP {self.signal}; "
                f"no more {self.signal} are sent by this process",
            )
        return ok

    def probed(self, reachable: bool) -> None:
        """What `probe_collector` found, unless an export has already said more."""
        if self.reachable is None:
            self.reachable = reachable

    def _forget(self, items: int) -> None:
        with self._lock:
            self.handed -= items

    def refuse(self, status: int) -> None:
        """The endpoint answered `status` (404/405): it does not take this signal."""
        if self.refused_status is None:
            self.refused_status = status


class CountingSpanExporter(SpanExporter):
    """Wraps a span exporter: counts delivered spans, and can be closed from another thread."""

    def __init__(
        self,
        inner: SpanExporter,
        delivery: Delivery,
        *,
        after: Callable[[Sequence[ReadableSpan]], None] | None = None,
    ) -> None:
        self.inner = inner
        self.delivery = delivery
        self.after = after
        """Called with each batch once it is exported (or failed to be)."""
        delivery.closer = inner.shutdown

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        def send() -> bool:
            try:
                return self.inner.export(spans) is SpanExportResult.SUCCESS
            except Exception:  # an exporter that raises has failed to export, nothing more
                return False

        ok = self.delivery.send(len(spans), send)
        if self.after is not None:
            self.after(spans)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Refuse further exports and shut the inner exporter (interrupting its retry waits)."""
        self.delivery.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


PROBE_TIMEOUT_S = 1.0
"""How long `probe_collector` waits for the collector to accept a connection."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def collector_address(target: OtlpTarget) -> tuple[str, int] | None:
    """The host and port `target`'s exporter connects to, or None when it cannot be told."""
    endpoint = target.endpoint if "//" in target.endpoint else f"//{target.endpoint}"
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme, 4317 if target.protocol == "grpc" else 4318)
    return parts.hostname, port


def probe_collector(target: OtlpTarget, delivery: Delivery) -> threading.Thread | None:
    """In a daemon thread, open (and close) one TCP connection to `target`'s collector and
    record in `delivery` whether it was accepted, so the first spans of a process already know
    whether anything receives them: a library used without a collector (nothing on
    ``localhost:4318``) must not tell a rerank server that its RERANKER span reaches the trace.
    Sends no bytes; returns the thread (None when the endpoint names no host)."""
    address = collector_address(target)
    if address is None:
        return None

    def probe() -> None:
        try:
            with socket.create_connection(address, timeout=PROBE_TIMEOUT_S):
                pass
        except OSError:
            delivery.probed(False)
        else:
            delivery.probed(True)

    thread = threading.Thread(target=probe, name="otlp-collector-probe", daemon=True)
    thread.start()
    return thread


def _missing_grpc(signal: Signal, exc: ImportError) -> OtlpExtraMissingError:
    return OtlpExtraMissingError(
        f"OTLP over gRPC ({signal}) needs grpcio and the gRPC exporter: {GRPC_EXTRA_HINT}"
        f" (or set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf); {exc}"
    )


def span_exporter(target: OtlpTarget) -> SpanExporter:
    """The OTLP span exporter for `target` (gRPC imported only when asked for)."""
    headers = dict(target.headers) or None
    if target.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError as exc:
            raise _missing_grpc("traces", exc) from exc
        return GrpcSpanExporter(endpoint=target.endpoint, headers=headers, timeout=target.timeout)
    # OTLP/HTTP: the SDK's exporter with our byte-identical, ~7x faster protobuf encoder
    # (RETRIEVAL_STAGE_FAST_OTLP=0 turns it off); gRPC keeps the SDK's own path.
    from .otlp_exporter import FastOTLPSpanExporter

    return FastOTLPSpanExporter(endpoint=target.endpoint, headers=headers, timeout=target.timeout)


def _points(metrics_data: MetricsData) -> int:
    return sum(
        len(metric.data.data_points)
        for resource_metrics in metrics_data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    )


def _refusal_hook(delivery: Delivery) -> Callable[..., Any]:
    def hook(response: requests.Response, *args: object, **kwargs: object) -> None:
        if response.status_code in REFUSING_STATUSES:
            delivery.refuse(response.status_code)

    return hook


def metric_exporter(target: OtlpTarget, delivery: Delivery) -> MetricExporter:
    """The SDK's OTLP metric exporter for `target`, reporting to `delivery`.

    Over HTTP a 404/405 answer turns metrics off for the process (see `Delivery`); over gRPC
    the counts are kept but refusal is not detected.
    """
    from opentelemetry.sdk.metrics.export import MetricExportResult

    headers = dict(target.headers) or None

    def tracked(data: MetricsData, export: Callable[[], MetricExportResult]) -> MetricExportResult:
        items = _points(data)
        if not (delivery.closed or delivery.refused):
            delivery.hand(items)
        ok = delivery.send(items, lambda: export() is MetricExportResult.SUCCESS)
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    if target.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )
        except ImportError as exc:
            raise _missing_grpc("metrics", exc) from exc

        class TrackedGrpc(GrpcMetricExporter):
            def export(
                self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
            ) -> MetricExportResult:
                return tracked(
                    metrics_data,
                    lambda: super(TrackedGrpc, self).export(metrics_data, timeout_millis, **kwargs),
                )

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                delivery.close()

        grpc_exporter = TrackedGrpc(
            endpoint=target.endpoint, headers=headers, timeout=target.timeout
        )
        delivery.closer = lambda: GrpcMetricExporter.shutdown(grpc_exporter)
        return grpc_exporter

    import requests
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    class TrackedHttp(OTLPMetricExporter):
        def export(
            self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            return tracked(
                metrics_data,
                lambda: super(TrackedHttp, self).export(metrics_data, timeout_millis, **kwargs),
            )

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            delivery.close()

    session = requests.Session()
    session.hooks["response"].append(_refusal_hook(delivery))
    http_exporter = TrackedHttp(
        endpoint=target.endpoint, headers=headers, timeout=target.timeout, session=session
    )
    delivery.closer = lambda: OTLPMetricExporter.shutdown(http_exporter)
    return http_exporter


def quiet_exporter_loggers() -> None:
    """Keep the SDK exporters' per-attempt lines off a bare terminal.

    Python prints WARNING+ of a logger with no handler anywhere up its tree ("last resort").
    A NullHandler on ``opentelemetry.exporter`` stops that and nothing else: an application
    that configured logging still gets the records through its own handlers, at its levels,
    and our own summary (``telemetry.undelivered``) says what was lost.
    """
    exporter_logger = logging.getLogger("opentelemetry.exporter")
    if not any(isinstance(h, logging.NullHandler) for h in exporter_logger.handlers):
        exporter_logger.addHandler(logging.NullHandler())
