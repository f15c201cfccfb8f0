"""One command's session: logging, tracing and metrics set up, the reranker chosen, and at
the end everything flushed and one line saying where the spans went.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

from openinference.semconv.trace import SpanAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .._redact import scrubbed_message
from ..telemetry import PROJECT_NAME
from ..telemetry.otlp import DEFAULT_SERVICE_NAME
from ..telemetry.shutdown import ShutdownReport
from .console import EXIT_USAGE, err, fail, note
from .failure import Witness
from .interrupt import say, while_doing
from .model_load import traced_loads
from .options import DEFAULT_TELEMETRY_TIMEOUT_S, RerankOptions
from .reranker import Chosen, choose_reranker
from .tiers import TierOutcome, tier_outcome

__all__ = ["Destination", "Tracing", "session", "start_tracing"]


class _Tally(SpanProcessor):
    """A span processor that counts finished spans per trace, for the closing summary, and
    keeps what each chain call's span says of its tiers (`chain_calls`, in order)."""

    def __init__(self) -> None:
        self.spans = 0
        self.traces: dict[str, list[str]] = {}
        self.chain_calls: list[TierOutcome] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans += 1
        outcome = tier_outcome(span)
        if outcome is not None:
            self.chain_calls.append(outcome)
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
    """Where spans went: how to say it when all arrived, and when some did not.

    `missing` counts the spans that never arrived once telemetry was shut down (export error,
    or still queued when the deadline passed).
    """

    sent: str
    failed: str
    missing: Callable[[ShutdownReport | None], int]

    def outcome(self, spans: int, report: ShutdownReport | None) -> str:
        """`sent`, or `failed` with how many of `spans` never arrived."""
        missing = min(self.missing(report), spans)
        if missing <= 0:
            return self.sent
        return f"{self.failed} ({missing} of {spans} spans not delivered)"


@dataclass
class Tracing:
    """The command's tracer and meter providers, where spans go, and how long exit may wait."""

    provider: Any
    destinations: list[Destination]
    tally: _Tally
    meter_provider: Any = None
    shutdown_timeout: float = DEFAULT_TELEMETRY_TIMEOUT_S
    flush_first: list[Any] = dc_field(default_factory=list)
    report: ShutdownReport | None = None
    heard: list[dict[str, Any]] = dc_field(default_factory=list)
    """The telemetry log events the summary says in words (`SAID_IN_THE_SUMMARY`)."""
    otlp_base: str | None = None
    """The OTLP traces endpoint's scheme and host, where Arize Phoenix would serve its UI."""
    phoenix_page: str | None = None
    """The Phoenix project page the spans landed in, once `look_for_phoenix` found one."""

    def stage(self, chosen: Chosen, top_k: int | None, *, on_error: str = "raise") -> Any:
        """The command's `RerankStage`, traced and metered here.

        ``on_error="raise"`` (rerank, eval: exit code 1) or ``"fallback"`` (demo: the stage
        returns recall order, marked, and the span says it fell back). Its reranker is a
        `Witness` of the chosen one: ``stage.reranker.last_error`` says why a call failed.
        """
        from ..stage import RerankStage

        return RerankStage(
            Witness(chosen.reranker),  # remembers why a call failed, for the message
            top_k=top_k,
            on_error=on_error,  # type: ignore[arg-type]
            tracer_provider=self.provider,
            meter_provider=self.meter_provider,
        )

    def shutdown(self) -> None:
        """Write the local trace file, then flush traces and metrics under ONE deadline."""
        from ..telemetry.shutdown import shutdown_telemetry

        for processor in self.flush_first:  # a local file: fast, and must not be cut short
            processor.force_flush()
        providers = [p for p in (self.provider, self.meter_provider) if p is not None]
        self.report = shutdown_telemetry(*providers, timeout=self.shutdown_timeout)

    def summary(self) -> str:
        """One line: how many spans, which trace, and where they went (or how to send them)."""
        if not self.tally.traces:
            return "spans: none recorded"
        traces = list(self.tally.traces)
        which = f"trace {traces[0]}" if len(traces) == 1 else f"{len(traces)} traces"
        # This process's spans only: a server it called adds its own to the same trace.
        head = f"spans: {self.tally.spans} from this process in {which}"
        if self.destinations:
            outcomes = [d.outcome(self.tally.spans, self.report) for d in self.destinations]
            page = f"; open {self.phoenix_page} (Phoenix)" if self.phoenix_page else ""
            return f"{head}, {' and '.join(outcomes)}{page}{self._metrics_words()}"
        # Each trace as its root and children; traces alike said once, with their count (the
        # demo's model.load warm-up, then its pipeline; --repeat's pipelines).
        trees: list[str] = []
        for root, *children in self.tally.traces.values():
            counted = Counter(children)
            shown = ", ".join(f"{n}x {label}" if n > 1 else label for label, n in counted.items())
            trees.append(f"{root} → {shown}" if children else root)
        names = "; ".join(f"{n}x {tree}" if n > 1 else tree for tree, n in Counter(trees).items())
        return (
            f"{head} ({names}) — not exported: set OTEL_EXPORTER_OTLP_ENDPOINT "
            "(e.g. http://localhost:4318) or pass --trace-file FILE"
        )

    def look_for_phoenix(self) -> None:
        """After a delivery to OTLP: ask the endpoint's host, as Arize Phoenix's REST API, for
        the project's id, so the summary can name the page to open. Anything else there (a
        collector) answers otherwise and nothing is said; bounded by the telemetry timeout."""
        if self.otlp_base is None or (self.report and self.report.spans_not_delivered):
            return
        import httpx

        project = str(self.provider.resource.attributes.get(PROJECT_NAME) or "")
        if not project:
            return
        try:
            reply = httpx.get(
                f"{self.otlp_base}/v1/projects/{quote(project, safe='')}",
                timeout=self.shutdown_timeout,
                follow_redirects=False,
            )
            found = reply.json()["data"]["id"] if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return
        if isinstance(found, str) and found:
            self.phoenix_page = f"{self.otlp_base}/projects/{quote(found, safe='')}"

    def _metrics_words(self) -> str:
        """What became of the metrics, when not all of them arrived: the endpoint refused them
        (``telemetry.metrics_disabled``) or points were lost at exit."""
        said = ""
        for event in self.heard:
            if event.get("event") == "telemetry.metrics_disabled":
                status = event.get("status")
                answered = f" (HTTP {status})" if status else ""
                said += f"; metrics not sent: {event.get('endpoint')} refused them{answered}"
        points = self.report.metric_points_not_delivered if self.report else 0
        if points:
            said += f"; {points} metric points not delivered"
        return said


class _Discard(SpanExporter):
    """Delivers nowhere: spans are only counted, for the summary that says how to send them.
    `delivers` says so to our client, which then tells no rerank server that the command's
    RERANKER span reaches the trace (`retrieval_stage.spans.handoff`)."""

    delivers = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def _otlp_failure(what: str, exc: Exception, endpoint: str | None) -> NoReturn:
    """Exit 2 for OTLP settings that cannot work: an unknown protocol, gRPC without grpcio."""
    fail(EXIT_USAGE, f"OTLP {what}: {scrubbed_message(str(exc), endpoint)}")


def start_tracing(
    trace_file: Path | None,
    *,
    project: str | None = None,
    shutdown_timeout: float = DEFAULT_TELEMETRY_TIMEOUT_S,
) -> Tracing:
    """OTLP when ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set, plus `trace_file` if given.

    The provider is `configure_tracing`'s, as a library user gets it (limits, resource with the
    Phoenix `project`, bounded shutdown, the OTLP exporter of `retrieval_stage.telemetry.otlp`); the
    command adds its file writer and its tally. Metrics go over OTLP only when an endpoint is
    set for them (`configure_metrics`, which honours ``OTEL_METRICS_EXPORTER=none`` and stops
    by itself at an endpoint that refuses metrics).
    """
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from ..telemetry import configure_tracing
    from ..telemetry.otlp import (
        OtlpExtraMissingError,
        exporter_off,
        otlp_endpoint_configured,
        otlp_target,
    )
    from ..telemetry.trace_file import OtlpJsonLinesExporter

    destinations: list[Destination] = []
    flush_first: list[Any] = []
    traces_on = otlp_endpoint_configured("traces") and not exporter_off("TRACES")
    try:
        if traces_on:
            shown = otlp_target("traces").shown
            provider = configure_tracing(
                DEFAULT_SERVICE_NAME, project=project, shutdown_timeout=shutdown_timeout
            )
            destinations.append(
                Destination(
                    f"sent to OTLP at {shown}",
                    f"OTLP export to {shown} failed",
                    lambda report: report.spans_not_delivered if report else 0,
                )
            )
        else:
            provider = configure_tracing(
                DEFAULT_SERVICE_NAME,
                project=project,
                exporter=_Discard(),
                shutdown_timeout=shutdown_timeout,
            )
    except (ValueError, OtlpExtraMissingError) as exc:
        _otlp_failure("tracing", exc, os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    if trace_file is not None:
        try:
            trace_file.parent.mkdir(parents=True, exist_ok=True)
            trace_file.open("a", encoding="utf-8").close()
        except OSError as exc:
            fail(EXIT_USAGE, f"--trace-file {trace_file}: {exc.strerror or exc}")
        writer = _Watched(OtlpJsonLinesExporter(trace_file))
        processor = BatchSpanProcessor(writer)
        provider.add_span_processor(processor)
        flush_first.append(processor)
        destinations.append(
            Destination(
                f"written to {trace_file} (OTLP/JSON lines)",
                f"writing to {trace_file} failed",
                lambda _: tally.spans - writer.delivered,
            )
        )
    tally = _Tally()
    provider.add_span_processor(tally)
    tracing = Tracing(
        provider,
        destinations,
        tally,
        _start_metrics(shutdown_timeout),
        shutdown_timeout=shutdown_timeout,
        flush_first=flush_first,
    )
    if traces_on:
        parts = urlsplit(otlp_target("traces").shown)
        if parts.scheme in ("http", "https") and parts.netloc:
            tracing.otlp_base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return tracing


def _start_metrics(shutdown_timeout: float) -> Any:
    """Rerank metrics over OTLP when an OTLP endpoint is set for them; else none."""
    from ..telemetry.otlp import OtlpExtraMissingError, exporter_off, otlp_endpoint_configured

    if not otlp_endpoint_configured("metrics") or exporter_off("METRICS"):
        return None
    from ..telemetry import configure_metrics

    try:
        return configure_metrics(DEFAULT_SERVICE_NAME, shutdown_timeout=shutdown_timeout)
    except (ValueError, OtlpExtraMissingError) as exc:
        otlp = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        _otlp_failure("metrics", exc, otlp)


SAID_BY_THE_COMMAND = frozenset({"rerank.fallback", "rerank.failed"})
"""Log events the command prints in words itself (``fallback: ...``, ``error: rerank
failed: ...``): at the default level their log line would only say it twice. --log-level
info or debug shows them."""
SAID_IN_THE_SUMMARY = frozenset({"telemetry.metrics_disabled", "telemetry.undelivered"})
"""Telemetry log events the closing ``spans:`` line says in words (what was refused or not
delivered): at the default level they are kept for it instead of printed as JSON."""


def _not_said_twice(heard: list[dict[str, Any]]) -> Any:
    def drop(_: Any, __: str, event: Any) -> Any:
        import structlog

        name = event.get("event")
        if name in SAID_IN_THE_SUMMARY:
            heard.append(dict(event))
        if name in SAID_BY_THE_COMMAND or name in SAID_IN_THE_SUMMARY:
            raise structlog.DropEvent
        return event

    return drop


def _logging(
    level: str, endpoints: Sequence[str] | None = None, heard: list[dict[str, Any]] | None = None
) -> None:
    """JSON logs on stderr (rendered for a terminal), with the `endpoints`' secrets scrubbed:
    a logged error can quote a service that echoed the request URL."""
    import structlog

    from ..telemetry import configure_logging

    try:
        configure_logging(level, stream=sys.stderr, json=not sys.stderr.isatty())
    except ValueError:
        fail(EXIT_USAGE, f"--log-level: unknown level {level!r}")
    *processors, renderer = structlog.get_config()["processors"]
    if logging.getLevelName(level.upper()) >= logging.WARNING:
        processors.append(_not_said_twice([] if heard is None else heard))
    structlog.configure(processors=[*processors, renderer])
    if not endpoints:
        return

    def scrubbed(value: str) -> str:
        for endpoint in endpoints:
            value = scrubbed_message(value, endpoint)
        return value

    def scrub(_: Any, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        return {k: scrubbed(v) if isinstance(v, str) else v for k, v in event.items()}

    *processors, renderer = structlog.get_config()["processors"]
    structlog.configure(processors=[*processors, scrub, renderer])


@contextmanager
def session(
    options: RerankOptions, *, trace_model_load: bool = False
) -> Iterator[tuple[Chosen, Tracing]]:
    """Logging, tracing and the reranker for one command; flushes spans and says where, also
    when Ctrl-C or SIGTERM stops it (after the line saying what was done: `cli.interrupt`).

    `trace_model_load` (demo): every in-process model loaded in the session (the reranker's
    when it is chosen, dense recall's) loads under a ``model.load`` span (`cli.model_load`)."""
    heard: list[dict[str, Any]] = []
    _logging(options.log_level, options.endpoint, heard)
    tracing = start_tracing(
        options.trace_file,
        project=options.project,
        shutdown_timeout=options.telemetry_timeout,
    )
    tracing.heard = heard
    interrupted = False
    try:
        with traced_loads(tracing.provider) if trace_model_load else nullcontext():
            with while_doing(lambda: "interrupted while loading the reranker: nothing reranked"):
                chosen = choose_reranker(options)
            try:
                yield chosen, tracing
            finally:
                chosen.close()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (`cli.interrupt`): said first
        say(exc)
        interrupted = True
        raise
    finally:
        tracing.shutdown()  # traces and metrics together, at most --telemetry-timeout
        if tracing.tally.spans:
            tracing.look_for_phoenix()
        if tracing.tally.spans or interrupted:  # "none recorded" too: the interrupt cut it
            note(err(), tracing.summary())
