"""The server's own telemetry: what each request and each model batch leave behind.

The SERVER span of each request is the ASGI instrumentation's (it continues the caller's W3C
context); `record_request` writes what the request did on it, records its duration and logs
its ``server.request`` line. Under it, for every model batch the request ran in, a
``rerank.batch`` span covers the batch's run and says what ran (model, pairs, tokens, requests)
and how long this request had waited; it links to every request span of that batch, so a batch
shared by three traces can be followed from any of them (`record_batch` also meters and logs
the batch). Each span's OpenInference kind, and the RERANKER span the request span becomes for
a caller without one, are `retrieval_stage.server.reranker_span`'s; no query or document text
is recorded here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .._log import get_logger
from .._version import __version__
from ..spans.keys import (
    ATTR_BATCH_NUMBER,
    ATTR_BATCH_PAIRS,
    ATTR_BATCH_REQUESTS,
    ATTR_BATCH_TOKENS,
    ATTR_DOCUMENTS,
    ATTR_MODEL,
    ATTR_MODEL_PRECISION,
    ATTR_OUTCOME,
    ATTR_QUEUE_WAIT,
    ATTR_REQUEST_PAIRS,
    ATTR_REQUEST_TOKENS,
    ATTR_SERVER_BATCHES,
    ATTR_SERVER_RERANKER,
    ATTR_SERVER_TOKENS,
    ATTR_SHAPE,
    METRIC_SERVER_BATCH_SIZE,
    METRIC_SERVER_BATCH_TOKENS,
    METRIC_SERVER_QUEUE_DEPTH,
    METRIC_SERVER_REQUEST_DURATION,
    SERVER_METER_NAME,
)
from ..spans.status import mark_ok
from .batcher import Batch

__all__ = [
    "BATCH_SPAN_NAME",
    "OkOnSuccess",
    "RequestRecord",
    "ServerInstruments",
    "record_batch",
    "record_batch_spans",
    "record_request",
    "route_not_target",
]

BATCH_SPAN_NAME = "rerank.batch"

_log = get_logger("retrieval_stage.server")

# A CPU model answers one small batch in ~5 ms and a full one in seconds.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PAIR_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024)


def record_batch_spans(
    tracer: trace.Tracer,
    batch: Batch,
    model: str,
    reranker: str,
    *,
    precision: str | None = None,
) -> None:
    """One ``rerank.batch`` span per request of `batch`, each a child of that request's span
    and linked to every request span of the batch; `precision` (the embedding model's, as it
    ran) goes on each as ``retrieval_stage.model.precision``."""
    contexts = [s.ticket.context for s in batch.shares]
    links = []
    for context in contexts:
        span_context = trace.get_current_span(context).get_span_context()
        if span_context.is_valid:
            links.append(Link(span_context))
    for share in batch.shares:
        parent = trace.get_current_span(share.ticket.context)
        if not parent.get_span_context().is_valid:
            continue
        span = tracer.start_span(
            BATCH_SPAN_NAME,
            context=share.ticket.context,
            kind=SpanKind.INTERNAL,
            links=links,
            start_time=batch.started_ns,
            attributes={
                # A link between the request and the model, as OpenInference's CHAIN is: never
                # a second RERANKER (`retrieval_stage.server.reranker_span`).
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.CHAIN.value,
                ATTR_MODEL: model,
                ATTR_SERVER_RERANKER: reranker,
                ATTR_BATCH_NUMBER: batch.number,
                ATTR_BATCH_PAIRS: batch.pairs,
                ATTR_BATCH_TOKENS: batch.tokens,
                ATTR_BATCH_REQUESTS: len(batch.shares),
                ATTR_REQUEST_PAIRS: share.pairs,
                ATTR_REQUEST_TOKENS: share.tokens,
                ATTR_QUEUE_WAIT: round(share.queue_wait, 6),
                **({ATTR_MODEL_PRECISION: precision} if precision is not None else {}),
            },
        )
        if batch.error is not None:
            span.set_status(Status(StatusCode.ERROR, f"model failed: {type(batch.error).__name__}"))
            span.set_attribute("error.type", type(batch.error).__name__)
        else:
            mark_ok(span)
        span.end(end_time=batch.ended_ns)


class ServerInstruments:
    """Request duration, batch size and tokens, and queue depth; no-ops without a
    MeterProvider (the library never installs one)."""

    def __init__(
        self, meter_provider: metrics.MeterProvider | None, depth: Callable[[], int]
    ) -> None:
        # The API's own lookup, as `RerankMetrics` does: `meter_provider`, else the global one.
        meter = metrics.get_meter(SERVER_METER_NAME, __version__, meter_provider)
        self._duration = meter.create_histogram(
            METRIC_SERVER_REQUEST_DURATION,
            unit="s",
            description="Wall time of one POST /rerank, queue wait and model time included.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._batch_size = meter.create_histogram(
            METRIC_SERVER_BATCH_SIZE,
            unit="{pair}",
            description="(query, text) pairs in one model batch.",
            explicit_bucket_boundaries_advisory=PAIR_BUCKETS,
        )
        self._batch_tokens = meter.create_histogram(
            METRIC_SERVER_BATCH_TOKENS, unit="{token}", description="Tokens in one model batch."
        )

        def observe(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
            return [metrics.Observation(depth())]

        meter.create_observable_gauge(
            METRIC_SERVER_QUEUE_DEPTH,
            callbacks=[observe],
            unit="{request}",
            description="Requests waiting for their first model batch.",
        )

    def request(self, duration_s: float, *, status: int, shape: str) -> None:
        """One finished ``POST /rerank``."""
        self._duration.record(duration_s, {"http.response.status_code": status, ATTR_SHAPE: shape})

    def batch(self, batch: Batch, model: str) -> None:
        """One model batch that ran."""
        attributes = {
            ATTR_MODEL: model,
            ATTR_OUTCOME: "error" if batch.error else "ok",
        }
        self._batch_size.record(batch.pairs, attributes)
        self._batch_tokens.record(batch.tokens, attributes)


@dataclass
class RequestRecord:
    """What one ``POST /rerank`` did, filled in as it goes; `record_request` reports it.

    Until the body is parsed the shape is ``unknown``; tokens, batches and the queue wait stay
    0 unless the request got its scores; the status stays 200 unless a failure set it."""

    started: float
    shape: str = "unknown"
    texts: int = 0
    tokens: int = 0
    batches: int = 0
    queue_wait: float = 0.0
    status: int = 200
    error_type: str | None = None


UNMATCHED_TARGET = "(unmatched)"
"""What a span says of a path the server does not serve (a scanner's, say): never the path."""


def route_not_target(routes: tuple[str, ...]) -> Callable[[trace.Span, dict[str, Any]], None]:
    """A server request hook for the ASGI instrumentation: the route template in place of the
    raw target on the SERVER span (``http.target``, ``http.url``, and ``url.path`` and
    ``url.query`` where the new conventions are on), so no path or query string a caller
    sent lands in the traces."""

    def hook(span: trace.Span, scope: dict[str, Any]) -> None:
        if not span.is_recording():
            return
        path = str(scope.get("path", ""))
        route = path if path in routes else UNMATCHED_TARGET
        server = scope.get("server") or ("", None)
        host = f"{server[0]}:{server[1]}" if server[1] is not None else str(server[0])
        span.set_attribute("http.target", route)
        span.set_attribute("http.url", f"{scope.get('scheme', 'http')}://{host}{route}")
        recorded = getattr(span, "attributes", None) or {}
        if "url.path" in recorded:
            span.set_attribute("url.path", route)
        if "url.query" in recorded:
            span.set_attribute("url.query", "")

    return hook


class OkOnSuccess:
    """ASGI middleware inside the OpenTelemetry one: a request answered below 400 ends its
    SERVER span (a RERANKER or a CHAIN) with status OK, as OpenInference's instrumentations end
    theirs; the ASGI instrumentation leaves it UNSET, and sets ERROR itself at 500 and above.
    A refused request (4xx) stays UNSET, as OpenTelemetry's HTTP conventions have a server's
    span for a client's error; a caller that hung up before an answer is never OK."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        span = trace.get_current_span()

        async def sending(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start" and message.get("status", 500) < 400:
                mark_ok(span)
            await send(message)

        await self.app(scope, receive, sending)


def record_request(
    span: trace.Span, instruments: ServerInstruments, record: RequestRecord, model: str
) -> None:
    """The finished request's attributes on its SERVER `span`, its duration point, and its
    one ``server.request`` access-log line."""
    duration = time.monotonic() - record.started
    if span.is_recording():
        span.set_attribute(ATTR_SHAPE, record.shape)
        span.set_attribute(ATTR_DOCUMENTS, record.texts)
        span.set_attribute(ATTR_MODEL, model)
        span.set_attribute(ATTR_SERVER_TOKENS, record.tokens)
        span.set_attribute(ATTR_SERVER_BATCHES, record.batches)
        if record.error_type is not None:
            span.set_attribute("error.type", record.error_type)
    instruments.request(duration, status=record.status, shape=record.shape)
    _log.info(
        "server.request",
        status=record.status,
        shape=record.shape,
        texts=record.texts,
        tokens=record.tokens,
        batches=record.batches,
        queue_wait_ms=round(record.queue_wait * 1000, 2),
        duration_ms=round(duration * 1000, 2),
        error_type=record.error_type,
    )


def record_batch(
    tracer: trace.Tracer,
    instruments: ServerInstruments,
    batch: Batch,
    model: str,
    reranker: str,
    *,
    precision: str | None = None,
) -> None:
    """One model batch that ran: its ``rerank.batch`` spans, its points, its debug line."""
    record_batch_spans(tracer, batch, model, reranker, precision=precision)
    instruments.batch(batch, model)
    _log.debug(
        "server.batch",
        number=batch.number,
        requests=len(batch.shares),
        pairs=batch.pairs,
        tokens=batch.tokens,
        duration_ms=round((batch.ended - batch.started) * 1000, 2),
        error=type(batch.error).__name__ if batch.error else None,
    )
