"""The client's reads of its dependencies' undocumented state still find what they look for.

`client.framing.h11_connection` walks httpx's and httpcore's private attributes down to h11's
state machine, and `client.aiohttp_io.GuardedConnector` reads the aiohttp protocol's
``should_close``. Both are written to give up quietly when the layout differs (None, or no
guard), so a release that moves them would only show as a lost guard: these tests say it
loudly, against a real loopback server and the installed httpx, httpcore and aiohttp.
"""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import h11
import httpx

from retrieval_stage.client.aiohttp_io import GuardedConnector
from retrieval_stage.client.framing import h11_connection
from tests.client.hostile.server import Request, raw_response, serve


def _ok(request: Request, conn: socket.socket) -> None:
    conn.sendall(raw_response(200, {"Content-Type": "application/json"}, b"[]"))


def test_h11_connection_finds_h11_behind_a_sync_httpx_response() -> None:
    with serve(_ok, keep_alive=True) as server, httpx.Client() as http:
        response = http.send(http.build_request("POST", f"{server.url}/rerank"), stream=True)
        try:
            state = h11_connection(response)
        finally:
            response.close()
    assert isinstance(state, h11.Connection)
    assert state.our_role is h11.CLIENT


def test_h11_connection_finds_h11_behind_an_async_httpx_response() -> None:
    async def main() -> object:
        async with httpx.AsyncClient() as http:
            request = http.build_request("POST", f"{server.url}/rerank", content=b"{}")
            response = await http.send(request, stream=True)
            try:
                return h11_connection(response)
            finally:
                await response.aclose()

    with serve(_ok, keep_alive=True) as server:
        assert isinstance(asyncio.run(main()), h11.Connection)


def test_the_guarded_connector_reads_should_close_on_a_real_connection() -> None:
    seen: list[object] = []

    class Watching(GuardedConnector):
        async def connect(self, *args: object, **kwargs: object) -> aiohttp.connector.Connection:
            conn = await super().connect(*args, **kwargs)  # type: ignore[arg-type]
            seen.append(type(conn.protocol).__dict__.get("should_close"))
            return conn

    async def main() -> int:
        async with (
            aiohttp.ClientSession(connector=Watching()) as session,
            session.post(f"{server.url}/rerank", data=b"{}") as response,
        ):
            await response.read()
            return response.status

    with serve(_ok, keep_alive=True) as server:
        assert asyncio.run(main()) == 200
    assert len(seen) == 1
    assert isinstance(seen[0], property), "aiohttp's protocol no longer has should_close"
