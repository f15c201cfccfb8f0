"""One deadline for every client flavour (issue 23, case 5).

A server trickling its response headers one byte at a time held the sync client 12 s (with
``HTTP_PROXY`` set) and 30 s (with a caller's ``http_client``) for a 2 s deadline. Now: the sync
client's own transport honours ``HTTP(S)_PROXY`` itself and keeps capping every socket
operation; a caller's ``httpx.Client`` built on `DeadlineTransport` gets the same cap; the
async client's cancel scope bounds every flavour. (A caller's client on httpx's own transport
cannot be capped from outside: docs/reliability.md says so.)
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from retrieval_stage import AsyncRerankClient, RerankClient, RerankTransportError
from retrieval_stage.client import DeadlineTransport
from tests.client.hostile.echo import DOCS
from tests.client.hostile.server import Request, send_slowly, serve

DEADLINE_S = 2.0
MARGIN_S = 3.0
"""Generous: a shared 2-CPU machine; the bug held the call 6-15 times the deadline."""


def _trickle(request: Request, conn: socket.socket) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Slow: " + b"a" * 400
    send_slowly(conn, head, every=0.1)


def _timed(call: object) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        call()  # type: ignore[operator]
    except Exception as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def test_the_sync_deadline_holds_through_an_environment_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serve(_trickle) as proxy:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with RerankClient("http://rerank.invalid:8080", timeout=DEADLINE_S, max_retries=0) as c:
            exc, took = _timed(lambda: c.rerank("q", DOCS))
        assert proxy.requests, "the proxy was not used"
        assert proxy.requests[0].path.startswith("http://rerank.invalid:8080/")
    assert isinstance(exc, RerankTransportError), exc
    assert took < DEADLINE_S + MARGIN_S, took


def test_the_sync_deadline_holds_with_a_callers_client_on_the_deadline_transport() -> None:
    with serve(_trickle) as server, httpx.Client(transport=DeadlineTransport()) as own:
        client = RerankClient(server.url, timeout=DEADLINE_S, max_retries=0, http_client=own)
        exc, took = _timed(lambda: client.rerank("q", DOCS))
    assert isinstance(exc, RerankTransportError), exc
    assert took < DEADLINE_S + MARGIN_S, took


def test_the_sync_deadline_holds_on_the_default_client() -> None:
    with serve(_trickle) as server, RerankClient(server.url, timeout=DEADLINE_S) as client:
        exc, took = _timed(lambda: client.rerank("q", DOCS))
    assert isinstance(exc, RerankTransportError), exc
    assert took < DEADLINE_S + MARGIN_S, took


@pytest.mark.parametrize("own", [False, True])
def test_the_async_deadline_holds_with_or_without_a_callers_client(own: bool) -> None:
    async def main(url: str) -> tuple[BaseException | None, float]:
        started = time.monotonic()
        http = httpx.AsyncClient() if own else None
        try:
            async with AsyncRerankClient(url, timeout=DEADLINE_S, http_client=http) as client:
                await client.rerank("q", DOCS)
        except Exception as exc:
            return exc, time.monotonic() - started
        finally:
            if http is not None:
                await http.aclose()
        return None, time.monotonic() - started

    with serve(_trickle) as server:
        exc, took = asyncio.run(main(server.url))
    assert isinstance(exc, RerankTransportError), exc
    assert took < DEADLINE_S + MARGIN_S, took
