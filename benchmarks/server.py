"""A fast fake rerank server for benchmarks: raw asyncio HTTP/1.1 on loopback, no framework.

WireMock (or any framework server) would spend more per request than the client under test,
so this answers from a cache of pre-encoded bodies, with keep-alive, and does nothing else.
It runs in its own process (`python -m benchmarks.server`) so it has its own core and its own
GIL. Routes, any of them behind an optional ``/delay/<ms>`` prefix that holds the answer back:

- ``POST .../rerank``: TEI shape, a bare array ``[{"index", "score"}]`` sorted by score;
- ``POST .../v1/rerank`` and ``.../v2/rerank``: Cohere v2 shape,
  ``{"id", "results": [{"index", "relevance_score"}], "meta": {"billed_units": ...}}``, honouring
  ``top_n``;
- ``GET .../info``: TEI's info (``max_client_batch_size`` 32);
- ``POST /v1/traces``: an OTLP/HTTP sink that accepts and discards spans (counted);
- ``GET /stats``: request counts, and connections accepted, as JSON.

It listens on 127.0.0.1 only, stops when its stdin closes (its parent died or is done), after
``--max-seconds`` or after ``--max-requests``, whichever comes first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
from collections import Counter
from typing import Any

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}
_MAX_BODY = 64 * 1024 * 1024


def scores(n: int) -> list[tuple[int, float]]:
    """(index, score) for `n` texts, best first: a fixed shuffle so the order differs from input."""
    pairs = [(i, round(1.0 - ((i * 7919) % n) / n, 6)) for i in range(n)]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs


class Answers:
    """Pre-encoded response bodies, keyed by shape, text count and top_n."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int | None], bytes] = {}

    def tei(self, n: int) -> bytes:
        key = ("tei", n, None)
        body = self._cache.get(key)
        if body is None:
            body = json.dumps([{"index": i, "score": s} for i, s in scores(n)]).encode()
            self._cache[key] = body
        return body

    def cohere(self, n: int, top_n: int | None) -> bytes:
        key = ("cohere", n, top_n)
        body = self._cache.get(key)
        if body is None:
            ranked = scores(n)[: top_n if top_n and top_n > 0 else None]
            body = json.dumps(
                {
                    "id": "bench",
                    "results": [{"index": i, "relevance_score": s} for i, s in ranked],
                    "meta": {"billed_units": {"search_units": 1}},
                }
            ).encode()
            self._cache[key] = body
        return body


INFO = json.dumps(
    {
        "model_id": "bench/fake-reranker",
        "model_type": {"reranker": {}},
        "max_client_batch_size": 32,
        "max_input_length": 512,
    }
).encode()


class Server:
    """Counts, limits and the response logic shared by every connection."""

    def __init__(self, max_requests: int) -> None:
        self.answers = Answers()
        self.counts: Counter[str] = Counter()
        self.max_requests = max_requests
        self.total = 0
        self.done = asyncio.Event()

    def answer(self, method: bytes, target: bytes, body: bytes) -> tuple[int, bytes, bytes, float]:
        """(status, content-type, body, delay in seconds) for one request."""
        path = target.split(b"?", 1)[0].decode("latin-1")
        delay = 0.0
        if path.startswith("/delay/"):
            _, _, ms, rest = path.split("/", 3)
            delay = float(ms) / 1000.0
            path = "/" + rest
        self.total += 1
        if self.total >= self.max_requests:
            self.done.set()
        json_type = b"application/json"
        if path == "/v1/traces" and method == b"POST":
            self.counts["otlp"] += 1
            return 200, b"application/x-protobuf", b"", 0.0
        if path == "/stats":
            return 200, json_type, json.dumps(dict(self.counts)).encode(), 0.0
        if path.endswith("/info") and method == b"GET":
            self.counts["info"] += 1
            return 200, json_type, INFO, delay
        if method != b"POST":
            return 405, json_type, b'{"error":"method not allowed"}', 0.0
        try:
            request: Any = json.loads(body)
        except ValueError:
            return 400, json_type, b'{"error":"body is not JSON","error_type":"Validation"}', 0.0
        if path.endswith(("/v2/rerank", "/v1/rerank")):
            self.counts["cohere"] += 1
            docs = request.get("documents") or []
            top_n = request.get("top_n")
            return 200, json_type, self.answers.cohere(len(docs), top_n), delay
        if path.endswith("/rerank"):
            self.counts["tei"] += 1
            texts = request.get("texts") or []
            return 200, json_type, self.answers.tei(len(texts)), delay
        return 404, json_type, b'{"error":"no such route"}', 0.0


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: Content-Length bodies only (what clients send)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.counts["connections"] += 1  # how often clients had to open a new one

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self._one_request():
            pass

    def _one_request(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buffer[:end]).split(b"\r\n")
        method, target, _ = head[0].split(b" ", 2)
        length = 0
        close = False
        for line in head[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
            elif name == b"expect" and value.strip().lower() == b"100-continue":
                assert self.transport is not None
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length > _MAX_BODY:
            self._send(413, b"application/json", b'{"error":"too large"}', True)
            return False
        if len(self.buffer) < end + 4 + length:
            return False
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        status, kind, payload, delay = self.server.answer(method, target, body)
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._send, status, kind, payload, close)
        else:
            self._send(status, kind, payload, close)
        return True

    def _send(self, status: int, kind: bytes, payload: bytes, close: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            status,
            _REASONS.get(status, b"Error"),
            kind,
            len(payload),
            b"connection: close\r\n" if close else b"",
        )
        transport.write(head + payload)
        if close:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(port: int, max_seconds: float, max_requests: int) -> None:
    """Serve on 127.0.0.1:`port` (0 picks one) and print ``PORT <n>`` once listening."""
    loop = asyncio.get_running_loop()
    state = Server(max_requests)
    server = await loop.create_server(
        lambda: Connection(state), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed the pipe or exited
        loop.call_soon_threadsafe(state.done.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(state.done.wait(), max_seconds)
    server.close()


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m benchmarks.server [--port N] [--max-seconds S]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--max-requests", type=int, default=5_000_000)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.max_seconds, args.max_requests))


if __name__ == "__main__":
    main()
