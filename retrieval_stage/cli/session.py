"""One command's session: logging, tracing and metrics set up, the reranker chosen, and at
the end everything flushed and one line saying where the spans went.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openinference.semconv.trace import SpanAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .console import EXIT_USAGE, err, fail, note, scrubbed, shown_url
from .options import RerankOptions
from .reranker import Chosen, choose_reranker

__all__ = ["Tracing", "session", "start_tracing"]


class _Tally(SpanProcessor):
    """A span processor that counts finished spans per trace, for the closing summary."""

    def __init__(self) -> None:
        self.spans = 0
        self.traces: dict[str, list[str]] = {}

    def on_end(self, span: ReadableSpan) -> None:
        self.spans += 1
        trace_id = format(span.context.trace_id, "032x") if span.context else "?"
        kind = (span.attributes or {}).get(SpanAttributes.OPENINFERENCE_SPAN_KIND)
        label = f"{span.name} ({kind})" if kind else span.name
        labels = self.traces.setdefault(trace_id, [])
        if span.parent is None:
            labels.insert(0, label)  # the root first: it ends last
        else:
            labels.append(label)


class _Watched(SpanExporter):
    """Wraps an exporter and counts the spans it delivered, so the summary tells the truth.

    An exporter that raises counts as a failed export (the batch processor would only log it).
    """

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.delivered = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            with self._lock:
                self.delivered += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


@dataclass
class Destination:
    """Where spans went: how to say it when all arrived, and when some did not."""

    sent: str
    failed: str
    exporter: _Watched

    def outcome(self, spans: int) -> str:
        """`sent`, or `failed` with how many of `spans` never arrived (export error, or
        still queued when the flush at exit gave up)."""
        missing = spans - self.exporter.delivered
        if missing <= 0:
            return self.sent
        return f"{self.failed} ({missing} of {spans} spans not delivered)"


@dataclass
class Tracing:
    """The command's tracer provider and where its spans go."""

    provider: Any
    destinations: list[Destination]
    tally: _Tally
    meter_provider: Any = None

    def stage(self, chosen: Chosen, top_k: int | None) -> Any:
        """The command's `RerankStage`: traced and metered here; errors raise (exit code 1)."""
        from ..stage import RerankStage

        return RerankStage(
            chosen.reranker,
            top_k=top_k,
            on_error="raise",
            tracer_provider=self.provider,
            meter_provider=self.meter_provider,
        )

    def summary(self) -> str:
        """One line: how many spans, which trace, and where they went (or how to send them)."""
        if not self.tally.traces:
            return "spans: none recorded"
        traces = list(self.tally.traces)
        which = f"trace {traces[0]}" if len(traces) == 1 else f"{len(traces)} traces"
        head = f"spans: {self.tally.spans} in {which}"
        if self.destinations:
            outcomes = [d.outcome(self.tally.spans) for d in self.destinations]
            return f"{head}, {' and '.join(outcomes)}"
        root, *children = self.tally.traces[traces[0]]
        counted = Counter(children)
        shown = ", ".join(f"{n}x {label}" if n > 1 else label for label, n in counted.items())
        names = f"{root} → {shown}" if children else root
        return (
            f"{head} ({names}) — not exported: set OTEL_EXPORTER_OTLP_ENDPOINT "
            "(e.g. http://localhost:4318) or pass --trace-file FILE"
        )


class _Discard(SpanExporter):
    """Delivers nowhere: spans are only counted, for the summary that says how to send them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def start_tracing(trace_file: Path | None) -> Tracing:
    """OTLP when ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set, plus `trace_file` if given.

    The provider is `configure_tracing`'s, as a library user gets it (limits, resource, bounded
    shutdown); the command adds its file writer and its tally.
    """
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from ..telemetry import configure_tracing, otlp_span_exporter
    from ..trace_file import OtlpJsonLinesExporter

    destinations: list[Destination] = []
    otlp = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if otlp:
        try:
            exporter = _Watched(otlp_span_exporter())  # what configure_tracing would build
            provider = configure_tracing(exporter=exporter)
        except ValueError as exc:
            fail(EXIT_USAGE, f"OTLP tracing: {scrubbed(str(exc), otlp)}")
        shown = shown_url(otlp)
        destinations.append(
            Destination(f"sent to OTLP at {shown}", f"OTLP export to {shown} failed", exporter)
        )
    else:
        provider = configure_tracing(exporter=_Discard())
    if trace_file is not None:
        try:
            trace_file.parent.mkdir(parents=True, exist_ok=True)
            trace_file.open("a", encoding="utf-8").close()
        except OSError as exc:
            fail(EXIT_USAGE, f"--trace-file {trace_file}: {exc.strerror or exc}")
        writer = _Watched(OtlpJsonLinesExporter(trace_file))
        provider.add_span_processor(BatchSpanProcessor(writer))
        destinations.append(
            Destination(
                f"written to {trace_file} (OTLP/JSON lines)",
                f"writing to {trace_file} failed",
                writer,
            )
        )
    tally = _Tally()
    provider.add_span_processor(tally)
    return Tracing(provider, destinations, tally, _start_metrics())


def _start_metrics() -> Any:
    """Rerank metrics over OTLP when an OTLP endpoint is set for them; else none."""
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    ):
        return None
    from ..metrics import configure_metrics

    try:
        return configure_metrics()
    except ValueError as exc:
        otlp = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        fail(EXIT_USAGE, f"OTLP metrics: {scrubbed(str(exc), otlp)}")


def _logging(level: str, endpoint: str | None = None) -> None:
    """JSON logs on stderr (rendered for a terminal), with `endpoint`'s secrets scrubbed: a
    logged error can quote a service that echoed the request URL."""
    import structlog

    from ..telemetry import configure_logging

    try:
        configure_logging(level, stream=sys.stderr, json=not sys.stderr.isatty())
    except ValueError:
        fail(EXIT_USAGE, f"--log-level: unknown level {level!r}")
    if not endpoint:
        return

    def scrub(_: Any, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        return {k: scrubbed(v, endpoint) if isinstance(v, str) else v for k, v in event.items()}

    *processors, renderer = structlog.get_config()["processors"]
    structlog.configure(processors=[*processors, scrub, renderer])


@contextmanager
def session(options: RerankOptions) -> Iterator[tuple[Chosen, Tracing]]:
    """Logging, tracing and the reranker for one command; flushes spans and says where."""
    _logging(options.log_level, options.endpoint)
    tracing = start_tracing(options.trace_file)
    try:
        chosen = choose_reranker(options)
        try:
            yield chosen, tracing
        finally:
            chosen.close()
    finally:
        tracing.provider.shutdown()
        if tracing.meter_provider is not None:
            tracing.meter_provider.shutdown(timeout_millis=5_000)
        if tracing.tally.spans:
            note(err(), tracing.summary())
