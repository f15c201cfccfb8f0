"""A connection that received more than its answer is never reused (issue 23, minor case).

A server (or anything between) that sends extra bytes after a short ``Content-Length`` on a
keep-alive connection: h11 keeps them buffered and aiohttp queues them as a parsed message;
were the connection reused, they would be the next request's answer. Before, 1 call in 6 got
another call's scores through a caller's own httpx client, sync or async. Every client flavour
is tried: the sync client's own transport, a caller's ``httpx.Client``, the async client's
aiohttp, a caller's ``httpx.AsyncClient``.

Each call sends texts naming the call, and the server answers each with scores naming the same
call; the smuggled answer names another call. A call whose scores name another call got
someone else's answer. The loopback server is `tests.client.hostile.server` (plain sockets, one
thread per connection), so its accept count says whether a connection was reused.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from retrieval_stage import AsyncRerankClient, RerankClient, RerankError, RerankTransportError
from tests.client.hostile.server import Request, raw_response, serve

CALLS = 6
FOREIGN = 1000  # the smuggled answer's scores name call i + FOREIGN
FLAVOURS = ["sync", "sync, own httpx.Client", "async (aiohttp)", "async, own httpx.AsyncClient"]
# A wait that only a hung test would reach (the server thread blocks on the test's signal).
SIGNAL_WAIT_S = 10.0


def _texts(i: int) -> list[str]:
    return [f"call {i} a", f"call {i} b"]


def _call_of(request: Request) -> int:
    return int(request.json()["texts"][0].split()[1])


def _scores(i: int) -> bytes:
    """The answer for call i: document 0 scores 0.5 + i/10^4, document 1 scores 0.1."""
    return json.dumps([{"index": 0, "score": 0.5 + i / 1e4}, {"index": 1, "score": 0.1}]).encode()


def _answer(i: int) -> bytes:
    return raw_response(200, {"Content-Type": "application/json"}, _scores(i))


def _smuggling(request: Request, conn: socket.socket) -> None:
    """The real answer with a Content-Length that ends it, then a whole second answer naming
    another call, in one write (one packet)."""
    i = _call_of(request)
    conn.sendall(_answer(i) + _answer(i + FOREIGN))


Call = Callable[[int], Awaitable[list[tuple[str, float]]]]


@contextmanager
def _sync_client(flavour: str, url: str) -> Iterator[RerankClient]:
    with ExitStack() as stack:
        http = stack.enter_context(httpx.Client()) if "own" in flavour else None
        yield stack.enter_context(RerankClient(url, max_retries=0, http_client=http))


async def _run(flavour: str, url: str, body: Callable[[Call], Awaitable[Any]]) -> Any:
    """Runs `body` with a call function of the flavour's client (sync ones in this thread:
    their calls are sequential, and the hostile server answers from its own threads)."""
    if flavour.startswith("sync"):
        with _sync_client(flavour, url) as client:

            async def sync_call(i: int) -> list[tuple[str, float]]:
                return client.rerank("q", _texts(i))

            return await body(sync_call)
    async with AsyncExitStack() as stack:
        http = None
        if "own" in flavour:
            http = await stack.enter_async_context(httpx.AsyncClient())
        aclient = await stack.enter_async_context(
            AsyncRerankClient(url, max_retries=0, http_client=http)
        )

        async def async_call(i: int) -> list[tuple[str, float]]:
            return await aclient.rerank("q", _texts(i))

        return await body(async_call)


def _own_scores(i: int, answer: list[tuple[str, float]]) -> bool:
    return answer == [(_texts(i)[0], 0.5 + i / 1e4), (_texts(i)[1], 0.1)]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_extra_bytes_after_a_short_content_length_never_answer_the_next_call(
    flavour: str,
) -> None:
    async def calls(call: Call) -> list[list[tuple[str, float]]]:
        return [await call(i) for i in range(CALLS)]

    with serve(_smuggling, keep_alive=True) as server:
        answers = asyncio.run(_run(flavour, server.url, calls))
        assert len(server.requests) == CALLS  # every call reached the server: none was
        # answered by the smuggled bytes, and no connection that had them was used again
        assert len(server._conns) == CALLS
    wrong = [i for i, a in enumerate(answers) if not _own_scores(i, a)]
    assert not wrong, (wrong, answers)


@pytest.mark.parametrize("flavour", [f for f in FLAVOURS if f.startswith("async")])
def test_concurrent_calls_on_a_smuggling_server_each_get_their_own_scores(flavour: str) -> None:
    async def calls(call: Call) -> list[list[tuple[str, float]]]:
        return list(await asyncio.gather(*(call(i) for i in range(3 * CALLS))))

    with serve(_smuggling, keep_alive=True) as server:
        answers = asyncio.run(_run(flavour, server.url, calls))
    wrong = [i for i, a in enumerate(answers) if not _own_scores(i, a)]
    assert not wrong, (wrong, answers)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_second_answer_arriving_on_an_idle_connection_is_never_taken(flavour: str) -> None:
    """The smuggled answer comes after the real one was read and the connection pooled: aiohttp
    parses it and queues it on the idle connection; httpcore sees a readable idle socket."""
    late, sent = threading.Event(), threading.Event()

    def late_smuggler(request: Request, conn: socket.socket) -> None:
        i = _call_of(request)
        conn.sendall(_answer(i))
        if i == 0:  # only the first connection sends a late second answer
            late.wait(SIGNAL_WAIT_S)
            conn.sendall(_answer(i + FOREIGN))
            sent.set()

    async def calls(call: Call) -> list[list[tuple[str, float]]]:
        first = await call(0)
        late.set()
        await asyncio.to_thread(sent.wait, SIGNAL_WAIT_S)
        for _ in range(3):  # let the loop read what the idle connection received
            await asyncio.sleep(0)
        return [first, *[await call(i) for i in range(1, CALLS)]]

    with serve(late_smuggler, keep_alive=True) as server:
        answers = asyncio.run(_run(flavour, server.url, calls))
        assert len(server.requests) == CALLS
    wrong = [i for i, a in enumerate(answers) if not _own_scores(i, a)]
    assert not wrong, (wrong, answers)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_body_shorter_than_its_content_length_fails_typed_and_its_connection_is_dropped(
    flavour: str,
) -> None:
    """The first answer promises more bytes than it sends, then the server ends its side: a
    typed error for that call, and the next call is answered on a new connection."""

    def short(request: Request, conn: socket.socket) -> None:
        i = _call_of(request)
        body = _scores(i)
        if i == 0:
            head = {"Content-Type": "application/json", "Content-Length": str(len(body) + 40)}
            conn.sendall(raw_response(200, head, body))
            conn.shutdown(socket.SHUT_WR)
            return
        conn.sendall(_answer(i))

    async def calls(call: Call) -> tuple[BaseException | None, list[list[tuple[str, float]]]]:
        error: BaseException | None = None
        try:
            await call(0)
        except RerankError as exc:
            error = exc
        return error, [await call(i) for i in range(1, CALLS)]

    with serve(short, keep_alive=True) as server:
        error, answers = asyncio.run(_run(flavour, server.url, calls))
        assert len(server._conns) >= 2  # the short answer's connection was not reused
    assert isinstance(error, RerankTransportError), error
    assert "call 0" not in str(error)  # (the server echoed nothing; still, no document text)
    wrong = [i for i, a in enumerate(answers, start=1) if not _own_scores(i, a)]
    assert not wrong, (wrong, answers)


class _StreamingTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """Answers call i with its own scores as a stream no h11 stands behind (as another
    transport's, e.g. httpx-aiohttp's): the guard has nothing to look at and must stay out."""

    def _response(self, request: httpx.Request) -> httpx.Response:
        body = _scores(int(json.loads(request.content)["texts"][0].split()[1]))
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        return httpx.Response(200, headers=headers, stream=_Chunks(body))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._response(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self._response(request)


class _Chunks(httpx.AsyncByteStream, httpx.SyncByteStream):
    def __init__(self, body: bytes) -> None:
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self._body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._body


def test_a_callers_client_on_another_transport_is_answered_as_before() -> None:
    transport = _StreamingTransport()
    with (
        httpx.Client(transport=transport) as http,
        RerankClient("http://rerank.test", http_client=http) as client,
    ):
        assert _own_scores(3, client.rerank("q", _texts(3)))

    async def main() -> list[tuple[str, float]]:
        async with (
            httpx.AsyncClient(transport=transport) as http,
            AsyncRerankClient("http://rerank.test", http_client=http) as aclient,
        ):
            return await aclient.rerank("q", _texts(4))

    assert _own_scores(4, asyncio.run(main()))
