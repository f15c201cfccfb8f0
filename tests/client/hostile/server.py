"""A small hostile HTTP/1.1 server on loopback: each request is answered by a script.

The rerank clients must survive servers that lie about framing, inflate, trickle, redirect and
echo. WireMock cannot send most of that (a gzip bomb, an endless chunked body, a header line of
raw bytes), so this server speaks HTTP by hand on a plain socket: a `Handler` gets the parsed
request and the connection and writes whatever bytes it likes. One thread per connection;
`close()` ends them all. Used in-process by the tests and inside a child process by
`tests/client/hostile/child.py` (where memory is measured).
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HostileServer",
    "Request",
    "deflate_bomb_member",
    "gzip_bomb",
    "json_response",
    "raw_response",
    "serve",
]


@dataclass
class Request:
    """What the client sent: request line, lower-cased headers, body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Request, socket.socket], None]


@dataclass
class HostileServer:
    """Listens on 127.0.0.1; `handler` answers every request; `requests` records them."""

    handler: Handler
    requests: list[Request] = field(default_factory=list)
    keep_alive: bool = False
    url: str = field(init=False)
    _sock: socket.socket = field(init=False)
    _conns: list[socket.socket] = field(default_factory=list, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with suppress(OSError), conn:
            buffer = b""
            while not self._closed:
                request, buffer = _read_request(conn, buffer)
                if request is None:
                    return
                self.requests.append(request)
                self.handler(request, conn)
                if not self.keep_alive:
                    with suppress(OSError):
                        conn.shutdown(socket.SHUT_WR)
                    return

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        for conn in self._conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                conn.close()


def _read_request(conn: socket.socket, buffer: bytes) -> tuple[Request | None, bytes]:
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        buffer += chunk
    head, buffer = buffer.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(buffer) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        buffer += chunk
    body, buffer = buffer[:length], buffer[length:]
    return Request(method, path, headers, body), buffer


@contextmanager
def serve(handler: Handler, *, keep_alive: bool = False) -> Iterator[HostileServer]:
    server = HostileServer(handler, keep_alive=keep_alive)
    try:
        yield server
    finally:
        server.close()


def raw_response(
    status: int | str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    *,
    content_length: bool = True,
) -> bytes:
    """The bytes of one response; `status` may be a whole status line's tail (``"200 OK"``)."""
    line = f"HTTP/1.1 {status} X" if isinstance(status, int) else f"HTTP/1.1 {status}"
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    if content_length and not any(k.lower() == "content-length" for k, _ in pairs):
        pairs.append(("Content-Length", str(len(body))))
    head = "\r\n".join([line, *(f"{k}: {v}" for k, v in pairs)]) + "\r\n\r\n"
    return head.encode("latin-1") + body


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    return raw_response(
        status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(body).encode()
    )


def deflate_bomb_member(decoded: int) -> bytes:
    """One gzip member inflating to about `decoded` zero bytes (about 1,000:1), built in a
    blink: after a full flush the compressor's state is reset, so every further MiB of zeros
    compresses to the same bytes, which are repeated. Its CRC is wrong: a decoder notices only
    after inflating everything, which is the point."""
    chunk = 1 << 20
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = comp.compress(b"\0" * chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    unit = comp.compress(b"\0" * chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    return head + unit * max(decoded // chunk - 2, 0) + comp.flush()


def gzip_bomb(decoded: int, *, layers: int = 1) -> bytes:
    """Gzip data inflating to `decoded` zero bytes; `layers=2` gzips the result again (a
    ``Content-Encoding: gzip, gzip`` body: a few KB for gigabytes)."""
    data = deflate_bomb_member(decoded)
    for _ in range(layers - 1):
        data = gzip.compress(data, 9)
    return data


def send_slowly(conn: socket.socket, data: bytes, *, every: float, step: int = 1) -> None:
    """Send `data` `step` bytes at a time, one step every `every` seconds (a slowloris)."""
    for i in range(0, len(data), step):
        conn.sendall(data[i : i + step])
        time.sleep(every)
