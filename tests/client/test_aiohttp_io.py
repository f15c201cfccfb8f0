"""The async client's default transport (aiohttp): the promises the httpx one kept, kept.

Each test talks to a real server on loopback (a raw asyncio one here, where the test needs to
shape bytes WireMock cannot send, or the session's WireMock): the response size limit and the
encodings we refuse, proxies from the environment, TLS verified against httpx's CA bundle or
``SSL_CERT_FILE``, the deadline over HTTPS against trickled headers, `max_concurrency`, one
session for many calls, aiohttp's errors read as httpx's. The caller's own
``http_client=httpx.AsyncClient`` path is covered by the rest of the suite.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import ssl
import subprocess
import sys
import time
import tracemalloc
import weakref
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import trustme
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from retrieval_stage import (
    AsyncRerankClient,
    RerankProtocolError,
    RerankTransportError,
)
from retrieval_stage.client.aiohttp_io import httpx_error, httpx_error_type
from retrieval_stage.client.body import ACCEPT_ENCODING

from ..conftest import WireMock
from ..hooks import hooked

LIMIT = 64 * 1024
"""The client's max_response_bytes in these tests."""

TWO = [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]

DEADLINE_S = 1.0
MARGIN_S = 5.0
"""Generous: a loaded 2-core machine may be slow to notice, but not by the trickle's length."""


@dataclass
class Seen:
    """What the loopback server saw: request heads and bodies, connections, peak in flight."""

    heads: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    in_flight: int = 0
    most: int = 0


Answer = Callable[[dict[str, str], bytes, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def loopback(
    answer: Answer, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, Seen]]:
    """An HTTP/1.1 server on 127.0.0.1 (keep-alive) whose every answer `answer` writes."""
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")[1:]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (x.partition(":") for x in lines if x)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                seen.heads.append(headers)
                seen.bodies.append(body)
                seen.in_flight += 1
                seen.most = max(seen.most, seen.in_flight)
                try:
                    await answer(headers, body, writer)
                finally:
                    seen.in_flight -= 1
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    scheme = "https" if ssl_context else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


def response(body: bytes, status: int = 200, **headers: str) -> bytes:
    head = {"content-type": "application/json", "content-length": str(len(body))}
    head.update({k.replace("_", "-"): v for k, v in headers.items()})
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"HTTP/1.1 {status} X\r\n{lines}\r\n".encode() + body


def fixed(raw: bytes, delay: float = 0.0) -> Answer:
    async def answer(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        if delay:
            await asyncio.sleep(delay)
        writer.write(raw)

    return answer


def tei_scores(headers: dict[str, str], body: bytes) -> bytes:
    texts = json.loads(body)["texts"]
    return json.dumps([{"index": i, "score": 1.0 / (i + 1)} for i in range(len(texts))]).encode()


# -- the response size limit and encodings -------------------------------------------------------


def deflate_raw(data: bytes) -> bytes:
    """zlib-wrapped deflate, what ``Content-Encoding: deflate`` means."""
    return zlib.compress(data)


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", deflate_raw),
        ("identity", lambda b: b),
    ],
)
async def test_an_encoding_we_ask_for_is_decoded(
    encoding: str, encode: Callable[[bytes], bytes]
) -> None:
    raw = response(encode(json.dumps(TWO).encode()), content_encoding=encoding)
    async with (
        loopback(fixed(raw)) as (url, seen),
        AsyncRerankClient(url, max_response_bytes=LIMIT) as client,
    ):
        assert await client.rerank("q", ["a", "b"]) == [("b", 0.9), ("a", 0.1)]
    assert seen.heads[0]["accept-encoding"] == ACCEPT_ENCODING


BOMB_BYTES = LIMIT * 512
"""What a bomb inflates to: 32 MiB, 512 times the limit."""

PEAK_BYTES = LIMIT * 16
"""Python memory a refused bomb may take at its peak (tracemalloc): the cap, several times."""


def bomb(layers: int) -> bytes:
    """A valid JSON array of `BOMB_BYTES`, gzipped `layers` times (a few KB)."""
    data = b"[" + b" " * BOMB_BYTES + b"]"
    for _ in range(layers):
        data = gzip.compress(data, compresslevel=9)
    return data


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("gzip bomb", response(bomb(1), content_encoding="gzip")),
        ("plain, Content-Length over the limit", response(b"[" + b" " * LIMIT + b"]")),
        ("a 413 bomb", response(bomb(1), status=413, content_encoding="gzip")),
    ],
)
async def test_a_response_over_the_limit_is_refused_naming_it(name: str, raw: bytes) -> None:
    """Refused at the limit: never inflated (or read) past it, so memory stays bounded."""
    tracemalloc.start()
    try:
        await refused_over_the_limit(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES + len(raw), f"{name}: {peak} bytes at the peak"


async def refused_over_the_limit(raw: bytes) -> None:
    async with (
        loopback(fixed(raw)) as (url, _),
        AsyncRerankClient(url, max_response_bytes=LIMIT, max_retries=0) as client,
    ):
        with pytest.raises(RerankProtocolError, match=f"max_response_bytes={LIMIT}"):
            await client.rerank("q", ["a", "b"])


async def test_an_endless_chunked_body_is_refused_at_the_limit() -> None:
    async def endless(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        chunk = b"1000\r\n" + b" " * 0x1000 + b"\r\n"
        for _ in range(10_000):  # 40 MB if nobody stops reading
            writer.write(chunk)
            await writer.drain()

    started = time.monotonic()
    async with (
        loopback(endless) as (url, _),
        AsyncRerankClient(url, max_response_bytes=LIMIT, max_retries=0) as client,
    ):
        with pytest.raises(RerankProtocolError, match=f"max_response_bytes={LIMIT}"):
            await client.rerank("q", ["a", "b"])
    assert time.monotonic() - started < MARGIN_S


@pytest.mark.parametrize(
    ("encoding", "body"),
    [("br", b"\x1b\xff\xff\x7f" * 100), ("gzip, gzip", bomb(2))],
)
async def test_an_encoding_we_did_not_ask_for_is_refused_naming_it(
    encoding: str, body: bytes
) -> None:
    """`br`, and stacked encodings (a two-layer gzip bomb), are refused before a byte is
    decoded."""
    raw = response(body, content_encoding=encoding)
    async with loopback(fixed(raw)) as (url, _), AsyncRerankClient(url, max_retries=0) as client:
        with pytest.raises(RerankProtocolError, match=f"Content-Encoding '{encoding}'"):
            await client.rerank("q", ["a", "b"])


def test_max_response_bytes_must_be_a_positive_int() -> None:
    for bad in (0, -1, 1.5, True, "big"):
        with pytest.raises(ValueError, match="max_response_bytes") as caught:
            AsyncRerankClient("http://127.0.0.1:9", max_response_bytes=bad)  # type: ignore[arg-type]
        assert getattr(caught.value, "field", None) == "max_response_bytes"


# -- what goes on the wire -----------------------------------------------------------------------


async def test_the_request_is_httpx_s_json_with_the_trace_context(
    spans: tuple[TracerProvider, Any],
) -> None:
    """The body bytes are exactly what httpx's ``json=`` sends (a server's matcher sees no
    change), and every request carries the current span's W3C context."""
    provider, _ = spans
    texts = ["naïve café", "b"]

    async def answer(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(tei_scores(headers, body)))

    async with (
        loopback(answer) as (url, seen),
        AsyncRerankClient(url, batch_size=1, model="m") as client,
    ):
        with provider.get_tracer("t").start_as_current_span("caller") as span:
            await client.rerank("q", texts)
    expected = httpx.Request("POST", url, json={"query": "q", "texts": [texts[0]]}).content
    assert expected in seen.bodies
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert len(seen.heads) == 2
    for head in seen.heads:
        assert head["traceparent"].split("-")[1] == trace_id
        assert head["content-type"] == "application/json"


async def test_sub_batches_run_concurrently_up_to_max_concurrency() -> None:
    async def answer(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(response(tei_scores(headers, body)))

    texts = [f"t{i}" for i in range(20)]
    async with (
        loopback(answer) as (url, seen),
        AsyncRerankClient(url, batch_size=2, max_concurrency=3) as client,
    ):
        got = await client.rerank_response("q", texts)
    assert seen.most == 3
    assert got.batches == 10
    assert sorted(t for t, _ in got.results) == sorted(texts)


async def test_one_session_serves_many_calls_over_kept_alive_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []
    real_init = aiohttp.ClientSession.__init__

    def init(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        made.append("session")
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", init)

    async def answer(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(tei_scores(headers, body)))

    async with loopback(answer) as (url, seen), AsyncRerankClient(url) as client:
        for _ in range(5):
            await client.rerank("q", ["a", "b"])
    assert made == ["session"]
    assert seen.connections == 1


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="before 3.11 anyio's cancel scope holds the deadline"
)
async def test_a_finished_calls_span_is_not_held_by_the_loops_timers() -> None:
    """asyncio keeps a cancelled timer, and the context it captured, in the loop's queue until
    its time: neither the call's deadline nor aiohttp may arm one in the caller's context, or
    every traced call's span (and all it holds) outlives the call by the whole timeout."""

    async def answer(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(tei_scores(headers, body) if body else b"{}", 200 if body else 404))

    tracer = TracerProvider().get_tracer("t")
    async with loopback(answer) as (url, seen), AsyncRerankClient(url, timeout=30) as client:
        # The connection, made outside any span: the socket's reader callback keeps the
        # context it was registered in for as long as the connection lives (one per
        # connection, not one per call).
        await client.rerank("q", ["a", "b"])
        spans = []
        for _ in range(3):
            span = tracer.start_span("rerank")
            with trace.use_span(span, end_on_exit=True):
                await client.rerank("q", ["a", "b"])
            spans.append(weakref.ref(span))
        del span
        gc.collect()
        assert seen.connections == 1
        assert [ref() for ref in spans] == [None, None, None]


async def test_a_closed_client_refuses_calls() -> None:
    from retrieval_stage import RerankClientClosedError

    async with loopback(fixed(response(json.dumps(TWO).encode()))) as (url, _):
        client = AsyncRerankClient(url)
        await client.rerank("q", ["a", "b"])
        await client.aclose()
        with pytest.raises(RerankClientClosedError):
            await client.rerank("q", ["a", "b"])


# -- proxies -------------------------------------------------------------------------------------


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_the_async_client_goes_through_a_configured_proxy(
    wm: WireMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY is honoured as httpx honours it: the "proxy" is the session's WireMock,
    which serves a request for another host by its path."""
    wm.stub_json("/proxied/rerank", TWO)
    clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", wm.url)
    async with AsyncRerankClient("http://rerank.invalid/proxied") as client:
        assert await client.rerank("q", ["a", "b"]) == [("b", 0.9), ("a", 0.1)]
    (request,) = wm.requests("/proxied/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["host"] == "rerank.invalid"


async def test_no_proxy_sends_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with (
        loopback(fixed(response(json.dumps(TWO).encode()))) as (url, seen),
        AsyncRerankClient(url) as client,
    ):
        assert await client.rerank("q", ["a", "b"]) == [("b", 0.9), ("a", 0.1)]
    assert len(seen.heads) == 1


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


async def test_tls_verification_is_on_by_default(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    raw = response(json.dumps(TWO).encode())
    async with (
        loopback(fixed(raw), server_context(ca)) as (url, seen),
        AsyncRerankClient(url, max_retries=0) as client,
    ):
        with pytest.raises(RerankTransportError, match="could not connect") as caught:
            await client.rerank("q", ["a", "b"])
    assert caught.value.kind == "connect"
    assert seen.heads == []  # no request went over the unverified connection


async def test_a_custom_ca_from_ssl_cert_file_is_trusted(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    raw = response(json.dumps(TWO).encode())
    async with (
        loopback(fixed(raw), server_context(ca)) as (url, _),
        AsyncRerankClient(url, max_retries=0) as client,
    ):
        assert await client.rerank("q", ["a", "b"]) == [("b", 0.9), ("a", 0.1)]


async def test_the_deadline_holds_over_https_against_trickled_headers(
    ca: trustme.CA, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))

    async def trickle(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 300:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)

    started = time.monotonic()
    async with (
        loopback(trickle, server_context(ca)) as (url, _),
        AsyncRerankClient(url, timeout=DEADLINE_S, max_retries=0) as client,
    ):
        with pytest.raises(RerankTransportError, match="no answer within the 1 s deadline"):
            await client.rerank("q", ["a"])
    assert time.monotonic() - started < DEADLINE_S + MARGIN_S


# -- errors --------------------------------------------------------------------------------------


async def test_a_refused_connection_is_a_connect_error() -> None:
    async with AsyncRerankClient("http://127.0.0.1:9", max_retries=0) as client:
        with pytest.raises(RerankTransportError, match="could not connect") as caught:
            await client.rerank("q", ["a"])
    assert caught.value.kind == "connect"
    assert caught.value.cause == "ConnectError"


async def test_a_server_that_closes_without_answering_is_a_remote_protocol_error() -> None:
    async def hang_up(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with (
        loopback(hang_up) as (url, seen),
        hooked(AsyncRerankClient(url, max_retries=1), random=lambda: 1.0) as client,
    ):
        with pytest.raises(RerankTransportError) as caught:
            await client.rerank("q", ["a"])
    assert caught.value.cause == "RemoteProtocolError"
    assert len(seen.heads) == 2  # retried once, as the httpx client retries it


def test_every_aiohttp_client_error_has_a_specific_httpx_twin() -> None:
    """A new aiohttp exception class falls through to the generic `TransportError` (not
    retried); this fails loudly so it gets a deliberate mapping instead."""

    def subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
        found = set(cls.__subclasses__())
        for sub in list(found):
            found |= subclasses(sub)
        return found

    deliberate = (
        aiohttp.UploadAbortedError,  # a request body stream: we send bytes
        aiohttp.RedirectClientError,  # redirects are never followed
        aiohttp.WSServerHandshakeError,  # websockets are never opened
    )
    for cls in subclasses(aiohttp.ClientError):
        if issubclass(cls, deliberate) or not cls.__module__.startswith("aiohttp"):
            continue
        assert httpx_error_type(cls) not in (None, httpx.TransportError), cls


def test_error_classes_map_to_what_httpx_raises() -> None:
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    cases: list[tuple[BaseException, type[httpx.TransportError]]] = [
        (aiohttp.ClientConnectorError(key, OSError(111, "refused")), httpx.ConnectError),
        (aiohttp.ConnectionTimeoutError("connect"), httpx.ConnectTimeout),
        (aiohttp.SocketTimeoutError("read"), httpx.ReadTimeout),
        (aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError("bad chunk"), httpx.RemoteProtocolError),
        (aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
        (aiohttp.ClientProxyConnectionError(key, OSError(111, "refused")), httpx.ProxyError),
        (asyncio.TimeoutError(), httpx.ReadTimeout),
    ]
    for exc, expected in cases:
        assert type(httpx_error(exc)) is expected, exc
    assert httpx_error(ValueError("ours")) is None


def test_a_sync_only_program_never_loads_aiohttp() -> None:
    """aiohttp is imported when an async client is made, not with the package."""
    code = (
        "import sys; import retrieval_stage as r; c = r.RerankClient('http://127.0.0.1:9'); "
        "c.close(); assert 'aiohttp' not in sys.modules, 'loaded'; "
        "a = r.AsyncRerankClient('http://127.0.0.1:9'); assert 'aiohttp' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
