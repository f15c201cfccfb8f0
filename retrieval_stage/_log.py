"""The library's loggers: structlog when the application configured it, else stdlib logging.

structlog's unconfigured default prints to stdout, and a library must never print. So each
event goes to structlog only once the application has called ``structlog.configure`` (our
`configure_logging` does); otherwise it goes to the stdlib logger of the same name. The library
installs no handler there (not even a `NullHandler`): an application that configured stdlib
logging gets the records through its own handlers, and one that configured nothing gets its
WARNINGs on stderr through `logging.lastResort`, as Python's logging HOWTO has it for
libraries. A script that never set up logging thus still hears that its reranker failed
(``rerank.fallback``) or that its configuration could not be read (``rerank.config_invalid``).

On the stdlib path the message is one line: the event name, what it means in words for the
events a user must not miss (`SUMMARIES`), and the fields. Event names and fields are the same
either way; the record also carries them as ``event_fields``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import structlog

__all__ = ["SUMMARIES", "EventLogger", "get_logger", "message"]


def _fallback(f: Mapping[str, Any]) -> str:
    return f"the reranker failed, so the candidates were returned in recall order: {f['error']}"


def _failed(f: Mapping[str, Any]) -> str:
    return f"the reranker failed: {f['error']}"


def _config(f: Mapping[str, Any]) -> str:
    setting = str(f["key"])
    if "value" in f and repr(f["value"]) not in str(f["reason"]):
        setting += f"={f['value']!r}"
    off = " (no reranking)" if f["fallback"] in ("NullReranker", "AsyncNullReranker") else ""
    return f"{setting}: {f['reason']}; using {f['fallback']}{off}"


def _undelivered(f: Mapping[str, Any]) -> str:
    parts = [
        f"{f[key]} {what}{'' if f[key] == 1 else 's'}"
        for key, what in (
            ("spans_not_delivered", "span"),
            ("metric_points_not_delivered", "metric point"),
        )
        if f.get(key)
    ]
    where = ", ".join(str(e) for e in f.get("endpoints") or [])
    to = f" to {where}" if where else ""
    return f"{' and '.join(parts) or 'telemetry'} could not be delivered{to} before shutdown ended"


SUMMARIES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "rerank.fallback": _fallback,
    "rerank.failed": _failed,
    "rerank.config_invalid": _config,
    "telemetry.undelivered": _undelivered,
}
"""What the events a user must not miss mean, in words, for the one-line stdlib message."""

_SUMMARISED = {
    "rerank.fallback": {"error"},
    "rerank.failed": {"error"},
    "rerank.config_invalid": {"key", "value", "reason", "fallback"},
    "telemetry.undelivered": {"spans_not_delivered", "metric_points_not_delivered", "endpoints"},
}
"""The fields each summary already says (left out of the parenthesis after it)."""


def message(event: str, fields: Mapping[str, Any]) -> str:
    """One line: ``event: summary (field=value, ...)``, or ``event field=value, ...``."""
    summarise = SUMMARIES.get(event)
    summary = None
    if summarise is not None:
        try:
            summary = summarise(fields)
        except (KeyError, TypeError, ValueError):  # a field missing: the plain form
            summary = None
    shown_fields = (
        {k: v for k, v in fields.items() if k not in _SUMMARISED[event]} if summary else fields
    )
    shown = ", ".join(f"{key}={value!r}" for key, value in shown_fields.items())
    line = (
        f"{event}: {summary}" + (f" ({shown})" if shown else "")
        if summary
        else f"{event} {shown}".rstrip()
    )
    return " ".join(line.split())  # one line, whatever a server put in its message


class EventLogger:
    """`warning`/`info`/`debug` with an event name and key-value fields."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._std = logging.getLogger(name)

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, "warning", event, fields)

    def _emit(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(structlog.get_logger(self.name), method)(event, **fields)
        elif self._std.isEnabledFor(level):
            self._std.log(level, "%s", message(event, fields), extra={"event_fields": fields})


def get_logger(name: str) -> EventLogger:
    """The logger for module `name` (``retrieval_stage.client`` and so on)."""
    return EventLogger(name)
