"""The async client's default HTTP I/O: one aiohttp session, every body read under a byte cap.

httpx's async pool (httpcore) scans every pooled connection for each request, and at 64
concurrent callers that scan was most of the client's CPU (issue 26); aiohttp's connector keeps
idle connections in a per-host queue. So `AsyncRerankClient` sends through aiohttp unless the
caller hands it an ``httpx.AsyncClient`` of their own.

What httpx gave the client for free is kept here on purpose: proxies from the environment
(``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY``; read when the client is made, as httpx does,
and never ``.netrc`` for the server), TLS verified against httpx's CA bundle (certifi, or
``SSL_CERT_FILE``/``SSL_CERT_DIR``), httpx's pool bounds (100 connections, idle ones kept 5 s),
no redirects followed, the same JSON bytes on the wire. Bodies are read raw
(``auto_decompress=False``) through `body.read_body`, the same bounded reader as every other
transport: gzip or deflate inflated under the cap, any other encoding refused. aiohttp's
errors become the httpx errors the flow judges (`httpx_error`), in this one place.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx

from .body import ACCEPT_ENCODING, read_body
from .codec import dumps

__all__ = [
    "AiohttpIO",
    "GuardedConnector",
    "environment_proxy",
    "httpx_error",
    "httpx_error_type",
]

# Most specific first (`ClientConnectorError` is a `ClientOSError`, `ConnectionTimeoutError` a
# `ServerTimeoutError`). Each target is what httpx's own transport raises for the same failure,
# so retry decisions, error kinds and `caused_by` read the same whichever client sent.
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
    (aiohttp.ClientHttpProxyError, httpx.ProxyError),
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerFingerprintMismatch, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientOSError, httpx.ReadError),
    (aiohttp.ClientConnectionError, httpx.ReadError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.NonHttpUrlClientError, httpx.UnsupportedProtocol),
    (asyncio.TimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientError, httpx.TransportError),
)


def httpx_error_type(cls: type[BaseException]) -> type[httpx.TransportError] | None:
    """The httpx error class standing for aiohttp's exception class `cls`, or None."""
    for source, target in _ERRORS:
        if issubclass(cls, source):
            return target
    return None


def httpx_error(exc: BaseException) -> httpx.TransportError | None:
    """The httpx error standing for aiohttp's `exc`, with its message; None for any other."""
    target = httpx_error_type(type(exc))
    return None if target is None else target(str(exc) or type(exc).__name__)


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (``NO_PROXY`` honoured), as httpx reads it."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


class GuardedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector, never handing out a pooled connection with bytes queued.

    Bytes that reach an idle pooled connection (a late second answer, unsolicited) are parsed
    and queued by aiohttp, and handed to the next request on it as its answer; the protocol
    says so through ``should_close``. Such a connection is closed at checkout and another one
    taken (`framing` says what each transport does with bytes beyond an answer).
    """

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        while True:
            conn = await super().connect(req, traces, timeout)
            protocol = conn.protocol
            if protocol is None or not protocol.should_close:
                return conn
            conn.close()  # the transport closed, its slot freed: never pooled again


class AiohttpIO:
    """One aiohttp session, opened on first use inside the running loop, closed by `aclose`."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        max_response_bytes: int,
        phase_timeouts: bool = True,
    ) -> None:
        self.max_response_bytes = max_response_bytes
        # The call's deadline bounds every request. Where it is asyncio's own timer, armed when
        # the call starts and never later than `timeout` after, aiohttp's connect and read
        # timers (armed later, as long) can never fire first: `phase_timeouts` False leaves
        # them out, and with them a timer per request that would hold the caller's context
        # (its span) in the loop's queue long after the call. Else they back the deadline up.
        self._timeout = (
            aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
            if phase_timeouts
            else aiohttp.ClientTimeout(total=None)
        )
        self._proxy = environment_proxy(base_url)
        self._ssl: ssl.SSLContext | bool = (
            httpx.create_ssl_context()
            if base_url.startswith("https:") or self._proxy is not None
            else True
        )
        self._session: aiohttp.ClientSession | None = None
        self.is_closed = False

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The context HTTPS connections are verified with (None: no HTTPS expected)."""
        return self._ssl if isinstance(self._ssl, ssl.SSLContext) else None

    def _open(self) -> aiohttp.ClientSession:
        connector = GuardedConnector(limit=100, keepalive_timeout=5.0, ssl=self._ssl)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False, trust_env=False
        )
        return self._session

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: Any
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Status, headers and the decoded body, read in full within `max_response_bytes`.

        Raises the httpx error standing for aiohttp's (`httpx_error`), or the
        `RerankProtocolError` of `body.read_body` (over the limit, an encoding not asked for).
        """
        try:
            return await self._request(method, url, headers, body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            mapped = httpx_error(exc)
            if mapped is None:  # pragma: no cover - _ERRORS ends with aiohttp.ClientError
                raise
            raise mapped from exc

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: Any
    ) -> tuple[int, Mapping[str, str], bytes]:
        session = self._session if self._session is not None else self._open()
        sent = dict(headers)
        sent["accept-encoding"] = ACCEPT_ENCODING
        data: bytes | None = None
        if body is not None:
            # httpx's encoding of `json=`, so a server (or a test's matcher) sees the same bytes.
            data = dumps(body)
            sent["content-type"] = "application/json"
        async with session.request(
            method, url, headers=sent, data=data, allow_redirects=False, proxy=self._proxy
        ) as response:
            return response.status, response.headers, await self._read(response)

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        return await read_body(
            response.headers, response.content.iter_any(), self.max_response_bytes
        )

    async def aclose(self) -> None:
        self.is_closed = True
        if self._session is not None:
            await self._session.close()
