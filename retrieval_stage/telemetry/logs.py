"""Logging set-up for applications (and our CLI): structlog JSON lines correlated with traces.

Library code never calls `configure_logging`; it logs through `retrieval_stage._log`, which
follows whatever the application configured. `add_trace_context` is the structlog processor
that puts the current span's ids on every line, in the hex form Grafana and Tempo show.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from opentelemetry import trace

__all__ = ["add_trace_context", "configure_logging"]


def add_trace_context(
    logger: Any, method_name: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    """structlog processor: add the current span's ``trace_id``/``span_id`` as lowercase hex.

    32 and 16 hex digits, the form Grafana's trace-to-logs and logs-to-trace links match.
    """
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict["trace_id"] = format(context.trace_id, "032x")
        event_dict["span_id"] = format(context.span_id, "016x")
    return event_dict


class _StructlogBridge(logging.Handler):
    """Renders stdlib records (the OpenTelemetry SDK's) through structlog, in our log format."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logger = structlog.get_logger(record.name)
            logger.log(record.levelno, record.getMessage(), sdk_logger=record.name)
        except Exception:  # a log line must never break the application
            self.handleError(record)


def _level(level: int | str) -> int:
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    return numeric


def configure_logging(
    level: int | str = logging.INFO,
    *,
    stream: TextIO | None = None,
    json: bool = True,
    sdk_level: int | str = logging.WARNING,
    export_level: int | str = logging.CRITICAL,
) -> None:
    """Configure structlog to write one JSON object per line, correlated with traces.

    Each line carries ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``event``, the
    event's fields and, inside a span, ``trace_id`` and ``span_id``. `json=False` renders for
    a terminal instead. Writes to `stream` (default stderr).

    The OpenTelemetry SDK logs through stdlib logging; its records (logger ``opentelemetry``)
    are rendered in the same format from `sdk_level` up, never printed raw. The exporters'
    per-attempt lines ("Transient error ...", "Failed to export ...", logger
    ``opentelemetry.exporter``) show from `export_level` up, by default not at all: shutdown
    says once what was not delivered (``telemetry.undelivered``). Set ``export_level="WARNING"``
    to see every failed attempt of a long-running process.
    """
    numeric = _level(level)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_context,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    sdk_logger = logging.getLogger("opentelemetry")
    for handler in [h for h in sdk_logger.handlers if isinstance(h, _StructlogBridge)]:
        sdk_logger.removeHandler(handler)
    sdk_logger.addHandler(_StructlogBridge())
    sdk_logger.setLevel(_level(sdk_level))
    sdk_logger.propagate = False
    logging.getLogger("opentelemetry.exporter").setLevel(_level(export_level))
