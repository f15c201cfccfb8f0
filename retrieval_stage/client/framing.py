"""A connection that received more than its answer is never reused (issue 23, minor case).

A server (or anything between) that sends bytes after a short ``Content-Length`` on a
keep-alive connection leaves them buffered by the HTTP parser; were the connection reused, the
next request would read them as its answer: another call's scores. A body shorter than its
``Content-Length`` ends in an error (the peer closed, or the deadline came), and both httpcore
and aiohttp close a connection whose body was not read to its end.

What each transport does with the extra bytes:

- httpx's default transport (httpcore + h11, a caller's own ``httpx.Client`` or
  ``httpx.AsyncClient``): h11 keeps them in its receive buffer and httpcore pools the
  connection. `OverfullGuard` looks, while the body is read, at h11's public
  ``trailing_data``; more bytes there than the ``Content-Length`` has left mark the
  connection failed (h11's ``send_failed``), so httpcore closes it instead of pooling it.
  Bytes arriving later, on an idle pooled connection, make its socket readable, and httpcore
  does not reuse a readable idle connection. The sync client's own transport also counts the
  bytes each socket read brings (`deadline_io`). A chunked body is framed by h11 itself and
  not watched: bytes after its last chunk, in the same packet, are not caught through a
  caller's own httpx client (the sync client's own transport does not catch them either).
- aiohttp (the async client's default): bytes that came with the answer are parsed into a
  queued message, and aiohttp's ``ResponseHandler.should_close`` then holds, so the connector
  closes the connection on release. Bytes arriving after the release, on an idle pooled
  connection, are parsed and queued too, and aiohttp would hand that connection out with
  them: `aiohttp_io.GuardedConnector` closes, at checkout, a pooled connection that says it
  should close.

What no HTTP/1.1 client can tell apart: bytes arriving after the next request has been written
are, to the client, that request's answer (HTTP/1.1 has no request ids). Only a server that
answers twice, late, can do that; the answer then still has to match the next request's
document count and indices to be accepted.
"""

from __future__ import annotations

from typing import Any

import h11
import httpx

__all__ = ["OverfullGuard", "h11_connection"]

# The attributes that lead from an httpx response's stream to httpcore's HTTP/1.1 connection:
# httpx's ResponseStream._httpcore_stream -> httpcore's PoolByteStream._stream ->
# HTTP11ConnectionByteStream._connection -> HTTP11Connection._h11_state. Private names, so
# walked defensively: a transport laid out otherwise is simply not found (None).
_LINKS = ("_httpcore_stream", "_stream", "_connection")
_MAX_DEPTH = 8


def h11_connection(response: httpx.Response) -> h11.Connection | None:
    """The h11 state machine behind `response`, or None (HTTP/2, a mock or other transport)."""
    obj: Any = response.stream
    for _ in range(_MAX_DEPTH):
        state = getattr(obj, "_h11_state", None)
        if isinstance(state, h11.Connection):
            return state
        obj = next((getattr(obj, a) for a in _LINKS if getattr(obj, a, None) is not None), None)
        if obj is None:
            return None
    return None


class OverfullGuard:
    """Watches one response's body as it is read; the moment h11 holds more bytes than the
    ``Content-Length`` has left, marks the connection failed (h11's public ``send_failed``), so
    httpcore closes it when the response closes instead of pooling it.

    It must act while the body is still being read: httpx closes the response (and httpcore
    hands the connection to a waiting request) as soon as the last chunk is consumed. `feed`
    each raw chunk; a response without h11 behind it, or not framed by ``Content-Length``,
    is not watched (a chunked body's end is h11's own framing).
    """

    __slots__ = ("_left", "_state")

    def __init__(self, response: httpx.Response) -> None:
        headers = response.headers
        length = headers.get("content-length", "")
        self._state: h11.Connection | None = None
        self._left = 0
        if length.isdigit() and len(length) <= 18 and "transfer-encoding" not in headers:
            self._state = h11_connection(response)
            self._left = int(length)
            if self._state is not None:
                self._check()

    def feed(self, chunk: bytes) -> None:
        """One raw chunk of the body was read."""
        if self._state is not None:
            self._left -= len(chunk)
            self._check()

    def _check(self) -> None:
        state = self._state
        assert state is not None
        extra, _ = state.trailing_data
        if len(extra) > max(self._left, 0):
            state.send_failed()  # our side in ERROR: httpcore closes it on the response's close
            self._state, self._left = None, -1
