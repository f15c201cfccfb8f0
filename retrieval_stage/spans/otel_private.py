"""Where the spans read or write OpenTelemetry SDK state that has no public API.

The library's other reads of a dependency's private state (the metrics API's provider slot in
``metrics``, the OTLP exporter, the client's transports) are listed, each with the test that pins
it, in ``docs/architecture.md`` under "Private reads of dependencies".

Three facts have no public accessor in opentelemetry-api/-sdk 1.45, and one read and one write
have no cheap public path:

- whether instrumentation is suppressed: the API's context key ``_SUPPRESS_INSTRUMENTATION_KEY``
  is what OpenTelemetry's own instrumentations, its span processors and OpenInference's
  `suppress_tracing` set and read (the public `suppress_instrumentation` lives in the
  separate ``opentelemetry-instrumentation`` package, which this library does not need);
- which span processors an SDK span ends into (``span._span_processor._span_processors``):
  whether anything will export our RERANKER span decides whether our client tells a rerank
  server that it holds it (`retrieval_stage.spans.handoff.will_export`);
- an SDK span's attribute-count limit: the SDK keeps its `SpanLimits` on ``span._limits`` and
  exposes the attributes only as a read-only mapping without the bound;
- reading which attributes a span holds: ``span.attributes`` is a fresh ``MappingProxyType``
  over the SDK's `BoundedAttributes`, whose lookups and length run in Python (`span_attributes`
  hands out the dict inside, to read);
- writing a RERANKER span's ~300 outcome attributes: the SDK's ``set_attributes`` re-validates
  every value (a recursive ``_clean_attribute_value`` over the mapping) and stores key by key,
  which profiled as the largest single cost a traced async call adds on the event loop.
  `set_span_attributes` stores values that provably need no cleaning straight into the span's
  attribute dict, under the span's and the dict's own locks, and hands anything else to the
  SDK.

Whether metrics go anywhere (the metrics API's private placeholder provider and global slot)
is asked in `retrieval_stage.metrics`, beside the instruments that need the answer.
`tests/spans/test_otel_private.py` and `tests/spans/test_attribute_write.py` pin these four
against the installed SDK, so a release that moves any of them fails those tests loudly instead
of silently changing what the spans keep.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, get_value
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

__all__ = [
    "SDK_DEFAULT_ATTRIBUTE_LIMIT",
    "attribute_limit",
    "plain_attributes",
    "set_again",
    "set_span_attributes",
    "span_attributes",
    "span_processors",
    "tracing_suppressed",
    "writable_store",
]

_CLEAN = frozenset((str, bool, int, float))
"""Value types the SDK stores unchanged (when no value-length limit is set)."""

SDK_DEFAULT_ATTRIBUTE_LIMIT = 128
"""The SDK's span attribute-count limit when neither code nor environment sets one."""


def tracing_suppressed() -> bool:
    """True inside OpenTelemetry's instrumentation suppression (or OpenInference's
    `suppress_tracing`, which sets the same key): the library then makes no span."""
    return bool(get_value(_SUPPRESS_INSTRUMENTATION_KEY))


def attribute_limit(span: Span) -> int | None:
    """The span's attribute-count limit, or None when it has none.

    An SDK span carries its `SpanLimits`; for any other implementation (or an SDK that moved
    them) assume the SDK's default from ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` or 128, which errs
    on the side of keeping the span's identity.
    """
    if isinstance(span, ReadableSpan):
        limits = getattr(span, "_limits", None)
        if isinstance(limits, SpanLimits):
            value = limits.max_span_attributes
            return value if isinstance(value, int) else None
    raw = os.environ.get("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "")
    return int(raw) if raw.isdigit() else SDK_DEFAULT_ATTRIBUTE_LIMIT


def span_attributes(span: Span) -> Mapping[str, object]:
    """The attributes the span holds now, to read: an SDK span's own dict (the SDK hands out
    ``span.attributes`` as a read-only proxy over its `BoundedAttributes`, whose lookups and
    length run in Python), else whatever the span's ``attributes`` gives (empty for none)."""
    bounded = getattr(span, "_attributes", None)
    if isinstance(span, SdkSpan) and type(bounded) is BoundedAttributes:
        stored: Mapping[str, object] = bounded._dict
        return stored
    attributes: Mapping[str, object] | None = getattr(span, "attributes", None)
    return attributes or {}


def span_processors(span: Span) -> tuple[object, ...] | None:
    """The span processors an SDK span ends into (its provider's, in order), or None when
    they cannot be read: the SDK keeps them on ``span._span_processor`` (a multi-processor
    whose ``_span_processors`` tuple holds them) and has no public accessor."""
    multi = getattr(span, "_span_processor", None)
    held = getattr(multi, "_span_processors", None)
    return held if isinstance(span, SdkSpan) and isinstance(held, tuple) else None


def set_span_attributes(
    span: Span, attributes: Mapping[str, AttributeValue], *, vouched: bool = False
) -> None:
    """``span.set_attributes(attributes)``, with the same result, minus the SDK's re-cleaning.

    Taken only for a live SDK span with no value-length limit, room for every new key (so
    nothing is evicted) and values that are plain str/bool/int/float under non-empty str keys;
    a key already set moves to the end, as the SDK moves it. Anything else (another span
    implementation, an ended span, lists, a full span) goes through ``set_attributes``.

    `vouched`: the caller built every key as a non-empty str and every value as an instance
    of str, bool, int or float (which the SDK stores unchanged when it has no value-length
    limit), so the per-value check is skipped: for ~300 document attributes it cost as much
    as storing them.
    """
    writable = writable_store(span)
    if writable is not None and (vouched or plain_attributes(attributes)):
        sdk_span, bounded = writable
        with sdk_span._lock:
            if sdk_span._end_time is None:
                with bounded._lock:
                    stored = bounded._dict
                    again = set_again(stored, attributes)
                    fresh = len(attributes) - len(again)
                    # The class checked again under the lock (another writer may have deferred
                    # documents meanwhile: then the SDK's path, which flattens them first).
                    if type(bounded) is BoundedAttributes and (
                        bounded.maxlen is None or len(stored) + fresh <= bounded.maxlen
                    ):
                        for key in again:
                            del stored[key]
                        stored.update(attributes)
                        return
    span.set_attributes(attributes)


def writable_store(span: Span) -> tuple[SdkSpan, BoundedAttributes] | None:
    """An SDK span and its own `BoundedAttributes`, where values may be written straight into
    the store: exactly that class (not a subclass, nor a deferred store) with no value-length
    limit (which the SDK would apply while storing). None for anything else. The caller still
    takes the span's and the store's locks and checks that the span has not ended."""
    bounded = getattr(span, "_attributes", None)
    if (
        isinstance(span, SdkSpan)
        and type(bounded) is BoundedAttributes
        and bounded.max_value_len is None
    ):
        return span, bounded
    return None


def set_again(stored: Mapping[str, object], attributes: Mapping[str, object]) -> list[str]:
    """The keys of `attributes` already in `stored` (which the SDK moves to the end when set
    again): a handful at most, the span's identity, so the smaller mapping is looked up in the
    larger one."""
    if len(stored) <= len(attributes):
        return [key for key in stored if key in attributes]
    return [key for key in attributes if key in stored]


def plain_attributes(attributes: Mapping[str, AttributeValue]) -> bool:
    """Every key a non-empty str and every value exactly a str, bool, int or float."""
    clean = _CLEAN
    for key, value in attributes.items():
        if type(value) not in clean or type(key) is not str or not key:
            return False
    return True
