"""Running the server as an application: logging, tracing, metrics, uvicorn, a clean stop.

`serve` is what ``retrieval-stage serve`` calls. Unlike the library it configures structlog
JSON logs (`configure_logging`: every line inside a request carries its ``trace_id``) and, when
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set, an OTLP tracer and meter provider
(`configure_tracing`, `configure_metrics`, every standard ``OTEL_*`` variable honoured). It
binds only to loopback unless told otherwise. SIGTERM or Ctrl-C stops accepting connections,
lets the requests in flight finish (up to `drain_timeout` seconds), then flushes telemetry.
Connections are bounded (`retrieval_stage.server.connections`): one that has not sent its
request head within `header_timeout` seconds is closed, and at most `max_connections` stay
open (default: what the open-file limit allows, less a reserve).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._log import get_logger
from .settings import ServerSettings, is_loopback

__all__ = ["DEFAULT_PROJECT", "SERVICE_NAME", "BindError", "NotLoopbackError", "serve"]

SERVICE_NAME = "retrieval-stage-server"
"""The server's OpenTelemetry service name (``OTEL_SERVICE_NAME`` wins)."""

DEFAULT_PROJECT = "retrieval-stage"
"""The Phoenix project the server's spans land in: the command line's, so that a demo's trace
and the server's part of it are one trace in one project (``RETRIEVAL_STAGE_PROJECT`` wins)."""

_log = get_logger("retrieval_stage.server")


class NotLoopbackError(ValueError):
    """The address would open the server beyond this machine, and that was not asked for."""


class BindError(OSError):
    """The address and port could not be bound (another process holds the port, or the address
    is not this machine's): raised before anything is logged, loaded or served."""


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on `host`:`port`, bound as uvicorn binds it (address reuse on), so a
    port that cannot be had is known before the model loads and before a line is logged."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        reason = (exc.strerror or str(exc)).lower()
        refused = BindError(f"cannot listen on {host}:{port}: {reason}")
        refused.errno = exc.errno
        raise refused from exc
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _ToStructlog(logging.Handler):
    """uvicorn's own log records (start-up, errors, shutdown) as our JSON lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            import structlog

            structlog.get_logger(record.name).log(
                record.levelno, record.getMessage(), server_logger=record.name
            )
        except Exception:  # a log line must never break the server
            self.handleError(record)


def _route_uvicorn_logs(level: int) -> None:
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [_ToStructlog()]
        logger.setLevel(level)
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True  # server.request replaces it


@dataclass
class _Outcome:
    load_error: BaseException | None = None


def _telemetry(project: str | None) -> tuple[Any, Any, str | None]:
    """Tracer and meter providers exporting over OTLP when an endpoint is set, else ones that
    record nothing; and where the spans go (None: nowhere)."""
    from ..telemetry import configure_metrics, configure_tracing
    from ..telemetry.otlp import otlp_endpoint_configured, otlp_target

    service = os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME
    chosen = project or os.environ.get("RETRIEVAL_STAGE_PROJECT") or DEFAULT_PROJECT
    tracer_provider: Any = None
    meter_provider: Any = None
    where = None
    if otlp_endpoint_configured("traces"):
        tracer_provider = configure_tracing(service, project=chosen)
        where = otlp_target("traces").shown
    if otlp_endpoint_configured("metrics"):
        meter_provider = configure_metrics(service)
    if tracer_provider is None:
        # Spans are still made (not exported): they continue the caller's trace, so every log
        # line of a request carries the caller's trace id.
        from opentelemetry.sdk.trace import TracerProvider

        tracer_provider = TracerProvider()
    if meter_provider is None:
        from opentelemetry.metrics import NoOpMeterProvider

        meter_provider = NoOpMeterProvider()
    return tracer_provider, meter_provider, where


DRAIN_GRACE_S = 2
"""Seconds between the end of the drain (unanswered requests refused with 503) and uvicorn
cancelling what is left: time for those handlers to send their answers."""


def _cut_drain(lifespan_state: dict[str, Any]) -> None:
    """Refuse with 503 what still waits for the model (the app's lifespan state holds its
    `Serving`, whose batcher knows)."""
    serving = lifespan_state.get("server")
    batcher = getattr(serving, "batcher", None)
    if batcher is not None:
        _log.warning("server.drain_cut", refused=batcher.refuse_all("the server is stopping"))


def serve(
    settings: ServerSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    allow_remote: bool = False,
    project: str | None = None,
    log_level: str = "INFO",
    drain_timeout: int = 30,
    json_logs: bool = True,
    on_listening: Callable[[str], None] | None = None,
    header_timeout: float = 10.0,
    max_connections: int | None = None,
) -> int:
    """Run the server until SIGTERM or Ctrl-C; the process's exit code (0, or 1 when the model
    could not be loaded).

    `host` must be a loopback address unless `allow_remote` (the command line sets it when
    ``--host`` names another address itself): `NotLoopbackError` otherwise, before anything
    is bound. A port that cannot be bound raises `BindError`, also before anything is logged
    or loaded; once it is bound, `on_listening` is given the server's URL (with the port
    actually bound, for ``port=0``). `json_logs` False renders the log lines for a terminal.
    """
    if not is_loopback(host) and not allow_remote:
        raise NotLoopbackError(
            f"{host} is not a loopback address: pass --host {host} yourself to serve beyond "
            "this machine (the server has no authentication)"
        )
    import uvicorn

    from ..telemetry import configure_logging, shutdown_telemetry
    from .app import create_app
    from .connections import (
        ConnectionGuard,
        default_max_connections,
        guarded_protocol,
        quiet_accept_failures,
    )

    guard = ConnectionGuard(
        max_connections if max_connections is not None else default_max_connections(),
        header_timeout,
    )

    sock = _bind(host, port, backlog=2048)  # uvicorn's default backlog
    # The model loaders' progress bars would write raw lines between the JSON ones.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    configure_logging(log_level, json=json_logs)
    _route_uvicorn_logs(logging.getLevelName(log_level.upper()))
    tracer_provider, meter_provider, where = _telemetry(project)
    outcome = _Outcome()
    server: uvicorn.Server | None = None

    def failed(exc: BaseException) -> None:
        outcome.load_error = exc
        if server is not None:
            server.should_exit = True

    app = create_app(
        settings,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        on_load_failure=failed,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=max(1, drain_timeout) + DRAIN_GRACE_S,
        server_header=False,
        http=guarded_protocol(guard),
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(quiet_accept_failures(loop))
            await super().startup(sockets)

        async def shutdown(self, sockets: Any = None) -> None:
            # At the end of the drain the requests still waiting for the model get TEI's
            # 503 from their own handlers, before uvicorn cancels what is left.
            cut = asyncio.get_running_loop().call_later(
                drain_timeout, _cut_drain, self.lifespan.state
            )
            try:
                await super().shutdown(sockets)
            finally:
                cut.cancel()

    server = Server(config)
    # uvicorn re-raises the signal that stopped it once it has drained; with Python's default
    # handler that would kill the process before telemetry is flushed. A handler that only
    # notes the signal keeps it alive for that last step.
    stopped_by: list[int] = []
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda received, _frame: stopped_by.append(received))
    bound_port = int(sock.getsockname()[1])
    _log.info(
        "server.starting",
        host=host,
        port=bound_port,
        url=_url(host, bound_port),
        reranker=settings.reranker,
        model=settings.model,
        traces_to=where,
        loopback_only=is_loopback(host),
        max_connections=guard.max_connections,
        header_timeout_s=header_timeout,
    )
    if on_listening is not None:
        on_listening(_url(host, bound_port))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        shutdown_telemetry(tracer_provider, meter_provider)
        _log.info(
            "server.exited", signal=signal.Signals(stopped_by[0]).name if stopped_by else None
        )
    return 1 if outcome.load_error is not None or not server.started else 0
