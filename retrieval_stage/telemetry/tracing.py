"""Tracing set-up for applications (and our CLI): `configure_tracing` to OTLP.

Library code never calls this: it asks `trace.get_tracer` and lets the application decide. An
application calls `configure_tracing()` once at start-up and gets a TracerProvider whose spans
leave through a `BoundedBatchSpanProcessor`, so a collector that is down, slow or failing never
blocks or breaks a rerank: `span.end()` only enqueues.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from openinference.semconv.resource import ResourceAttributes
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util import BoundedList

from .._log import get_logger
from .exporters import (
    CountingSpanExporter,
    Delivery,
    probe_collector,
    quiet_exporter_loggers,
    span_exporter,
)
from .otlp import DEFAULT_EXPORT_TIMEOUT_S, DEFAULT_SERVICE_NAME, exporter_off, otlp_target
from .shutdown import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    in_background,
    is_registered,
    register,
    registered_timeout,
    shutdown_telemetry,
)

__all__ = [
    "DEFAULT_SPAN_ATTRIBUTE_LIMIT",
    "PROJECT_NAME",
    "BoundedBatchSpanProcessor",
    "configure_tracing",
    "drop_empty_lists",
    "otlp_span_exporter",
]

DEFAULT_SPAN_ATTRIBUTE_LIMIT = 2048
"""Room for 200 documents in and 200 out at four attributes each, plus the span's own."""


PROJECT_NAME = ResourceAttributes.PROJECT_NAME
"""The resource attribute Arize Phoenix routes spans by (``openinference.project.name``)."""

_log = get_logger("retrieval_stage.telemetry")


def otlp_span_exporter(
    endpoint: str | None = None,
    *,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> SpanExporter:
    """An OTLP span exporter: http/protobuf by default, gRPC when the protocol says ``grpc``.

    Endpoint, protocol, headers and timeout follow `retrieval_stage.telemetry.otlp.otlp_target`: the
    arguments first, then the standard ``OTEL_EXPORTER_OTLP_*`` variables (an `endpoint`
    given here is a base URL: ``/v1/traces`` is appended for HTTP). gRPC needs the ``[grpc]``
    extra; without it this raises `OtlpExtraMissingError` naming the install command.
    """
    return span_exporter(
        otlp_target(
            "traces",
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            timeout=timeout,
            default_timeout=DEFAULT_EXPORT_TIMEOUT_S,
        )
    )


def _project(given: str | None, attributes: Mapping[str, Any], service_name: str) -> str:
    """The Phoenix project: `given`, else the resource attributes', else the service name."""
    if given:
        return given
    explicit = attributes.get(PROJECT_NAME)
    if explicit:
        return str(explicit)
    from_env = OTELResourceDetector().detect().attributes.get(PROJECT_NAME)
    return str(from_env) if from_env else service_name


def configure_tracing(
    service_name: str | None = None,
    *,
    project: str | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    span_limits: SpanLimits | None = None,
    set_global: bool = False,
    resource_attributes: Mapping[str, Any] | None = None,
    export_timeout: float | None = None,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
) -> TracerProvider:
    """An SDK TracerProvider exporting over OTLP through a BatchSpanProcessor.

    `endpoint` is the collector's base URL (``http://localhost:4318`` for HTTP, ``localhost:4317``
    for gRPC); None defers to the ``OTEL_EXPORTER_OTLP_*`` variables
    (`retrieval_stage.telemetry.otlp`).
    `exporter` replaces the OTLP exporter (tests pass an in-memory one);
    ``OTEL_TRACES_EXPORTER=none`` builds none. The span limits fit 200 documents in and 200 out
    (an explicit ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` wins). `service_name` falls back to
    ``OTEL_SERVICE_NAME``, then ``retrieval-stage``. `project` is the Arize Phoenix /
    OpenInference project the spans land in (resource attribute ``openinference.project.name``):
    the given one, else that key of `resource_attributes` or ``OTEL_RESOURCE_ATTRIBUTES``, else
    the service name. Set `set_global` to install the provider as OpenTelemetry's global one;
    it is returned either way.

    `export_timeout` (seconds; default ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT``/``..._TIMEOUT``,
    else 5) bounds each export. Shutdown is bounded as a whole by `shutdown_timeout`: whether
    by ``provider.shutdown()``, by `shutdown_telemetry` (traces and metrics under one deadline)
    or at process exit (this replaces the SDK's own exit hook, which could wait 30 s), what has
    not reached the collector by then is dropped and reported once as ``telemetry.undelivered``.
    """
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    attributes: dict[str, Any] = dict(resource_attributes or {})
    attributes[SERVICE_NAME] = name
    attributes[PROJECT_NAME] = _project(project, attributes, name)
    resource = Resource.create(attributes)
    if span_limits is None:
        env_limit = os.environ.get("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT")
        span_limits = SpanLimits(
            max_span_attributes=None if env_limit else DEFAULT_SPAN_ATTRIBUTE_LIMIT
        )
    provider = _ReportingTracerProvider(
        resource=resource, span_limits=span_limits, shutdown_on_exit=False
    )
    processor: BoundedBatchSpanProcessor | None = None
    if exporter is not None or not exporter_off("TRACES"):
        if exporter is None:
            target = otlp_target(
                "traces",
                endpoint=endpoint,
                protocol=protocol,
                headers=headers,
                timeout=export_timeout,
                default_timeout=DEFAULT_EXPORT_TIMEOUT_S,
            )
            quiet_exporter_loggers()
            processor = BoundedBatchSpanProcessor(
                span_exporter(target), shutdown_timeout=shutdown_timeout, shown=target.shown
            )
            probe_collector(target, processor.delivery)
        else:
            processor = BoundedBatchSpanProcessor(exporter, shutdown_timeout=shutdown_timeout)
        provider.add_span_processor(processor)
    register(provider, [processor.delivery] if processor else [], shutdown_timeout)
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


class _ReportingTracerProvider(TracerProvider):
    """``shutdown()`` goes through `shutdown_telemetry`: bounded, what was lost said once at
    that moment, and the exit hook then has nothing left to report for it."""

    def shutdown(self) -> None:
        if is_registered(self):
            shutdown_telemetry(self, timeout=registered_timeout(self))
        else:  # shutdown_telemetry's own call, or a second shutdown
            super().shutdown()


class BoundedBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor whose shutdown waits at most `shutdown_timeout` seconds.

    The SDK's shutdown joins its worker for up to 30 s and exports every queued batch, one
    exporter timeout each: with a stuck collector and a full queue, process exit would wait a
    multiple of the exporter's timeout. Here the SDK's shutdown runs in a helper thread; past
    the bound the exporter is closed (its retry waits end, queued batches are not sent) and
    what never arrived is counted in `delivery`.

    A span is queued without the SDK's empty event and link lists (`drop_empty_lists`: the
    same span to every reader, six fewer objects while it waits), and an exported batch is
    released a span or two at a time by the calls that end the next spans (`_Exported`), not
    all at once (issue 38).
    """

    def __init__(
        self,
        span_exporter: SpanExporter,
        *,
        shutdown_timeout: float,
        shown: str | None = None,
    ) -> None:
        self.delivery = Delivery("traces", shown or type(span_exporter).__name__)
        self._exported = _Exported()
        self.exporter = CountingSpanExporter(
            span_exporter, self.delivery, after=self._exported.keep
        )
        super().__init__(self.exporter)
        self.shutdown_timeout = shutdown_timeout

    @property
    def delivers(self) -> bool:
        """Whether spans ended now are expected to reach a collector: not when the exporter
        says it delivers nowhere (a ``delivers`` attribute of False), the processor is shut,
        or the collector is known to be unreachable (`Delivery.reachable`)."""
        delivery = self.delivery
        if delivery.closed or delivery.reachable is False:
            return False
        return getattr(self.exporter.inner, "delivers", True) is not False

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.delivery.hand(1)
            drop_empty_lists(span)
        super().on_end(span)
        self._exported.release()

    def shutdown(self) -> None:
        """Flush what fits in the bound, then stop."""
        in_background(super().shutdown).wait(max(self.shutdown_timeout, 0.0))
        self.delivery.close()
        self._exported.clear()


def drop_empty_lists(span: ReadableSpan) -> None:
    """Swap a finished span's event and link lists for ``()`` where they are empty and dropped
    nothing: the SDK's `BoundedList` is three objects (itself, a deque, a lock) that an empty
    span keeps while it waits in a queue. Nothing a reader can see changes: ``events`` and
    ``links`` are ``()`` either way, the drop counts 0, ``to_json`` the same; the span has
    ended, so nothing can be added to them. Done in place, on the `ReadableSpan` every
    processor of the provider shares, so a processor after ours that edits it is still
    exported as it left it.

    A batch processor frees the spans of a batch all at once, after the export, so most of
    their objects' frees cannot offset the garbage collector's allocation count (it stops at
    zero): each object a queued span holds brings the next collection nearer, and at 64
    concurrent callers a collection walks every call in flight.
    """
    for name in ("_events", "_links"):
        held = getattr(span, name, None)
        if type(held) is BoundedList and not held.dropped and not len(held):
            setattr(span, name, ())


_KEPT_BATCHES = 2


class _Exported:
    """The batches an export is done with, released a span at a time by each `on_end`.

    The SDK's batch processor drops an exported batch at once, on its worker thread: hundreds
    of spans' objects freed together, most of them after the garbage collector's allocation
    count has already fallen to zero (it never goes below), so those frees never offset the
    allocations of the spans that made them, and every traced call brings the next collection
    nearer (at 64 calls in flight, a collection walks every call's objects). Freed one per
    span ended, between the next calls' allocations, the frees match the allocations one for
    one (two per span ended emptied a batch in half the time to the next export, and the
    other half's allocations were offset by nothing).

    Measured at 64 concurrent callers (`benchmarks.studies.traced_layers`, issue 38): freed
    all at once, 17.6 collections per 1,000 calls; two per span ended, 10.3-13.7 and the
    collector's CPU 15-17 µs a call; one per span ended, 8.5-9.1 and 5.0-5.6 µs (sampled
    out: 5.9-6.5 and under 1 µs). Two are freed per span ended while a second batch waits
    behind the first, so the kept spans stay about one batch; a batch is dropped whole when a
    third arrives (no span ended meanwhile), and everything at shutdown. While no span ends,
    up to two exported batches (2 x 512 spans by default) wait for the next export or the
    shutdown: fewer than the SDK's own queue holds (2,048).
    """

    __slots__ = ("_batches",)

    def __init__(self) -> None:
        self._batches: deque[list[ReadableSpan]] = deque()

    def keep(self, spans: Sequence[ReadableSpan]) -> None:
        """On the worker thread, after an export: keep this batch behind the one still kept,
        dropping any older (at most `_KEPT_BATCHES` are kept)."""
        if not spans:
            return
        batches = self._batches
        while len(batches) >= _KEPT_BATCHES:
            try:
                batches.popleft()
            except IndexError:  # released meanwhile by the threads ending spans
                break
        batches.append(list(spans))  # a list of our own: the exporter's is its own to keep

    def release(self) -> None:
        """Drop one exported span, two while a second batch waits (any thread: the deque's
        and list's operations are atomic)."""
        batches = self._batches
        for _ in range(2 if len(batches) > 1 else 1):
            try:
                batch = batches[0]
            except IndexError:  # nothing kept
                return
            try:
                batch.pop()
            except IndexError:  # emptied by another thread that has not removed it yet
                self._remove_empty()
                continue
            if not batch:  # emptied: the next release starts on the next batch
                self._remove_empty()

    def _remove_empty(self) -> None:
        """Remove an emptied batch: by equality, an empty list is equal only to an emptied
        batch (`keep` keeps none empty), whichever thread emptied it."""
        with contextlib.suppress(ValueError):  # another thread removed it first
            self._batches.remove([])

    def clear(self) -> None:
        self._batches.clear()
