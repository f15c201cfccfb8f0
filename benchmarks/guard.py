"""Keep every client in the benchmark on loopback: no peer library may reach the internet.

`install()` wraps `socket.getaddrinfo` and `socket.socket.connect` so that any attempt to
resolve or connect to a host other than 127.0.0.1, ::1 or localhost raises `BlockedNetwork`.
Peers (the Cohere SDK, `rerankers`, LangChain, LlamaIndex) are all pointed at the local server;
the guard turns a forgotten default URL or a telemetry ping into a loud failure instead of a
silent request to a real service.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_LOOPBACK = {"127.0.0.1", "::1", "localhost", "ip6-localhost"}
_installed = False


class BlockedNetwork(OSError):
    """A benchmark client tried to leave loopback."""


def _check_host(host: Any) -> None:
    if isinstance(host, bytes):
        host = host.decode("ascii", errors="replace")
    if host is None or str(host) in _LOOPBACK:
        return
    raise BlockedNetwork(f"benchmark guard: refusing to reach {host!r} (loopback only)")


def install() -> None:
    """Refuse non-loopback name resolution and connections in this process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    # Opt every SDK we load out of its own telemetry and hub look-ups.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LANGSMITH_TRACING", "false")
    os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.pop("CO_API_URL", None)

    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        _check_host(host)
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _check_host(address[0])
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _check_host(address[0])
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]
