"""Local OTLP receivers for tests: an OTLP/HTTP server and sockets that fail in chosen ways.

Everything listens on 127.0.0.1 only and is shut down by the fixture that started it.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class HttpReceiver:
    """Records each POST body by path and answers with the status configured for that path."""

    url: str
    statuses: dict[str, int] = field(default_factory=dict)
    bodies: dict[str, list[bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self, path: str) -> list[bytes]:
        with self.lock:
            return list(self.bodies.get(path, []))


@contextmanager
def http_receiver(statuses: dict[str, int] | None = None) -> Iterator[HttpReceiver]:
    """An OTLP/HTTP receiver on a free loopback port; paths not in `statuses` answer 200."""
    receiver = HttpReceiver(url="", statuses=dict(statuses or {}))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.bodies.setdefault(self.path, []).append(body)
            status = receiver.statuses.get(self.path, 200)
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


@contextmanager
def json_log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """`configure_logging` into a buffer; yields a reader of the JSON lines; restores after.

    Restores structlog's defaults and the ``opentelemetry`` loggers configure_logging touched.
    """
    import structlog

    from retrieval_stage.telemetry import configure_logging

    otel = logging.getLogger("opentelemetry")
    exporter = logging.getLogger("opentelemetry.exporter")
    saved = (list(otel.handlers), otel.level, otel.propagate, exporter.level)
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        structlog.reset_defaults()
        otel.handlers[:] = saved[0]
        otel.setLevel(saved[1])
        otel.propagate = saved[2]
        exporter.setLevel(saved[3])
