"""What a hostile server knows of us, and where it must never come back: shared by the tests.

A marker sits in the API key, the query and one document. A server that echoes them into
any text we quote (a header, a status line, the model string, ``/info``) must not get any of
them into an exception, a log line, a span (status, events, attributes) or a metric point.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, Candidate, RerankClient, RerankStage

KEY = "sk-live-7Hq2Zr8Kx4Vt9Lm3Pw6Nc1Bd"
QMARK = "Qmark0f9e8d7c6b"
DMARK = "Dmark5a4b3c2d1e"
QUERY = f"what does {QMARK} mean"
DOCS = ["a first plain text", f"the second holds {DMARK} inside", "third"]
MARKERS = (KEY, QMARK, DMARK)
HALF_KEY = KEY[:12] + "****"
"""A half-masked quote of the key: still gives away twelve of its characters."""

ECHO = f"{KEY} {QUERY} {DOCS[1]} {HALF_KEY}"
"""Everything a server could echo, in one string."""


def leaked(text: str) -> list[str]:
    """The markers (or 8-character pieces of the key) that `text` holds."""
    found = [m for m in (QMARK, DMARK) if m in text]
    if any(KEY[i : i + 8] in text for i in range(len(KEY) - 7)):
        found.append("key")
    return found


INPUT_KEYS = ("reranker.query", "reranker.input_documents", "reranker.output_documents",
              "input.value", "output.value")  # fmt: skip
"""Where the query and documents belong on a span (unless OPENINFERENCE_HIDE_* is set)."""


def span_strings(span: ReadableSpan, inputs_shown: bool = False) -> list[str]:
    """Every string on `span` that must hold no echo; with `inputs_shown`, the attributes that
    carry the caller's query and documents by design are left out (the key is checked in
    them by `key_strings`)."""
    values: list[str] = [span.name, str(span.status.description or "")]
    for key, value in (span.attributes or {}).items():
        if inputs_shown and key.startswith(INPUT_KEYS):
            continue
        values += [key, str(value)]
    for event in span.events:
        values.append(event.name)
        for key, value in (event.attributes or {}).items():
            values += [key, str(value)]
    return values


def metric_strings(reader: InMemoryMetricReader) -> list[str]:
    data = reader.get_metrics_data()
    out: list[str] = []
    for resource_metrics in data.resource_metrics if data else ():
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    out += [f"{k}={v}" for k, v in (point.attributes or {}).items()]
    return out


@contextmanager
def observed() -> Iterator[dict[str, Any]]:
    """Spans, metrics and log events of what runs inside, collected into one dict."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    seen: dict[str, Any] = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
    with capture_logs() as logs:
        yield seen
    seen["spans"] = list(exporter.get_finished_spans())
    seen["metrics"] = metric_strings(reader)
    seen["logs"] = logs
    tracer_provider.shutdown()
    meter_provider.shutdown()


def everything_shown(
    seen: Mapping[str, Any], exc: BaseException | None = None, inputs_shown: bool = False
) -> list[str]:
    shown = [json.dumps(seen.get("logs", []), default=str), *seen.get("metrics", [])]
    for span in seen.get("spans", []):
        shown += span_strings(span, inputs_shown)
    if exc is not None:
        shown += [str(exc), repr(exc), str(getattr(exc, "server_message", ""))]
    return shown


def assert_nothing_leaked(
    seen: Mapping[str, Any], exc: BaseException | None = None, *, inputs_shown: bool = True
) -> None:
    """No marker anywhere; by default the span's input/output attributes (which carry the
    query and documents by design) are checked for the key only."""
    for text in everything_shown(seen, exc, inputs_shown):
        assert not leaked(text), (leaked(text), text[:500])
    for span in seen.get("spans", []):
        for value in (span.attributes or {}).values():
            assert "key" not in leaked(str(value)), str(value)[:500]


def cands() -> list[Candidate]:
    return [Candidate(str(i), t, 1.0 - i / 10) for i, t in enumerate(DOCS)]


def run_stage(flavour: str, url: str, seen: Mapping[str, Any], **client_kw: Any) -> Any:
    """One `RerankStage` call through the sync or async client; returns the outputs."""
    kw: dict[str, Any] = {"api_key": KEY, "timeout": 5.0, "max_retries": 0, **client_kw}
    stage_kw = {
        "tracer_provider": seen["tracer_provider"],
        "meter_provider": seen["meter_provider"],
    }
    if flavour == "sync":
        with RerankClient(url, **kw) as client:
            return RerankStage(client, **stage_kw).run(QUERY, cands())

    async def main() -> Any:
        async with AsyncRerankClient(url, **kw) as client:
            return await RerankStage(client, **stage_kw).arun(QUERY, cands())

    return asyncio.run(main())


def call_client(flavour: str, url: str, **client_kw: Any) -> BaseException | None:
    """One client call; the exception it raised, or None."""
    kw: dict[str, Any] = {"api_key": KEY, "timeout": 5.0, "max_retries": 0, **client_kw}
    try:
        if flavour == "sync":
            with RerankClient(url, **kw) as client:
                client.rerank(QUERY, DOCS)
        else:

            async def main() -> None:
                async with AsyncRerankClient(url, **kw) as client:
                    await client.rerank(QUERY, DOCS)

            asyncio.run(main())
    except Exception as exc:
        return exc
    return None


Each = Callable[[str], Sequence[str]]
