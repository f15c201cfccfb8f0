"""Open connections bounded: a silent or slow client is closed, and file descriptors never run out.

uvicorn closes a keep-alive connection that stays idle after a response, but never one that
has not yet sent a complete request head: a client that connects and sends nothing (or its
headers a byte at a time) holds its socket for ever, enough of them take every file
descriptor, and then every ``accept`` fails (Python 3.11's loop logs that failure up to
``backlog`` times per wake-up). `guarded_protocol` is uvicorn's h11 protocol with two bounds:
a connection whose request head is not complete `header_timeout` seconds after it connected
(or after its last response) is closed, and at most `max_connections` stay open; at the cap
the connection idle the longest is closed to make room, or the newcomer when none is idle.
`quiet_accept_failures` says an ``accept`` that failed for want of descriptors once every
`LOG_EVERY_S` seconds, with a count, instead of once per attempt.
"""

from __future__ import annotations

import asyncio
import collections
import resource
import time
from collections.abc import Callable
from typing import Any

from .._log import get_logger

__all__ = [
    "LOG_EVERY_S",
    "ConnectionGuard",
    "default_max_connections",
    "guarded_protocol",
    "quiet_accept_failures",
]

LOG_EVERY_S = 10.0
"""At most one log line per kind of connection trouble in this many seconds."""

_ACCEPT_FAILED = "socket.accept() out of system resource"

_log = get_logger("retrieval_stage.server")


def default_max_connections(soft_limit: int | None = None) -> int:
    """Connections to allow under the process's open-file limit (`soft_limit`, default the
    current ``RLIMIT_NOFILE``): all but a reserve for the model's files, logs and exporters."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY or soft_limit > 1 << 20:
        soft_limit = 1 << 20
    return max(16, soft_limit - (64 + soft_limit // 16))


class _Throttled:
    """One log event at most every `LOG_EVERY_S` seconds, counting what it did not say."""

    def __init__(self, event: str) -> None:
        self.event = event
        self.last = -LOG_EVERY_S
        self.unsaid = 0

    def note(self, **fields: Any) -> None:
        self.unsaid += 1
        now = time.monotonic()
        if now - self.last >= LOG_EVERY_S:
            _log.warning(self.event, count=self.unsaid, **fields)
            self.last, self.unsaid = now, 0


class ConnectionGuard:
    """The bounds one server's connections share, and what they did (for logs and tests)."""

    def __init__(self, max_connections: int, header_timeout: float) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections!r}")
        if not header_timeout > 0:
            raise ValueError(f"header_timeout must be > 0, got {header_timeout!r}")
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.open = 0
        self.idle: collections.OrderedDict[Any, None] = collections.OrderedDict()
        """Connections waiting for a request head, the longest-waiting first."""
        self.refused = self.evicted = self.timed_out = 0
        self._refused_log = _Throttled("server.connection_refused")
        self._evicted_log = _Throttled("server.connection_evicted")

    def make_room(self) -> bool:
        """True when a new connection may open: under the cap, or an idle one was closed."""
        if self.open < self.max_connections:
            return True
        if self.idle:
            oldest, _ = self.idle.popitem(last=False)
            oldest.evict()
            self.evicted += 1
            self._evicted_log.note(max_connections=self.max_connections)
            return True
        self.refused += 1
        self._refused_log.note(max_connections=self.max_connections)
        return False


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol under `guard`'s bounds (pass it as ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _counted = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if not guard.make_room():
                self.transport = transport  # type: ignore[assignment]
                transport.abort()  # type: ignore[attr-defined]
                return
            guard.open += 1
            self._counted = True
            super().connection_made(transport)  # type: ignore[arg-type]
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_arrived()
            self._uncount()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._after_events()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._after_events()

        def evict(self) -> None:
            """Closed to make room for a newcomer (`ConnectionGuard.make_room`)."""
            self._head_arrived()
            self._uncount()
            self.transport.abort()

        def _after_events(self) -> None:
            if self.cycle is not None and not self.cycle.response_complete:
                self._head_arrived()  # a request is being served: no longer idle
            elif self._head_timer is None and not self.transport.is_closing():
                self._await_head()

        def _await_head(self) -> None:
            self._head_timer = self.loop.call_later(guard.header_timeout, self._head_late)
            guard.idle[self] = None

        def _head_arrived(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            guard.idle.pop(self, None)

        def _head_late(self) -> None:
            self._head_timer = None
            guard.idle.pop(self, None)
            guard.timed_out += 1
            if not self.transport.is_closing():
                self.transport.close()

        def _uncount(self) -> None:
            if self._counted:
                self._counted = False
                guard.open -= 1

    return GuardedH11Protocol


def quiet_accept_failures(
    loop: asyncio.AbstractEventLoop,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An exception handler for `loop` that says a failed ``accept`` once every `LOG_EVERY_S`
    seconds (with how many failed) and passes anything else to the handler it replaces."""
    previous = loop.get_exception_handler()
    throttled = _Throttled("server.accept_failed")

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_FAILED:
            error = context.get("exception")
            throttled.note(error=type(error).__name__, errno=getattr(error, "errno", None))
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handle
