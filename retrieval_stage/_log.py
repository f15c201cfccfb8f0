"""The library's loggers: structlog when the application configured it, else stdlib logging.

structlog's unconfigured default prints to stdout, and a library must never print. So each
event goes to structlog only once the application has called ``structlog.configure`` (our
`configure_logging` does); otherwise it goes to the stdlib logger of the same name, which has
a `NullHandler` and stays silent unless the application configured stdlib logging. Event names
and fields are the same either way.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["EventLogger", "get_logger"]

logging.getLogger("retrieval_stage").addHandler(logging.NullHandler())


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
            shown = " ".join(f"{key}={value!r}" for key, value in fields.items())
            self._std.log(level, "%s %s", event, shown, extra={"event_fields": fields})


def get_logger(name: str) -> EventLogger:
    """The logger for module `name` (``retrieval_stage.client`` and so on)."""
    return EventLogger(name)
