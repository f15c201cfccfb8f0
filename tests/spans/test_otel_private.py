"""The OpenTelemetry state we read without a public API, pinned against the installed SDK.

If an SDK release moves the span limits or the suppression key, these fail loudly instead of
the library silently keeping too few (or evicting) attributes or tracing under suppression.
"""

from __future__ import annotations

from typing import Any

import pytest
from openinference.instrumentation import suppress_tracing
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.trace import INVALID_SPAN

from retrieval_stage.spans import otel_private as _otel_private


@pytest.mark.parametrize("limit", [7, 128, 2048])
def test_sdk_span_limit_is_read_from_the_span(limit: int) -> None:
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=limit))
    span = provider.get_tracer("t").start_span("s")
    assert isinstance(span, ReadableSpan)
    assert isinstance(getattr(span, "_limits", None), SpanLimits), "the SDK moved span limits"
    assert _otel_private.attribute_limit(span) == limit
    span.end()


def test_sdk_span_without_a_limit_has_none() -> None:
    limits = SpanLimits(max_span_attributes=SpanLimits.UNSET)
    span = TracerProvider(span_limits=limits).get_tracer("t").start_span("s")
    assert _otel_private.attribute_limit(span) is None
    span.end()


def test_a_span_of_another_implementation_gets_the_sdk_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", raising=False)
    assert _otel_private.attribute_limit(INVALID_SPAN) == 128
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "40")
    assert _otel_private.attribute_limit(INVALID_SPAN) == 40


def test_suppression_is_read_from_the_key_otel_and_openinference_set() -> None:
    assert not _otel_private.tracing_suppressed()
    with suppress_tracing():
        assert _otel_private.tracing_suppressed()
    token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        assert _otel_private.tracing_suppressed()
    finally:
        otel_context.detach(token)
    assert not _otel_private.tracing_suppressed()


def test_the_sdks_own_exporters_suppress_with_the_same_key() -> None:
    """The SDK's span and metric export paths set this key: the one we honour is theirs."""
    import inspect

    import opentelemetry.sdk.trace.export as span_export

    assert "_SUPPRESS_INSTRUMENTATION_KEY" in inspect.getsource(span_export)


def test_the_span_dict_is_the_sdks_own() -> None:
    span: Any = TracerProvider().get_tracer("t").start_span("s", attributes={"a": 1})
    held = _otel_private.span_attributes(span)
    assert dict(held) == dict(span.attributes)
    span.set_attribute("b", 2)
    assert list(held) == ["a", "b"]  # live: what the span holds now
    span.end()
    assert _otel_private.span_attributes(trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)) == {}


def test_the_span_processors_are_the_providers_own_in_order() -> None:
    # `span_processors` reads span._span_processor._span_processors: the provider's processors.
    from opentelemetry.sdk.trace import SpanProcessor

    from retrieval_stage.spans.otel_private import span_processors

    first, second = SpanProcessor(), SpanProcessor()
    provider = TracerProvider()
    provider.add_span_processor(first)
    provider.add_span_processor(second)
    span = provider.get_tracer("t").start_span("s")
    try:
        assert span_processors(span) == (first, second)
    finally:
        span.end()
    assert span_processors(INVALID_SPAN) is None
