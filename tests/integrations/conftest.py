"""One in-memory TracerProvider for the framework tests, and a fresh exporter view per test.

The OpenInference instrumentors patch their framework process-wide, so each test module
instruments its framework once with this provider (and uninstruments at the end); the stage
under test is given the same provider, so its spans and the framework's land together.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Haystack sends usage telemetry to PostHog (eu.i.posthog.com) unless told not to; test traffic
# stays on loopback. Set before any test module imports haystack; subprocesses inherit it.
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


class Traced:
    """The shared provider, and the spans finished since the test began."""

    provider = _PROVIDER

    def spans(self) -> list[ReadableSpan]:
        return list(_EXPORTER.get_finished_spans())

    def clear(self) -> None:
        _EXPORTER.clear()


@pytest.fixture(scope="session")
def tracer_provider() -> TracerProvider:
    return _PROVIDER


@pytest.fixture
def traced() -> Iterator[Traced]:
    _EXPORTER.clear()
    yield Traced()
    _EXPORTER.clear()
