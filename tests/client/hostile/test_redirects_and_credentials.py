"""Credentials never leave for another origin, and never sit in a URL a logger can print
(issue 23, cases 4 and 6).

Before: a caller's own ``http_client`` with ``follow_redirects=True`` sent the key in
``apikey``/``X-Api-Key`` to whatever origin a 30x named (httpx strips only ``Authorization``),
in clear text after an https-to-http redirect; and ``http://user:password@host`` endpoints put
the password in httpx's own INFO line ``HTTP Request: POST http://user:password@...`` on every
call, and silently replaced an ``Authorization: Bearer`` key.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket

import httpx
import pytest

from retrieval_stage import AsyncRerankClient, RerankClient, RerankStatusError
from retrieval_stage.validate import InvalidSetting
from tests.client.hostile.echo import DOCS, KEY, leaked
from tests.client.hostile.server import Request, json_response, raw_response, serve


def _ok(request: Request, conn: socket.socket) -> None:
    n = len(request.json()["texts"])
    conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))


def _redirect_to(target: str, status: int = 307) -> object:
    def handler(request: Request, conn: socket.socket) -> None:
        location = f"{target}/rerank?token=SECRETQUERY#frag"
        conn.sendall(raw_response(status, {"Location": location}, b""))

    return handler


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("header", ["apikey", "X-Api-Key", "Authorization"])
def test_a_redirect_is_never_followed_with_the_key(status: int, header: str) -> None:
    with serve(_ok) as elsewhere, serve(_redirect_to(elsewhere.url, status)) as origin:  # type: ignore[arg-type]
        own = httpx.Client(follow_redirects=True)
        client = RerankClient(origin.url, api_key=KEY, api_key_header=header, http_client=own)
        with own, pytest.raises(RerankStatusError) as info:
            client.rerank("q", DOCS)
    assert not elsewhere.requests, "the other origin was reached"
    exc = info.value
    assert exc.status_code == status
    message = str(exc)
    assert f"{elsewhere.url}/rerank" in message, message  # says where it pointed ...
    assert "SECRETQUERY" not in message  # ... without the query
    assert "frag" not in message


def test_the_async_client_never_follows_a_redirect_with_the_key() -> None:
    async def main(origin: str) -> BaseException | None:
        async with httpx.AsyncClient(follow_redirects=True) as own:
            client = AsyncRerankClient(origin, api_key=KEY, http_client=own)
            try:
                await client.rerank("q", DOCS)
            except RerankStatusError as exc:
                return exc
        return None

    with serve(_ok) as elsewhere, serve(_redirect_to(elsewhere.url)) as origin:  # type: ignore[arg-type]
        exc = asyncio.run(main(origin.url))
    assert isinstance(exc, RerankStatusError)
    assert not elsewhere.requests
    assert "SECRETQUERY" not in str(exc)


PASSWORD = "pa55w0rd-Zq81x"


def test_url_credentials_are_sent_as_basic_auth_and_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve(_ok) as server:
        url = server.url.replace("http://", f"http://user:{PASSWORD}@")
        with caplog.at_level(logging.DEBUG), RerankClient(url) as client:
            client.rerank("q", DOCS)
            assert PASSWORD not in repr(client)
        (request,) = server.requests
    expected = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert request.headers["authorization"] == f"Basic {expected}"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP Request" in logged  # httpx did log the request line ...
    assert PASSWORD not in logged  # ... without the password


def test_url_credentials_that_would_replace_a_bearer_key_are_refused() -> None:
    with pytest.raises(InvalidSetting) as info:
        RerankClient(
            f"http://user:{PASSWORD}@127.0.0.1:1", api_key=KEY, api_key_header="Authorization"
        )
    assert info.value.field == "base_url"
    assert PASSWORD not in str(info.value)
    assert not leaked(str(info.value))


def test_url_credentials_beside_a_gateway_key_are_both_sent() -> None:
    with serve(_ok) as server:
        url = server.url.replace("http://", f"http://user:{PASSWORD}@")
        with RerankClient(url, api_key=KEY) as client:
            client.rerank("q", DOCS)
        (request,) = server.requests
    assert request.headers["apikey"] == KEY
    assert request.headers["authorization"].startswith("Basic ")
