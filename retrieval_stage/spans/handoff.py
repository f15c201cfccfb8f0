"""The request header by which our client tells a rerank server that the caller of this very
request holds the rerank's RERANKER span, and will export it.

One rerank must show as exactly one RERANKER span in a trace, wherever the trace began. Our
`RerankStage` writes that span on the caller's side (with the caller's own document ids and
texts); ``retrieval-stage serve`` writes one on its request span for callers that have none
(curl, LlamaIndex's ``TextEmbeddingInference``, Haystack's TEI ranker). So the client sends
one header, ``x-rstage-reranker: <trace id>-<span id>`` (`HEADER`), naming the RERANKER span it
vouches for, and only when that span

- is a RERANKER span our writer made, recording and sampled, and
- will be exported: a span processor of its provider sends spans somewhere (`will_export`):
  a CLI that only counts its spans, or a collector known to be unreachable, does not count.

The server honours the header only when the span it names is in the request's own trace
(`handed_off`), and then keeps its request span a plain server hop.

Why a header of our own and not a W3C ``tracestate`` entry (``rstage=rr``, as before): W3C
propagators forward ``tracestate`` from a service's incoming request to every call it makes
downstream, so a service that received the entry passed it on to its own rerank calls, made
without a RERANKER span of its own, and the server then wrote none either. A plain header
reaches only the server the client called: nothing forwards it. An HTTP client
instrumentation that adds a CLIENT span between our RERANKER span and the request leaves it as
it is, which a check of the request's parent span against the named span would not.
An inherited ``rstage`` ``tracestate`` entry (from an earlier release upstream) is dropped
from what we send, so no server of that release reads it as this hop's.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import Span, SpanContext

from .otel_private import span_attributes, span_processors

__all__ = [
    "HEADER",
    "LEGACY_TRACESTATE_KEY",
    "WRITER_SCOPE",
    "handed_off",
    "is_our_reranker_span",
    "mark_handoff",
    "marker_value",
    "will_export",
]

HEADER = "x-rstage-reranker"
"""The request header naming the caller's RERANKER span: ``<32 hex trace id>-<16 hex span id>``."""

LEGACY_TRACESTATE_KEY = "rstage"
"""The ``tracestate`` key earlier releases marked the hand-off with (``rstage=rr``): never
sent now, and ignored by the server."""

WRITER_SCOPE = "retrieval_stage"
"""The instrumentation scope (tracer name) of `RerankerSpans`, the RERANKER span writer."""

_HEADER_BYTES = HEADER.encode("ascii")
_LEGACY = LEGACY_TRACESTATE_KEY + "="
_HEX = frozenset(b"0123456789abcdefABCDEF")
_RERANKER = OpenInferenceSpanKindValues.RERANKER.value


def is_our_reranker_span(span: Span) -> bool:
    """True when `span` is a RERANKER span of our writer that is recording and sampled: one
    that will reach the trace, holding the caller's documents, if something exports it."""
    if not isinstance(span, ReadableSpan) or not span.is_recording():
        return False
    if not span.get_span_context().trace_flags.sampled:
        return False
    scope = span.instrumentation_scope
    if scope is None or scope.name != WRITER_SCOPE:
        return False
    return span_attributes(span).get(SpanAttributes.OPENINFERENCE_SPAN_KIND) == _RERANKER


def _delivers(thing: object) -> bool | None:
    """What `thing` says of itself (a ``delivers`` attribute), or None when it says nothing."""
    said = getattr(thing, "delivers", None)
    return None if said is None else bool(said)


def will_export(span: Span) -> bool:
    """True when a span processor of `span`'s provider will send it somewhere.

    A processor or exporter that says so itself (a ``delivers`` attribute: our
    `BoundedBatchSpanProcessor` is False while its collector is known to be unreachable, the
    CLI's discarding exporter always) is taken at its word; the SDK's batch and simple
    processors export; any other processor (one that counts, enriches or filters spans) is not
    known to export. A span whose processors cannot be read is assumed exported, as before.
    """
    processors = span_processors(span)
    if processors is None:
        return True
    return any(_exports(p) for p in processors)


def _exports(processor: object) -> bool:
    said = _delivers(processor)
    if said is not None:
        return said
    if isinstance(processor, (BatchSpanProcessor, SimpleSpanProcessor)):
        exporter = processor.span_exporter
        said = _delivers(exporter)
        if said is None:
            said = _delivers(getattr(exporter, "inner", None))
        return True if said is None else said
    return False


def marker_value(context: SpanContext) -> str:
    """The header's value for the span `context` names: ``<trace id>-<span id>`` in hex."""
    return f"{context.trace_id:032x}-{context.span_id:016x}"


def mark_handoff(headers: MutableMapping[str, str], span: Span) -> None:
    """Add `HEADER` to `headers` (already injected by the global propagator) when `span` is
    our recording, sampled RERANKER span, something will export it, and W3C trace context is
    being sent (a ``traceparent`` header); drop an inherited legacy ``rstage`` entry from
    ``tracestate`` either way."""
    if "traceparent" not in headers:
        return
    sent = headers.get("tracestate")
    if sent and _LEGACY in sent:
        # The propagator wrote `sent` from a checked `TraceState` (``key=value`` members
        # joined by commas), so it is edited as text (a regex per member to parse it back).
        kept = [m for m in sent.split(",") if m.split("=", 1)[0].strip() != LEGACY_TRACESTATE_KEY]
        if kept:
            headers["tracestate"] = ",".join(kept)
        else:
            del headers["tracestate"]
    if is_our_reranker_span(span) and will_export(span):
        headers[HEADER] = marker_value(span.get_span_context())


def handed_off(request_headers: Iterable[tuple[bytes, bytes]], context: SpanContext) -> bool:
    """True when the request (its raw ASGI `request_headers`) names, in `HEADER`, a span of
    the trace its own span `context` belongs to: its direct caller holds this rerank's RERANKER
    span. A header from another trace, or one that is not ``<trace id>-<span id>``, is not."""
    for name, value in request_headers:
        if name.lower() == _HEADER_BYTES:
            return _names_span_in(value, context.trace_id)
    return False


def _names_span_in(value: bytes, trace_id: int) -> bool:
    trace_hex, dash, span_hex = value.strip().partition(b"-")
    if not dash or len(trace_hex) != 32 or len(span_hex) != 16:
        return False
    if not _HEX.issuperset(trace_hex) or not _HEX.issuperset(span_hex):
        return False
    return int(span_hex, 16) != 0 and int(trace_hex, 16) == trace_id
