"""`create_app` served by uvicorn inside this process: baggage reaches the spans' context.

Baggage never leaves as a span attribute by itself, so it is checked where it lands: the span
processor sees the caller's baggage in the context each server span and batch span starts in
(an application that wants it on spans adds a baggage span processor).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry import baggage
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from retrieval_stage.server import ServerSettings, create_app

from .served import running_in_process

uvicorn = pytest.importorskip("uvicorn")


class BaggageSeen(SpanProcessor):
    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.seen[span.name] = dict(baggage.get_all(parent_context))

    def on_end(self, span: ReadableSpan) -> None:
        return None


@pytest.fixture
def in_process() -> Iterator[tuple[str, BaggageSeen]]:
    seen = BaggageSeen()
    provider = TracerProvider()
    provider.add_span_processor(seen)
    app = create_app(ServerSettings(reranker="lexical"), tracer_provider=provider)
    try:
        with running_in_process(app) as url:
            yield url, seen
    finally:
        provider.shutdown()


def test_the_callers_baggage_is_in_the_context_of_the_server_and_batch_spans(
    in_process: tuple[str, BaggageSeen],
) -> None:
    url, seen = in_process
    reply = httpx.post(
        url + "/rerank",
        json={"query": "q", "texts": ["q a", "b"]},
        headers={
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "baggage": "tenant=t1,plan=gold",
        },
        timeout=30.0,
    )
    assert reply.status_code == 200
    assert seen.seen["POST /rerank"] == {"tenant": "t1", "plan": "gold"}
    assert seen.seen["rerank.batch"] == {"tenant": "t1", "plan": "gold"}
