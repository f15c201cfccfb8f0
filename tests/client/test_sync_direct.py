"""The sync client's own requests go straight to its `DeadlineTransport` (issue 26).

``httpx.Client.send``'s auth, redirect and event-hook steps were about a fifth of a sync call's CPU
and our own client uses none of them, so `RerankClient._open` hands its requests to the
transport itself. What ``Client.send`` gave is kept, and checked here against a real loopback
server: the same request on the wire (httpx's default headers under ours, the JSON body, Host
and Content-Length), cookies a server sets sent back, a closed client refused, and a caller's
own ``http_client`` still sent through its ``send`` (its event hooks run).
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from retrieval_stage import RerankClient, RerankClientClosedError
from retrieval_stage.client.deadline_io import DeadlineTransport
from retrieval_stage.client.steps import Send

from .hostile.server import Request, json_response, serve

TWO = [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]


def answer(cookie: str | None = None) -> object:
    def handler(request: Request, conn: socket.socket) -> None:
        headers = {"Set-Cookie": cookie} if cookie else None
        conn.sendall(json_response(TWO, headers=headers))

    return handler


def test_our_request_is_what_httpx_client_would_send() -> None:
    with serve(answer(), keep_alive=True) as server:
        with RerankClient(server.url, api_key="k3y") as client:
            assert client.rerank("q", ["a", "b"]) == [("b", 0.9), ("a", 0.1)]
        transport = DeadlineTransport()
        with httpx.Client(transport=transport) as http:
            client = RerankClient(server.url, api_key="k3y", http_client=http)
            client.rerank("q", ["a", "b"])  # the general path: Client.build_request + send
    ours, theirs = server.requests
    assert ours.headers == theirs.headers
    assert ours.body == theirs.body
    assert json.loads(ours.body) == {"query": "q", "texts": ["a", "b"]}
    assert ours.headers["user-agent"].startswith("python-httpx/")
    assert ours.headers["host"] == server.url.removeprefix("http://")
    assert ours.headers["apikey"] == "k3y"


def test_a_cookie_the_server_sets_is_sent_back() -> None:
    with (
        serve(answer("session=abc; Path=/"), keep_alive=True) as server,
        RerankClient(server.url) as client,
    ):
        client.rerank("q", ["a", "b"])
        client.rerank("q", ["a", "b"])
    first, second = server.requests
    assert "cookie" not in first.headers
    assert second.headers["cookie"] == "session=abc"


def test_a_client_closed_under_a_call_is_refused_as_closed() -> None:
    with serve(answer()) as server:
        client = RerankClient(server.url)
        _, call = client._begin("q", ["a"], None, None)
        client._http.close()  # as another thread closing it between two requests would
        with pytest.raises(RerankClientClosedError):
            client._send(call, Send("POST", server.url + "/rerank", {}, {"query": "q"}))
    assert server.requests == []


def test_a_callers_client_keeps_its_own_send() -> None:
    seen: list[str] = []
    with (
        serve(answer()) as server,
        httpx.Client(event_hooks={"request": [lambda r: seen.append(r.method)]}) as http,
        RerankClient(server.url, http_client=http) as client,
    ):
        client.rerank("q", ["a", "b"])
    assert seen == ["POST"]
