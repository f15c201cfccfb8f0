"""The server's own spans and metrics: one span per request per model batch, and instruments.

The SERVER span of each request is the ASGI instrumentation's (it continues the caller's W3C
context). Under it, for every model batch the request ran in, a ``rerank.batch`` span covers
the batch's run and says what ran (model, pairs, tokens, requests) and how long this request
had waited; it links to every request span of that batch, so a batch shared by three traces
can be followed from any of them. No query or document text is ever recorded here: the
caller's RERANKER span holds the documents, once.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .._version import __version__
from .batcher import Batch

__all__ = [
    "ATTR_BATCH_NUMBER",
    "ATTR_BATCH_PAIRS",
    "ATTR_BATCH_REQUESTS",
    "ATTR_BATCH_TOKENS",
    "ATTR_MODEL",
    "ATTR_QUEUE_WAIT",
    "ATTR_REQUEST_PAIRS",
    "ATTR_REQUEST_TOKENS",
    "ATTR_RERANKER",
    "BATCH_SPAN_NAME",
    "ServerInstruments",
    "record_batch_spans",
]

BATCH_SPAN_NAME = "rerank.batch"
ATTR_MODEL = "retrieval_stage.model"
ATTR_RERANKER = "retrieval_stage.server.reranker"
ATTR_BATCH_NUMBER = "retrieval_stage.batch.number"
ATTR_BATCH_PAIRS = "retrieval_stage.batch.pairs"
ATTR_BATCH_TOKENS = "retrieval_stage.batch.tokens"
ATTR_BATCH_REQUESTS = "retrieval_stage.batch.requests"
ATTR_REQUEST_PAIRS = "retrieval_stage.batch.request_pairs"
ATTR_REQUEST_TOKENS = "retrieval_stage.batch.request_tokens"
ATTR_QUEUE_WAIT = "retrieval_stage.batch.queue_wait_s"

METER_NAME = "retrieval_stage.server"
REQUEST_DURATION = "retrieval_stage.server.request.duration"
BATCH_SIZE = "retrieval_stage.server.batch.size"
BATCH_TOKENS = "retrieval_stage.server.batch.tokens"
QUEUE_DEPTH = "retrieval_stage.server.queue.depth"

# A CPU model answers one small batch in ~5 ms and a full one in seconds.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PAIR_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024)


def record_batch_spans(tracer: trace.Tracer, batch: Batch, model: str, reranker: str) -> None:
    """One ``rerank.batch`` span per request of `batch`, each a child of that request's span
    and linked to every request span of the batch."""
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
                ATTR_MODEL: model,
                ATTR_RERANKER: reranker,
                ATTR_BATCH_NUMBER: batch.number,
                ATTR_BATCH_PAIRS: batch.pairs,
                ATTR_BATCH_TOKENS: batch.tokens,
                ATTR_BATCH_REQUESTS: len(batch.shares),
                ATTR_REQUEST_PAIRS: share.pairs,
                ATTR_REQUEST_TOKENS: share.tokens,
                ATTR_QUEUE_WAIT: round(share.queue_wait, 6),
            },
        )
        if batch.error is not None:
            span.set_status(Status(StatusCode.ERROR, f"model failed: {type(batch.error).__name__}"))
            span.set_attribute("error.type", type(batch.error).__name__)
        span.end(end_time=batch.ended_ns)


class ServerInstruments:
    """Request duration, batch size and tokens, and queue depth; no-ops without a
    MeterProvider (the library never installs one)."""

    def __init__(
        self, meter_provider: metrics.MeterProvider | None, depth: Callable[[], int]
    ) -> None:
        # The API's own lookup, as `RerankMetrics` does: `meter_provider`, else the global one.
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._duration = meter.create_histogram(
            REQUEST_DURATION,
            unit="s",
            description="Wall time of one POST /rerank, queue wait and model time included.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._batch_size = meter.create_histogram(
            BATCH_SIZE,
            unit="{pair}",
            description="(query, text) pairs in one model batch.",
            explicit_bucket_boundaries_advisory=PAIR_BUCKETS,
        )
        self._batch_tokens = meter.create_histogram(
            BATCH_TOKENS, unit="{token}", description="Tokens in one model batch."
        )

        def observe(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
            return [metrics.Observation(depth())]

        meter.create_observable_gauge(
            QUEUE_DEPTH,
            callbacks=[observe],
            unit="{request}",
            description="Requests waiting for their first model batch.",
        )

    def request(self, duration_s: float, *, status: int, shape: str) -> None:
        """One finished ``POST /rerank``."""
        self._duration.record(
            duration_s, {"http.response.status_code": status, "retrieval_stage.shape": shape}
        )

    def batch(self, batch: Batch, model: str) -> None:
        """One model batch that ran."""
        attributes = {
            ATTR_MODEL: model,
            "retrieval_stage.outcome": "error" if batch.error else "ok",
        }
        self._batch_size.record(batch.pairs, attributes)
        self._batch_tokens.record(batch.tokens, attributes)
