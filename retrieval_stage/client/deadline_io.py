"""Socket I/O that never outlives the current call's deadline (sync client only).

httpx has per-phase timeouts, not a total one (encode/httpx#1450): each socket read may take
the whole read timeout, so a server sending response headers one byte at a time could hold a
sync call far past its deadline. The sync client sets `CALL_DEADLINE` (a monotonic instant)
while it sends, and this network backend caps every connect, read and write at the time left.
The async client needs none of this: one cancel scope bounds its whole call.

Built only on public APIs: httpcore's ``ConnectionPool(network_backend=...)`` under a small
httpx transport (`DeadlineTransport`). httpcore's exceptions become httpx's by class name
(`_httpx_error`), as httpx's own transport does; `tests/client/test_flow.py` fails
loudly if a new httpcore exception has no httpx twin.
"""

from __future__ import annotations

import ssl
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, NoReturn, cast
from urllib.parse import urlsplit

import httpcore
import httpx

__all__ = [
    "CALL_DEADLINE",
    "DeadlineBackend",
    "DeadlineTransport",
    "environment_proxy",
    "http_proxies_only",
    "httpx_error",
]

CALL_DEADLINE: ContextVar[float | None] = ContextVar("retrieval_stage_call_deadline", default=None)

_FLOOR_S = 0.001  # a zero timeout would make the socket non-blocking, not time out


def _capped(timeout: float | None) -> float | None:
    deadline = CALL_DEADLINE.get()
    if deadline is None:
        return timeout
    left = max(deadline - time.monotonic(), _FLOOR_S)
    return left if timeout is None else min(timeout, left)


_HEAD_KEPT = 65536  # enough of a response's start to find the end of its header


class _Stream(httpcore.NetworkStream):
    """A socket whose every operation is capped at the call's deadline, and which counts what
    one response brought, so a connection that received more than its answer is never reused
    (`_Body.close`): h11 would keep the extra bytes and hand them to the next request as its
    answer, another call's scores."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self.received = 0
        self.head = b""
        self.broken = False

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._stream.read(max_bytes, _capped(timeout))
        self.received += len(data)
        if len(self.head) < _HEAD_KEPT:
            self.head += data[: _HEAD_KEPT - len(self.head)]
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self.received:  # a new request: count its answer afresh
            self.received, self.head = 0, b""
        self._stream.write(buffer, _capped(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._stream.start_tls(ssl_context, server_hostname, _capped(timeout)))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self.broken:
            return True  # what httpcore takes for "the server spoke out of turn": not reused
        return self._stream.get_extra_info(info)

    def check_framing(self, headers: httpx.Headers) -> None:
        """Mark the connection broken when more bytes came than the response's header and
        ``Content-Length`` account for (bytes smuggled after a short ``Content-Length``)."""
        length = headers.get("content-length", "")
        if "transfer-encoding" in headers or not length.isdigit() or len(length) > 18:
            return
        end = self.head.find(b"\r\n\r\n")
        if end >= 0 and self.received > end + 4 + int(length):
            self.broken = True


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


def httpx_error(exc: httpcore.TimeoutException | Exception) -> httpx.TransportError | None:
    """The httpx exception that stands for httpcore's `exc` (same class name, the nearest
    ancestor that has one), or None when `exc` is not an httpcore error."""
    if not isinstance(exc, Exception) or not type(exc).__module__.startswith("httpcore"):
        return None
    for cls in type(exc).__mro__:
        twin = getattr(httpx, cls.__name__, None)
        if isinstance(twin, type) and issubclass(twin, httpx.TransportError):
            return twin(str(exc))
    return None


def _raise_mapped(exc: Exception) -> NoReturn:
    """Raise the httpx twin of httpcore's `exc`, or `exc` itself. A plain function, not a
    context manager: entering one per request and per body was 3-4% of a call's CPU."""
    mapped = httpx_error(exc)
    if mapped is None:
        raise exc
    raise mapped from exc


class _Body(httpx.SyncByteStream):
    def __init__(
        self, stream: Iterable[bytes], network: Any = None, headers: httpx.Headers | None = None
    ) -> None:
        self._stream = stream
        self._network = network
        self._headers = headers

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except Exception as exc:
            _raise_mapped(exc)

    def close(self) -> None:
        if isinstance(self._network, _Stream) and self._headers is not None:
            self._network.check_framing(self._headers)  # before the pool takes it back
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


def environment_proxy(url: httpx.URL, proxies: Mapping[str, str] | None = None) -> str | None:
    """The proxy ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` (any case) name for `url`, or
    None for a direct connection (none set, or ``NO_PROXY`` covers the host): the standard
    library's reading of those variables. `proxies`: that reading done once already
    (``urllib.request.getproxies_environment()``), None to read the environment now."""
    if proxies is None:
        proxies = urllib.request.getproxies_environment()
    host = url.host
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxies or bypass(host, proxies):
        return None
    return proxies.get(url.scheme) or proxies.get("all")


def http_proxies_only() -> bool:
    """Whether every proxy the environment names is an http(s) proxy, which
    `DeadlineTransport` can route through (a SOCKS proxy needs httpx's own transport)."""
    proxies = urllib.request.getproxies_environment()
    return all(
        urlsplit(url).scheme in ("http", "https")
        for scheme, url in proxies.items()
        if scheme != "no" and url
    )


class DeadlineTransport(httpx.BaseTransport):
    """An HTTP/1.1 transport whose every socket operation respects `CALL_DEADLINE`.

    Requests go through the http(s) proxy the environment names for them (``HTTP_PROXY``,
    ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``: `environment_proxy`), with the same caps: the
    deadline holds through a proxy too. They are read when the transport is made, as httpx
    reads them when a client is made (reading ``os.environ`` per request was 3% of a call's
    CPU). `ssl_context` defaults to httpx's (certificate verification on). Pool limits match
    httpx's defaults (100 connections, 20 kept alive for 5 s). A caller's own
    ``httpx.Client(transport=DeadlineTransport())`` gets the same caps.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context if ssl_context is not None else httpx.create_ssl_context()
        self._pool = self._new_pool(None)
        self._proxied: dict[str, httpcore.ConnectionPool] = {}
        self._proxies = urllib.request.getproxies_environment()

    def _new_pool(self, proxy: str | None) -> httpcore.ConnectionPool:
        limits: dict[str, Any] = {
            "max_connections": 100,
            "max_keepalive_connections": 20,
            "keepalive_expiry": 5.0,
            "network_backend": DeadlineBackend(httpcore.SyncBackend()),
        }
        if proxy is None:
            return httpcore.ConnectionPool(ssl_context=self._ssl_context, **limits)
        url = httpx.URL(proxy)
        auth = (url.username, url.password) if url.username else None
        return httpcore.HTTPProxy(
            proxy_url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=b"/"
            ),
            proxy_auth=auth,
            ssl_context=self._ssl_context,
            **limits,
        )

    def _pool_for(self, url: httpx.URL) -> httpcore.ConnectionPool:
        proxy = environment_proxy(url, self._proxies)
        if proxy is None:
            return self._pool
        pool = self._proxied.get(proxy)
        if pool is None:
            pool = self._proxied[proxy] = self._new_pool(proxy)
        return pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = self._pool_for(request.url).handle_request(core_request)
        except Exception as exc:
            _raise_mapped(exc)
        stream = cast(Iterable[bytes], response.stream)  # the sync pool's: an iterable
        headers = httpx.Headers(response.headers)
        network = response.extensions.get("network_stream")
        return httpx.Response(
            status_code=response.status,
            headers=headers,
            stream=_Body(stream, network, headers),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()
        for pool in self._proxied.values():
            pool.close()
