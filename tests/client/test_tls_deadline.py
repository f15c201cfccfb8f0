"""The sync client's deadline holds over HTTPS, against a server that trickles its headers.

Each byte arrives well inside httpx's per-read timeout, so only `DeadlineTransport` (every
socket operation capped at the call's time left, through the TLS stream too) ends the call.
The certificate is made by the test (`trustme`); nothing leaves loopback.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import trustme

from retrieval_stage import RerankClient, RerankTransportError
from retrieval_stage.client.deadline_io import DeadlineTransport

DEADLINE_S = 1.0
MARGIN_S = 5.0
"""Generous: a loaded 2-core machine may be slow to notice, but not by the trickle's length."""
TRICKLE_S = 30.0


@pytest.fixture
def tls_trickler() -> Iterator[tuple[str, ssl.SSLContext]]:
    """An HTTPS server that answers one header byte every 0.1 s for `TRICKLE_S` seconds."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except OSError:
                continue
            try:
                with server_ctx.wrap_socket(raw, server_side=True) as conn:
                    conn.recv(65536)
                    ends = time.monotonic() + TRICKLE_S
                    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                        if stop.is_set() or time.monotonic() > ends:
                            break
                        conn.sendall(bytes([byte]))
                        time.sleep(0.1)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{port}", client_ctx
    stop.set()
    thread.join(timeout=5)
    listener.close()


def test_the_sync_deadline_holds_over_https_against_trickled_headers(
    tls_trickler: tuple[str, ssl.SSLContext],
) -> None:
    url, ctx = tls_trickler
    http = httpx.Client(transport=DeadlineTransport(ssl_context=ctx))
    started = time.monotonic()
    with (
        RerankClient(url, timeout=DEADLINE_S, http_client=http, max_retries=0) as client,
        pytest.raises(RerankTransportError, match="no answer within the 1 s deadline"),
    ):
        client.rerank("q", ["a"])
    assert time.monotonic() - started < DEADLINE_S + MARGIN_S
    http.close()
