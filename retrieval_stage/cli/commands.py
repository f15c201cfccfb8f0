"""The ``retrieval-stage`` command: run recall→rerank, see what moved, measure the lift.

``demo`` recalls from the bundled standard-library corpus and reranks, ``rerank`` reorders
candidates given as JSON lines, ``eval`` compares recall with reranked on judged queries. Each
command says which reranker ran and where its spans went. Exit codes: 0 done, 2 bad usage or
input (nothing was reranked), 1 the reranker or the run failed.

This is an application, so unlike the library it configures logging and tracing, and prints.
"""

from __future__ import annotations

import enum
import json
import math
import os
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

import typer
from openinference.instrumentation import get_span_kind_attributes
from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import RerankError
from ..models import Candidate
from ..providers import PROVIDERS

__all__ = ["app", "main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
MAX_ERRORS_SHOWN = 10
SNIPPET_CHARS = 72
DEFAULT_QUERY = "serialize a Python object to a JSON string"
COMPOSE_UP = "docker compose -f docker/compose.yaml up tei"
COMPOSE_HINT = (
    f"start TEI from the compose stack ({COMPOSE_UP}) and pass --endpoint http://localhost:8080"
)

# Help texts and docstrings are Rich markup: a literal "[local]" must be written "\\[local]".
app = typer.Typer(
    name="retrieval-stage",
    help="Run recall→rerank, see what the reranker moved, and measure the lift.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # never dump locals (an API key may be among them)
)


class RerankerChoice(str, enum.Enum):
    """Which reranker runs when no --endpoint is given."""

    auto = "auto"
    local = "local"
    lexical = "lexical"


class OutputFormat(str, enum.Enum):
    """How `rerank` prints its results."""

    jsonl = "jsonl"
    table = "table"


def _check_provider(value: str) -> str:
    name = value.strip().lower()
    if name not in PROVIDERS:
        raise typer.BadParameter(f"{value!r} is not one of: {', '.join(PROVIDERS)}")
    return name


def _check_timeout(value: float) -> float:
    if not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number of seconds, got {value}")
    return value


Endpoint = Annotated[
    str | None,
    typer.Option(
        "--endpoint",
        envvar="RERANK_ENDPOINT",
        help="Base URL of a rerank service, e.g. TEI at http://localhost:8080. "
        "Without it the reranker runs in this process (see --reranker).",
        show_default=False,
    ),
]
Provider = Annotated[
    str,
    typer.Option(
        "--provider",
        envvar="RERANK_PROVIDER",
        callback=_check_provider,
        help=f"Wire format of --endpoint: {', '.join(PROVIDERS)}.",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        envvar="RERANK_MODEL",
        help="With --endpoint: the model name sent to the service. Without: the local "
        "cross-encoder, a Hugging Face id or a model directory "
        "(default cross-encoder/ms-marco-MiniLM-L-6-v2).",
        show_default=False,
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="RERANK_API_KEY",
        help="Credential for --endpoint (see --api-key-header). Prefer the variable.",
        show_default=False,
    ),
]
ApiKeyHeader = Annotated[
    str | None,
    typer.Option(
        "--api-key-header",
        envvar="RERANK_API_KEY_HEADER",
        help="Header that carries the key; 'Authorization' sends 'Bearer <key>'. Default: the "
        "provider's convention, 'Authorization' for the hosted APIs, vLLM and Infinity, "
        "'apikey' (the gateway convention) for tei and sidecar.",
        show_default=False,
    ),
]
Timeout = Annotated[
    float,
    typer.Option(
        "--timeout",
        envvar="RERANK_TIMEOUT",
        min=0.1,
        callback=_check_timeout,
        help="Seconds for one rerank call, retries included.",
    ),
]
RerankerOpt = Annotated[
    RerankerChoice,
    typer.Option(
        "--reranker",
        help="Without --endpoint: 'local' runs the cross-encoder (needs the \\[local] extra), "
        "'lexical' a bag-of-words fallback, 'auto' the cross-encoder when it can load, "
        "else lexical.",
    ),
]
TraceFile = Annotated[
    Path | None,
    typer.Option(
        "--trace-file",
        help="Also write the spans to this file as OTLP/JSON lines (appended).",
        dir_okay=False,
        show_default=False,
    ),
]
LogLevel = Annotated[
    str,
    typer.Option("--log-level", help="Log level for stderr: debug, info, warning, error."),
]


# -- consoles and errors ---------------------------------------------------------------------


def _out() -> Console:
    return Console(soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True, soft_wrap=False)


def _fail(code: int, message: str, *details: str) -> NoReturn:
    """Print ``error: message`` (and details) to stderr and exit with `code`; no traceback."""
    err = _err()
    err.print(Text("error: ", style="bold red") + Text(message))
    for detail in details:
        err.print(Text(f"  {detail}"))
    raise typer.Exit(code)


def _note(console: Console, message: str, style: str = "dim") -> None:
    console.print(Text(message, style=style))


def shown_url(url: str) -> str:
    """`url` as the command prints it: ``user:password@`` masked, query and fragment dropped.

    An endpoint may carry a credential in either place (``?key=...`` for some gateways); what
    is printed lands in terminals, CI logs and bug reports.
    """
    from ..client import masked_url

    masked = str(masked_url(url))
    return masked.split("#", 1)[0].split("?", 1)[0]


def _scrubbed(message: str, url: str | None) -> str:
    """`message` with `url`'s password, query string and fragment replaced by ``***``.

    Error messages can quote the URL (a client's own check, a service echoing the request).
    """
    if not url:
        return message
    parts = urlsplit(url)
    secrets = [url, str(parts.password or ""), parts.query, parts.fragment]
    message = message.replace(url, shown_url(url))
    for secret in sorted(secrets[1:], key=len, reverse=True):
        if len(secret) >= 3:  # a one- or two-character "secret" would mangle the message
            message = message.replace(secret, "***")
    return message


# -- choosing the reranker -------------------------------------------------------------------


@dataclass
class Chosen:
    """The reranker a command runs, how to describe it, and how to let it go."""

    reranker: Any
    label: str
    hint: str | None = None
    close: Callable[[], None] = field(default=lambda: None)


def _lexical(reason: str | None = None) -> Chosen:
    from ..local import DEFAULT_LOCAL_MODEL, INSTALL_HINT, LexicalReranker, local_available

    why = f"{reason}. " if reason else ""
    if local_available():  # the extra is there: only the model is missing
        how = (
            f"run once with network access to download {DEFAULT_LOCAL_MODEL}, pass "
            "--model DIR (a model directory)"
        )
    else:
        how = f"{INSTALL_HINT} to run {DEFAULT_LOCAL_MODEL} in process"
    return Chosen(
        LexicalReranker(),
        "lexical (bag-of-words term coverage and proximity; not a model)",
        hint=f"{why}For a real reranker: {how}, or {COMPOSE_HINT}.",
    )


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect: a failed download retries for ~50s."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    host = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    if not host:
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _local(model: str | None, choice: RerankerChoice) -> Chosen:
    """The cross-encoder, loaded now; under 'auto' any reason it cannot load means lexical."""
    from ..local import (
        DEFAULT_LOCAL_MODEL,
        INSTALL_HINT,
        CrossEncoderReranker,
        local_available,
        model_in_cache,
    )

    name = model or DEFAULT_LOCAL_MODEL
    strict = choice is RerankerChoice.local
    if not local_available():
        if strict:
            _fail(EXIT_USAGE, "--reranker local needs sentence-transformers", INSTALL_HINT)
        return _lexical("sentence-transformers is not installed")
    on_disk = Path(name).is_dir() or model_in_cache(name)
    if not on_disk and not _hub_reachable():
        reason = f"the model {name} is not downloaded and the Hugging Face hub is unreachable"
        if strict:
            _fail(
                EXIT_FAILURE,
                reason,
                "download it once with network access, or pass --model DIR (a model "
                f"directory), or {COMPOSE_HINT}",
            )
        return _lexical(reason)
    reranker = CrossEncoderReranker(name, local_files_only=on_disk)
    try:
        with _err().status(Text(f"loading {name}…")):
            reranker.load()
    except RerankError as exc:
        if strict:
            _fail(EXIT_FAILURE, str(exc))
        return _lexical(f"the cross-encoder could not load ({exc})")
    return Chosen(reranker, f"local cross-encoder {reranker.model_name} (in process)")


def choose_reranker(
    *,
    endpoint: str | None,
    provider: str,
    model: str | None,
    api_key: str | None,
    timeout: float,
    choice: RerankerChoice,
    api_key_header: str | None = None,
) -> Chosen:
    """An HTTP client for `endpoint`; else the local cross-encoder or the lexical fallback."""
    if endpoint:
        if choice is not RerankerChoice.auto:
            _fail(EXIT_USAGE, f"--reranker {choice.value} cannot be combined with --endpoint")
        from ..client import RerankClient

        try:
            client = RerankClient(
                endpoint,
                provider=provider,
                model=model,
                api_key=api_key,
                api_key_header=api_key_header or PROVIDERS[provider].auth_header,
                timeout=timeout,
            )
        except (TypeError, ValueError) as exc:
            _fail(EXIT_USAGE, _option_error(_scrubbed(str(exc), endpoint)))
        shown = f" model {model}" if model else ""
        return Chosen(
            client, f"{provider} at {shown_url(client.base_url)}{shown}", close=client.close
        )
    if choice is RerankerChoice.lexical:
        return _lexical()
    return _local(model, choice)


_CLIENT_OPTIONS = {
    "base_url": "--endpoint",
    "timeout": "--timeout",
    "api_key_header": "--api-key-header",
    "api_key": "--api-key",
    "provider": "--provider",
    "model": "--model",
}


def _option_error(message: str) -> str:
    """A client's refusal, prefixed with the option the user set (the client names its
    parameter: ``timeout must be ...``)."""
    parameter = message.split(" ", 1)[0]
    option = _CLIENT_OPTIONS.get(parameter)
    return f"{option}: {message}" if option else message


# -- tracing and logging ---------------------------------------------------------------------


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


def start_tracing(trace_file: Path | None) -> Tracing:
    """OTLP when ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set, plus `trace_file` if given."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from ..telemetry import (
        DEFAULT_SERVICE_NAME,
        DEFAULT_SPAN_ATTRIBUTE_LIMIT,
        configure_tracing,
        otlp_span_exporter,
    )
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
            _fail(EXIT_USAGE, f"OTLP tracing: {_scrubbed(str(exc), otlp)}")
        shown = shown_url(otlp)
        destinations.append(
            Destination(f"sent to OTLP at {shown}", f"OTLP export to {shown} failed", exporter)
        )
    else:
        name = os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
        provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: name}),
            span_limits=SpanLimits(max_span_attributes=DEFAULT_SPAN_ATTRIBUTE_LIMIT),
        )
    if trace_file is not None:
        try:
            trace_file.parent.mkdir(parents=True, exist_ok=True)
            trace_file.open("a", encoding="utf-8").close()
        except OSError as exc:
            _fail(EXIT_USAGE, f"--trace-file {trace_file}: {exc.strerror or exc}")
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
        _fail(EXIT_USAGE, f"OTLP metrics: {_scrubbed(str(exc), otlp)}")


def _logging(level: str, endpoint: str | None = None) -> None:
    """JSON logs on stderr (rendered for a terminal), with `endpoint`'s secrets scrubbed: a
    logged error can quote a service that echoed the request URL."""
    import structlog

    from ..telemetry import configure_logging

    try:
        configure_logging(level, stream=sys.stderr, json=not sys.stderr.isatty())
    except ValueError:
        _fail(EXIT_USAGE, f"--log-level: unknown level {level!r}")
    if not endpoint:
        return

    def scrub(_: Any, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        return {k: _scrubbed(v, endpoint) if isinstance(v, str) else v for k, v in event.items()}

    *processors, renderer = structlog.get_config()["processors"]
    structlog.configure(processors=[*processors, scrub, renderer])


@contextmanager
def _session(
    *,
    log_level: str,
    trace_file: Path | None,
    endpoint: str | None,
    provider: str,
    model: str | None,
    api_key: str | None,
    api_key_header: str | None,
    timeout: float,
    choice: RerankerChoice,
) -> Iterator[tuple[Chosen, Tracing]]:
    """Logging, tracing and the reranker for one command; flushes spans and says where."""
    _logging(log_level, endpoint)
    tracing = start_tracing(trace_file)
    try:
        chosen = choose_reranker(
            endpoint=endpoint,
            provider=provider,
            model=model,
            api_key=api_key,
            api_key_header=api_key_header,
            timeout=timeout,
            choice=choice,
        )
        try:
            yield chosen, tracing
        finally:
            chosen.close()
    finally:
        tracing.provider.shutdown()
        if tracing.meter_provider is not None:
            tracing.meter_provider.shutdown(timeout_millis=5_000)
        if tracing.tally.spans:
            _note(_err(), tracing.summary())


# -- reading candidates ----------------------------------------------------------------------


@dataclass(frozen=True)
class LineError:
    """A problem with one input line (1-based)."""

    line: int
    message: str


def parse_candidates(lines: Sequence[str]) -> tuple[list[Candidate], list[LineError]]:
    """Candidates from JSON lines ``{"id", "text", "score"?, "metadata"?}``, and every error.

    Every line is checked before anything is reranked; blank lines are skipped, other keys
    ignored. An id may be a string or an integer, and must be unique.
    """
    candidates: list[Candidate] = []
    errors: list[LineError] = []
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        problem, candidate = _parse_line(raw)
        if candidate is not None and candidate.id in first_seen:
            problem = f'id "{candidate.id}" was already given on line {first_seen[candidate.id]}'
        if problem is not None:
            errors.append(LineError(number, problem))
            continue
        assert candidate is not None
        first_seen[candidate.id] = number
        candidates.append(candidate)
    return candidates, errors


def _parse_line(raw: str) -> tuple[str | None, Candidate | None]:
    """(problem, None) or (None, candidate): the same checks as ``eval --candidates``."""
    from ..evaluation import candidate_fields, json_object

    try:
        ident, text, score, metadata = candidate_fields(json_object(raw))
    except ValueError as exc:
        return str(exc), None
    assert text is not None  # required
    return None, Candidate(ident, text, score, metadata)


def _read_lines(source: str, what: str) -> list[str]:
    """The lines of `source` (a path, or ``-`` for stdin); exit 2 naming option `what` when it
    cannot be read.

    Read as bytes and decoded strictly: Python's stdin would turn bytes that are not UTF-8
    into lone surrogates, which fail much later (or go to the reranker as garbage). Lines end
    at ``\n`` only, as JSON lines do: a U+2028 inside a JSON string does not split its line.
    """
    name = "stdin" if source == "-" else source
    try:
        if source == "-":
            if sys.stdin is None or sys.stdin.closed:  # started with stdin closed (<&-)
                _fail(EXIT_USAGE, f"{what} stdin: stdin is closed; pass {what} FILE")
            if sys.stdin.isatty():
                _note(_err(), "reading candidates from stdin (JSON lines; end with Ctrl-D)")
            data = _stdin_bytes()
        else:
            data = Path(source).read_bytes()
    except FileNotFoundError:
        _fail(EXIT_USAGE, f"{what} {name}: no such file")
    except IsADirectoryError:
        _fail(EXIT_USAGE, f"{what} {name}: is a directory")
    except OSError as exc:
        _fail(EXIT_USAGE, f"{what} {name}: {exc.strerror or exc}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        _fail(EXIT_USAGE, f"{what} {name}: line {line} is not UTF-8 text ({exc.reason})")
    return text.removeprefix("\ufeff").split("\n")


def _stdin_bytes() -> bytes:
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read()
        return data
    return str(sys.stdin.read()).encode("utf-8", errors="surrogateescape")


def _check_text(value: str, what: str) -> None:
    """Exit 2 when `value` cannot be encoded as UTF-8: an argument in another encoding."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        _fail(EXIT_USAGE, f"{what} is not UTF-8 text (is the terminal's locale UTF-8?)")


def _read_candidates(source: str, what: str) -> list[Candidate]:
    """Every candidate of `source`, or exit 2 listing the bad lines; `what` names the option
    in messages (``--input``, ``--corpus``, ``--docs``)."""
    candidates, errors = parse_candidates(_read_lines(source, what))
    if errors:
        shown = [f"line {e.line}: {e.message}" for e in errors[:MAX_ERRORS_SHOWN]]
        if len(errors) > MAX_ERRORS_SHOWN:
            shown.append(f"… and {len(errors) - MAX_ERRORS_SHOWN} more")
        name = "stdin" if source == "-" else source
        plural = "s" if len(errors) > 1 else ""
        consequence = ", nothing reranked" if what == "--input" else ""
        _fail(EXIT_USAGE, f"{what} {name}: {len(errors)} bad line{plural}{consequence}", *shown)
    return candidates


# -- output ----------------------------------------------------------------------------------


def _snippet(text: str, width: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}" if abs(value) >= 1e4 else f"{value:.3f}"


def _changes_table(
    changes: Sequence[Any], *, score_label: str, recall_label: str, width: int
) -> Table:
    """Final rank, recall rank, movement, both scores, id and a snippet, fitted to `width`."""
    rows = [
        (
            str(c.rank),
            str(c.recall_rank),
            c.movement,
            _number(c.score),
            _number(c.recall_score),
            c.candidate.id,
            c,
        )
        for c in changes
    ]
    headers = ("rank", "recall", "move", score_label, recall_label, "id")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    widths[5] = min(widths[5], 40)
    snippet_width = max(12, width - sum(widths) - 3 * len(headers))
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="left" if i == 5 else "center" if i == 2 else "right",
            no_wrap=True,
            overflow="ellipsis",
            width=widths[i],
        )
    table.add_column("snippet", no_wrap=True, overflow="ellipsis", width=snippet_width)
    for rank, recall_rank, movement, score, recall_score, ident, change in rows:
        style = "green" if change.is_new or change.moved > 0 else "red" if change.moved < 0 else ""
        table.add_row(  # Text, not str: a str cell is parsed as Rich markup
            Text(rank),
            Text(recall_rank),
            Text(movement, style=style),
            Text(score),
            Text(recall_score),
            Text(ident),
            Text(_snippet(change.candidate.text, snippet_width)),
        )
    return table


def _say_reranker(console: Console, chosen: Chosen) -> None:
    console.print(Text("reranker: ", style="bold") + Text(chosen.label))
    if chosen.hint:
        _note(console, chosen.hint, style="yellow")


def _base_url(chosen: Chosen) -> str | None:
    base_url = getattr(chosen.reranker, "base_url", None)
    return base_url if isinstance(base_url, str) else None


def _rerank_failed(chosen: Chosen, exc: RerankError) -> NoReturn:
    base_url = _base_url(chosen)
    if base_url is None:
        _fail(EXIT_FAILURE, f"rerank failed: {exc}")
    _fail(
        EXIT_FAILURE,
        f"rerank failed: {_scrubbed(str(exc), base_url)}",
        f"is the rerank service at {shown_url(base_url)} up? For a local TEI: {COMPOSE_UP}",
    )


# -- commands --------------------------------------------------------------------------------


@app.command()
def demo(
    query: Annotated[
        str, typer.Argument(help="What to search the bundled corpus for.")
    ] = DEFAULT_QUERY,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="Results to show.")] = 10,
    recall_k: Annotated[
        int, typer.Option("--recall-k", min=1, help="Candidates recall hands to the reranker.")
    ] = 50,
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus",
            help="Search this corpus instead: JSON lines {id, text, metadata?}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    endpoint: Endpoint = None,
    provider: Provider = "tei",
    model: Model = None,
    api_key: ApiKey = None,
    api_key_header: ApiKeyHeader = None,
    timeout: Timeout = 30.0,
    reranker: RerankerOpt = RerankerChoice.auto,
    trace_file: TraceFile = None,
    log_level: LogLevel = "warning",
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="Run this many pipelines (the query, then the bundled example queries in "
            "turn), e.g. to keep traffic flowing into the compose stack's dashboards.",
        ),
    ] = 1,
    interval: Annotated[
        float, typer.Option("--interval", min=0.0, help="Seconds to wait between repeats.")
    ] = 1.0,
) -> None:
    """Recall from the bundled corpus of Python docstrings, rerank, and show what moved.

    Runs with no server and no network: BM25 recall over ~1,500 standard-library docstrings,
    then the local cross-encoder (with the \\[local] extra) or the lexical fallback, or the
    service at --endpoint.
    """
    if not query.strip():
        _fail(EXIT_USAGE, "the query must not be empty")
    _check_text(query, "the query")
    from ..corpus import load_corpus
    from ..pipeline import Pipeline
    from ..recall import BM25Recall

    documents = load_corpus() if corpus is None else _read_candidates(str(corpus), "--corpus")
    if not documents:
        _fail(EXIT_USAGE, f"--corpus {corpus}: no documents")
    where = "Python standard-library docstrings" if corpus is None else str(corpus)
    out = _out()
    with _session(
        log_level=log_level,
        trace_file=trace_file,
        endpoint=endpoint,
        provider=provider,
        model=model,
        api_key=api_key,
        api_key_header=api_key_header,
        timeout=timeout,
        choice=reranker,
    ) as (chosen, tracing):
        stage = tracing.stage(chosen, top_k)
        pipeline = Pipeline(
            BM25Recall(documents), stage, recall_k=recall_k, tracer_provider=tracing.provider
        )
        try:
            result = pipeline.run(query)
        except RerankError as exc:
            _rerank_failed(chosen, exc)
        except (TypeError, ValueError) as exc:  # the reranker refused its arguments
            _fail(EXIT_USAGE, f"cannot rerank this input: {exc}")
        out.print(Text("query: ", style="bold") + Text(query))
        out.print(
            Text("recall: ", style="bold")
            + Text(f"BM25 over {len(documents):,} {where}: {len(result.recalled)} candidates")
        )
        _say_reranker(out, chosen)
        if not result.results:
            _note(out, "no document shares a word with the query: nothing to rerank")
            return
        out.print(
            _changes_table(
                result.changes, score_label="score", recall_label="bm25", width=out.width
            )
        )
        if repeat > 1:
            _repeat(pipeline, chosen, query, repeat - 1, interval)


def _repeat(pipeline: Any, chosen: Chosen, query: str, runs: int, interval: float) -> None:
    """Run `runs` more pipelines, cycling through the example queries; one line each."""
    import itertools
    import time

    from ..corpus import data_path
    from ..evaluation import read_queries

    queries = [*read_queries(data_path("example/queries.tsv")).values(), query]
    err = _err()
    try:
        for n, text in enumerate(itertools.islice(itertools.cycle(queries), runs)):
            time.sleep(interval)
            try:
                result = pipeline.run(text)
            except RerankError as exc:
                why = _scrubbed(f"{type(exc).__name__}: {exc}", _base_url(chosen))
                _note(err, f"run {n + 2}: rerank failed ({why})", "yellow")
                continue
            moved = sum(1 for change in result.changes if change.moved)
            _note(err, f"run {n + 2}: {text!r}: {len(result.results)} results, {moved} moved")
    except KeyboardInterrupt:
        _note(err, "interrupted")


@app.command()
def rerank(
    query: Annotated[str, typer.Option("--query", "-q", help="The query to rank against.")],
    input_: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help='Candidates as JSON lines {"id", "text", "score"?, "metadata"?}: a file, '
            "or - for stdin.",
        ),
    ] = "-",
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k", min=0, help="Keep the best K (0 or unset: all).", show_default=False
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help='jsonl: {"id", "score", "recall_score", "rank", "recall_rank"} per line, best '
            "first; table: for people.",
        ),
    ] = OutputFormat.jsonl,
    endpoint: Endpoint = None,
    provider: Provider = "tei",
    model: Model = None,
    api_key: ApiKey = None,
    api_key_header: ApiKeyHeader = None,
    timeout: Timeout = 30.0,
    reranker: RerankerOpt = RerankerChoice.auto,
    trace_file: TraceFile = None,
    log_level: LogLevel = "warning",
) -> None:
    """Rerank candidates given as JSON lines; print them best first.

    Every input line is checked first: a bad line is reported with its number, exit code 2,
    and nothing is written to stdout. Ranks are 1-based; recall_rank orders the input by its
    "score" (best first, unscored last, ties in input order).
    """
    if not query.strip():
        _fail(EXIT_USAGE, "--query must not be empty")
    _check_text(query, "--query")
    candidates = _read_candidates(input_, "--input")
    err = _err()
    if not candidates:
        _note(err, "no candidates on the input: nothing to rerank")
        return
    from ..pipeline import compare_ranks
    from ..stage import recall_order

    # Recall order in: rerankers keep tied scores in input order, and ties must mean "no
    # change" against recall_rank, not a move back to the order of the lines.
    candidates = [candidates[i] for i in recall_order(candidates)]
    with _session(
        log_level=log_level,
        trace_file=trace_file,
        endpoint=endpoint,
        provider=provider,
        model=model,
        api_key=api_key,
        api_key_header=api_key_header,
        timeout=timeout,
        choice=reranker,
    ) as (chosen, tracing):
        stage = tracing.stage(chosen, top_k or None)
        try:
            outputs = stage.run(query, candidates)
        except RerankError as exc:
            _rerank_failed(chosen, exc)
        except (TypeError, ValueError) as exc:  # the reranker refused its arguments
            _fail(EXIT_USAGE, f"cannot rerank this input: {exc}")
        changes = compare_ranks(candidates, outputs)
        if output_format is OutputFormat.table:
            out = _out()
            out.print(
                _changes_table(changes, score_label="score", recall_label="recall", width=out.width)
            )
        else:
            lines = [
                json.dumps(
                    {
                        "id": c.candidate.id,
                        "score": c.score,
                        "recall_score": c.recall_score,
                        "rank": c.rank,
                        "recall_rank": c.recall_rank,
                    },
                    ensure_ascii=False,
                )
                + "\n"
                for c in changes
            ]
            sys.stdout.write("".join(lines))
            sys.stdout.flush()
        err.print(
            Text(f"reranked {len(candidates)} candidates with ", style="dim")
            + Text(chosen.label, style="dim")
        )
        if chosen.hint:
            _note(err, chosen.hint, style="yellow")


@app.command("eval")
def eval_(
    queries: Annotated[
        Path | None,
        typer.Option(
            "--queries",
            help="Queries: 'qid<TAB>text' lines, or JSON lines {id, text}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    qrels: Annotated[
        Path | None,
        typer.Option(
            "--qrels",
            help="Judgements: TREC qrels 'qid 0 docid grade', or JSON lines "
            "{query_id, doc_id, relevance}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    candidates: Annotated[
        Path | None,
        typer.Option(
            "--candidates",
            help="Recall's candidates per query: a TREC run 'qid Q0 docid rank score tag' "
            "(texts from --docs), or JSON lines {query_id, id, text?, score?}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(
            "--docs",
            help="Document texts for a TREC run: JSON lines {id, text} (default: the bundled "
            "corpus).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    recall_at: Annotated[int, typer.Option("--recall-at", min=1, help="The k of Recall@k.")] = 5,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON object.")
    ] = False,
    resamples: Annotated[
        int,
        typer.Option(
            "--resamples",
            min=100,
            max=1_000_000,  # evaluation.MAX_RESAMPLES: p to ~1e-6, more only costs time
            help="Random sign flips of the permutation test (when the exact test is larger).",
        ),
    ] = 9999,
    endpoint: Endpoint = None,
    provider: Provider = "tei",
    model: Model = None,
    api_key: ApiKey = None,
    api_key_header: ApiKeyHeader = None,
    timeout: Timeout = 30.0,
    reranker: RerankerOpt = RerankerChoice.auto,
    trace_file: TraceFile = None,
    log_level: LogLevel = "warning",
) -> None:
    """Is reranking better than recall? MRR@10, nDCG@10, Recall@k, top-1 accuracy.

    Reranks each judged query's candidates and reports both rankings side by side with a
    paired permutation test, and how far each query's first relevant document moved. With no
    --queries/--qrels/--candidates it runs the bundled example: 24 questions about the
    standard library with BM25's top 50 as candidates.
    """
    from ..corpus import EXAMPLE_CANDIDATES, EXAMPLE_QRELS, EXAMPLE_QUERIES, data_path, load_corpus
    from ..evaluation import EvalInputError, evaluate, read_candidates, read_qrels, read_queries

    given = [queries, qrels, candidates]
    if any(given) and not all(given):
        _fail(
            EXIT_USAGE,
            "give --queries, --qrels and --candidates together, or none of them to run the "
            "bundled example",
        )
    example = queries is None or qrels is None or candidates is None
    queries_path = data_path(EXAMPLE_QUERIES) if queries is None else queries
    qrels_path = data_path(EXAMPLE_QRELS) if qrels is None else qrels
    candidates_path = data_path(EXAMPLE_CANDIDATES) if candidates is None else candidates
    try:
        corpus = load_corpus() if docs is None else _read_candidates(str(docs), "--docs")
        texts = read_queries(queries_path)
        judgements = read_qrels(qrels_path)
        pools = read_candidates(candidates_path, {d.id: d for d in corpus})
    except EvalInputError as exc:
        _fail(EXIT_USAGE, str(exc))
    judged = [q for q in texts if any(g > 0 for g in judgements.get(q, {}).values())]
    if not judged:
        _fail(EXIT_USAGE, f"no query in {queries_path} has a relevant document in {qrels_path}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with _session(
        log_level=log_level,
        trace_file=trace_file,
        endpoint=endpoint,
        provider=provider,
        model=model,
        api_key=api_key,
        api_key_header=api_key_header,
        timeout=timeout,
        choice=reranker,
    ) as (chosen, tracing):
        stage = tracing.stage(chosen, None)
        tracer = tracing.provider.get_tracer("retrieval_stage.cli")
        progress = Progress(
            TextColumn("reranking"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}", markup=False),  # a query id, not markup
            console=_err(),
            transient=True,
        )
        # Errors are handled outside the span, so that it records the rerank error, not the
        # command's exit.
        try:
            with (
                progress,
                tracer.start_as_current_span(
                    "eval",
                    attributes={
                        **get_span_kind_attributes(OpenInferenceSpanKindValues.CHAIN),
                        "retrieval_stage.queries": len(judged),
                    },
                ),
            ):
                task = progress.add_task("", total=len(judged))
                report = evaluate(
                    stage,
                    texts,
                    judgements,
                    pools,
                    recall_at=recall_at,
                    resamples=resamples,
                    progress=lambda qid: progress.update(task, advance=1, description=qid),
                )
        except RerankError as exc:
            _rerank_failed(chosen, exc)
        except (TypeError, ValueError) as exc:  # the reranker refused its arguments
            _fail(EXIT_USAGE, f"cannot rerank this input: {exc}")
        if as_json:
            body = report.to_dict()
            body["reranker"] = {
                "label": chosen.label,
                "provider": getattr(chosen.reranker, "provider", None),
            }
            sys.stdout.write(json.dumps(body, ensure_ascii=False, indent=2) + "\n")
            if chosen.hint:
                _note(_err(), chosen.hint, style="yellow")
            return
        out = _out()
        source = "the bundled example (stdlib docstrings)" if example else str(queries_path)
        out.print(Text("queries: ", style="bold") + Text(f"{report.queries} judged, from {source}"))
        _say_reranker(out, chosen)
        out.print(_metrics_table(report))
        out.print(
            Text("top-1 accuracy: ", style="bold")
            + Text(
                f"{report.top1_recall}/{report.queries} → {report.top1_reranked}/{report.queries}"
            )
        )
        out.print(_movement_table(report, out.width))
        _note(out, f"p: {report.test}")
        if report.unjudged:
            _note(out, f"{len(report.unjudged)} queries without a relevant document were skipped")


def _metrics_table(report: Any) -> Table:
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for name, justify in (("metric", "left"), ("recall", "right"), ("reranked", "right"),
                          ("Δ", "right"), ("p", "right")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for m in report.metrics:
        style = "green" if m.delta > 0 else "red" if m.delta < 0 else ""
        table.add_row(  # Text, not str: a str cell is parsed as Rich markup
            Text(m.name),
            Text(f"{m.recall:.3f}"),
            Text(f"{m.reranked:.3f}"),
            Text(f"{m.delta:+.3f}", style=style),
            Text(f"{m.p_value:.3f}"),
        )
    return table


def _movement_table(report: Any, width: int) -> Table:
    """Per query: first relevant rank before → after, movement, RR@10 before → after, text."""
    rows = []
    for q in report.per_query:
        before = "—" if q.first_relevant_recall is None else str(q.first_relevant_recall)
        after = "—" if q.first_relevant_reranked is None else str(q.first_relevant_reranked)
        rr = f"{q.recall['MRR@10']:.2f} → {q.reranked['MRR@10']:.2f}"
        rows.append((q.query_id, f"{before} → {after}", q.movement, rr, q.query))
    # Every cell is a Text: a plain str would be parsed as Rich markup, and an id like "[/x]"
    # raises mid-table.
    headers = ("query", "first relevant", "move", "RR@10")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    text_width = max(12, width - sum(widths) - 3 * len(headers))
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="left" if i == 0 else "center" if i == 2 else "right",
            no_wrap=True,
            width=widths[i],
        )
    table.add_column("text", no_wrap=True, overflow="ellipsis", width=text_width)
    for query_id, ranks, move, rr, text in rows:
        good = move.startswith("↑") or move == "found"
        bad = move.startswith("↓") or move == "lost"
        style = "green" if good else "red" if bad else ""
        table.add_row(
            Text(query_id),
            Text(ranks),
            Text(move, style=style),
            Text(rr),
            Text(_snippet(text, text_width)),
        )
    return table


def main() -> None:
    """The console script's entry point."""
    try:
        app()
    except BrokenPipeError:  # `retrieval-stage rerank ... | head`: the reader left
        with suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        raise SystemExit(EXIT_FAILURE) from None
