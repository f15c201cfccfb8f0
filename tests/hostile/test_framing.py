"""A connection that received more than its answer is never reused (issue 23, minor case).

A server (or anything between) that sends extra bytes after a short ``Content-Length`` on a
keep-alive connection: h11 keeps them buffered and, were the connection reused, hands them to
the next request as its answer. Before, 1 call in 6 got another call's scores.
"""

from __future__ import annotations

import json
import socket

from retrieval_stage import RerankClient
from tests.hostile.server import Request, raw_response, serve

REAL = [{"index": 0, "score": 0.9}, {"index": 1, "score": 0.1}]
SMUGGLED = [{"index": 0, "score": 0.1}, {"index": 1, "score": 0.9}]


def _smuggling(request: Request, conn: socket.socket) -> None:
    real = json.dumps(REAL).encode()
    smuggled = raw_response(
        200, {"Content-Type": "application/json"}, json.dumps(SMUGGLED).encode()
    )
    head = {"Content-Type": "application/json", "Content-Length": str(len(real))}
    conn.sendall(raw_response(200, head, real) + smuggled)  # one write: one packet


def test_extra_bytes_after_the_body_never_answer_the_next_call() -> None:
    with serve(_smuggling, keep_alive=True) as server, RerankClient(server.url) as client:
        answers = [client.rerank("q", ["a", "b"]) for _ in range(6)]
        assert len(server.requests) == 6  # every call reached the server: none was answered
    assert all(a == [("a", 0.9), ("b", 0.1)] for a in answers), answers  # by the smuggled bytes
