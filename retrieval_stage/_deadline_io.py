"""Socket I/O that never outlives the current call's deadline (sync client only).

httpx has per-phase timeouts, not a total one (encode/httpx#1450): each socket read may take
the whole read timeout, so a server sending response headers one byte at a time could hold a
sync call far past its deadline. The sync client sets `CALL_DEADLINE` (a monotonic instant)
while it sends, and this network backend caps every connect, read and write at the time left.
The async client needs none of this: `asyncio.wait_for` bounds the whole request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

import httpcore

__all__ = ["CALL_DEADLINE", "DeadlineBackend", "install"]

CALL_DEADLINE: ContextVar[float | None] = ContextVar("retrieval_stage_call_deadline", default=None)

_FLOOR_S = 0.001  # a zero timeout would make the socket non-blocking, not time out


def _capped(timeout: float | None) -> float | None:
    deadline = CALL_DEADLINE.get()
    if deadline is None:
        return timeout
    left = max(deadline - time.monotonic(), _FLOOR_S)
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _capped(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _capped(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._stream.start_tls(ssl_context, server_hostname, _capped(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """Wraps httpcore's sync backend so every socket operation respects `CALL_DEADLINE`."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(
            host, port, _capped(timeout), local_address, socket_options
        )
        return _Stream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._backend.connect_unix_socket(path, _capped(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def install(transport: Any) -> bool:
    """Put `DeadlineBackend` under an `httpx.HTTPTransport`; False if its layout is unknown.

    Reaches into httpx's connection pool (``_pool._network_backend``): httpx offers no public
    hook for the network backend. If a future httpx moves it, the client still checks the
    deadline between body chunks, only less tightly.
    """
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(backend, httpcore.NetworkBackend):
        return False
    pool._network_backend = DeadlineBackend(backend)  # type: ignore[union-attr]
    return True
