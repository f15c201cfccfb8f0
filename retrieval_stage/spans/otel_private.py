"""The only place the library reads OpenTelemetry state that has no public API.

Two facts have no public accessor in opentelemetry-api/-sdk 1.45:

- whether instrumentation is suppressed: the API's context key ``_SUPPRESS_INSTRUMENTATION_KEY``
  is what OpenTelemetry's own instrumentations, its span processors and OpenInference's
  `suppress_tracing` set and read (the public `suppress_instrumentation` lives in the
  separate ``opentelemetry-instrumentation`` package, which this library does not need);
- an SDK span's attribute-count limit: the SDK keeps its `SpanLimits` on ``span._limits`` and
  exposes the attributes only as a read-only mapping without the bound.

`tests/spans/test_otel_private.py` pins both against the installed SDK, so a release that moves
either fails that test loudly instead of silently changing what the spans keep.
"""

from __future__ import annotations

import os

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, get_value
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits
from opentelemetry.trace import Span

__all__ = ["SDK_DEFAULT_ATTRIBUTE_LIMIT", "attribute_limit", "tracing_suppressed"]

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
