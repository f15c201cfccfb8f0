"""One hostile scenario in a child process, so its memory can be measured and capped.

``python -m tests.client.hostile.child SCENARIO FLAVOUR [TIMEOUT]`` starts the scenario's server
in a thread, makes one call through FLAVOUR (``sync``, ``async``, ``stage``, ``astage``) and prints
one JSON line: the error's type and message (or, for the stages, whether they fell back and
why), the wall time, and how much the peak RSS grew during the call. The address space is
capped (`AS_LIMIT_BYTES`) so a regression fails with a MemoryError instead of taking a shared
machine's memory.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import time
from collections.abc import Callable

from tests.client.hostile.server import Request, gzip_bomb, raw_response, serve

AS_LIMIT_BYTES = 3 << 30
"""A ceiling on the child's address space: far above a bounded call (the interpreter, httpx and
OpenTelemetry with their thread arenas take a few hundred MB of address space), far below what
the unbounded client took (2-4 GB)."""

GIB = 1 << 30


def _gzip(layers: int) -> Callable[[Request, socket.socket], None]:
    encoding = ", ".join(["gzip"] * layers)
    body = gzip_bomb(2 * GIB, layers=layers)

    def handler(request: Request, conn: socket.socket) -> None:
        headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
        conn.sendall(raw_response(200, headers, body))

    return handler


def _br(request: Request, conn: socket.socket) -> None:
    # Brotli's own bomb needs the brotli package; what matters is that an encoding the client
    # did not ask for is refused before anything inflates it.
    headers = {"Content-Type": "application/json", "Content-Encoding": "br"}
    conn.sendall(raw_response(200, headers, b"\x1b\xff\xff\x7f" * 400))


def _big(request: Request, conn: socket.socket) -> None:
    """A plain body that says 1 GiB and sends zeros as fast as the client reads."""
    conn.sendall(raw_response(200, {"Content-Type": "application/json",
                                    "Content-Length": str(GIB)}))  # fmt: skip
    block = b"0" * 65536
    for _ in range(GIB // len(block)):
        conn.sendall(block)


def _chunked(request: Request, conn: socket.socket) -> None:
    """An endless chunked body."""
    head = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    conn.sendall(raw_response(200, head, content_length=False))
    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
    while True:
        conn.sendall(chunk)


def _many(request: Request, conn: socket.socket) -> None:
    """A 200 holding ten million results (about 230 MB) for a two-text request."""
    n = 10_000_000
    entry = b'{"index":0,"score":0.5},'
    size = 1 + len(entry) * n  # the last comma becomes the closing bracket
    conn.sendall(raw_response(200, {"Content-Type": "application/json",
                                    "Content-Length": str(size)}))  # fmt: skip
    block = b"[" + entry * 9999
    conn.sendall(block)
    sent = 9999
    while sent + 10000 < n:
        conn.sendall(entry * 10000)
        sent += 10000
    conn.sendall(entry * (n - sent - 1) + entry[:-1] + b"]")


def _bomb413(request: Request, conn: socket.socket) -> None:
    body = gzip_bomb(2 * GIB, layers=2)
    headers = {"Content-Type": "text/plain", "Content-Encoding": "gzip, gzip"}
    conn.sendall(raw_response(413, headers, body))


SCENARIOS: dict[str, Callable[[Request, socket.socket], None]] = {
    "gzip": _gzip(1),
    "gzip_gzip": _gzip(2),
    "br": _br,
    "big": _big,
    "chunked": _chunked,
    "many": _many,
    "bomb413": _bomb413,
}


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run(scenario: str, flavour: str, timeout: float) -> dict[str, object]:
    from structlog.testing import capture_logs

    from retrieval_stage import AsyncRerankClient, Candidate, RerankClient, RerankStage

    texts = ["first document", "second document", "third document", "fourth document"]
    out: dict[str, object] = {"error": None, "message": "", "fell_back": None}
    with serve(SCENARIOS[scenario]) as server:
        baseline = _peak_kib()
        started = time.monotonic()
        try:
            if flavour == "sync":
                with RerankClient(server.url, timeout=timeout, max_retries=0) as client:
                    client.rerank("query", texts)
            elif flavour == "async":

                async def main() -> None:
                    async with AsyncRerankClient(
                        server.url, timeout=timeout, max_retries=0
                    ) as client:
                        await client.rerank("query", texts)

                asyncio.run(main())
            else:
                cands = [Candidate(str(i), t, 1.0 - i / 10) for i, t in enumerate(texts)]
                with capture_logs() as logs:
                    if flavour == "stage":
                        with RerankClient(server.url, timeout=timeout, max_retries=0) as client:
                            RerankStage(client).run("query", cands)
                    else:

                        async def amain() -> None:
                            async with AsyncRerankClient(
                                server.url, timeout=timeout, max_retries=0
                            ) as client:
                                await RerankStage(client).arun("query", cands)

                        asyncio.run(amain())
                fallbacks = [e for e in logs if e["event"] == "rerank.fallback"]
                out["fell_back"] = bool(fallbacks)
                if fallbacks:
                    out["error"] = fallbacks[0]["caused_by"]
                    out["message"] = fallbacks[0]["error"]
        except BaseException as exc:
            out["error"] = type(exc).__name__
            out["message"] = str(exc)[:2000]
        out["elapsed"] = time.monotonic() - started
        out["grew_mib"] = (_peak_kib() - baseline) / 1024
    return out


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT_BYTES, AS_LIMIT_BYTES))
    name, how = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    print(json.dumps(run(name, how, seconds)))
    sys.stdout.flush()
