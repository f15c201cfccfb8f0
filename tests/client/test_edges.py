"""Client edges found in review: deadlines against trickling headers, escaped key echoes,
arguments that must be refused before any I/O."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    RerankStage,
    RerankStatusError,
    RerankTransportError,
)

from ..conftest import WireMock

KEY = "abc/def+ghi"

DEADLINE = 1.0
"""The client's timeout against the trickling server."""

SCHEDULING_MARGIN = 3.0
"""Seconds allowed past a deadline for scheduling noise on a loaded two-core machine.

The trickling server takes ~9 s to finish its headers, longer than `DEADLINE` plus this
margin, so a client that waits it out still fails the bound."""


@pytest.fixture
def trickling_headers() -> Iterator[str]:
    """A loopback server that sends its response headers one line every 0.3 s, for ~9 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(10)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    for n in range(30):
                        if stop.wait(0.3):
                            return
                        conn.sendall(f"x-slow-{n}: {n}\r\n".encode())
                    conn.sendall(b"content-length: 2\r\n\r\n[]")
                except OSError:
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()
    thread.join(timeout=5)


def test_sync_deadline_holds_against_trickling_headers(trickling_headers: str) -> None:
    started = time.monotonic()
    with (
        RerankClient(trickling_headers, timeout=DEADLINE, max_retries=0) as client,
        pytest.raises(RerankTransportError),
    ):
        client.rerank("q", ["a"])
    assert time.monotonic() - started < DEADLINE + SCHEDULING_MARGIN


async def test_async_deadline_holds_against_trickling_headers(trickling_headers: str) -> None:
    started = time.monotonic()
    async with AsyncRerankClient(trickling_headers, timeout=DEADLINE, max_retries=0) as client:
        with pytest.raises(RerankTransportError):
            await client.rerank("q", ["a"])
    assert time.monotonic() - started < DEADLINE + SCHEDULING_MARGIN


def test_json_escaped_key_echo_is_redacted(wm: WireMock) -> None:
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/tei/echo/rerank"},
            "response": {
                "status": 401,
                "headers": {"Content-Type": "application/json"},
                "body": '{"message": "invalid api key abc\\/def+ghi"}',
            },
        }
    )
    with (
        RerankClient(wm.url + "/tei/echo", api_key=KEY) as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank("q", ["a"])
    assert KEY not in str(caught.value)
    assert KEY not in caught.value.server_message
    assert caught.value.server_message == "invalid api key ***"


def test_invalid_base_url_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"^base_url must be an http\(s\) URL") as caught:
        RerankClient("http://[::1")
    assert getattr(caught.value, "field", None) == "base_url"


def test_url_credentials_are_masked_in_repr_and_errors() -> None:
    client = RerankClient("https://user:s3cret@rerank.example/api")
    try:
        assert "s3cret" not in repr(client)
        assert "***@rerank.example/api" in repr(client)
    finally:
        client.close()
    with pytest.raises(ValueError, match="http") as caught:
        RerankClient("ftp://user:s3cret@host")
    assert "s3cret" not in str(caught.value)


def test_wrong_flavour_of_http_client_is_refused() -> None:
    with pytest.raises(TypeError, match="needs an Client"):
        RerankClient("http://127.0.0.1:9", http_client=httpx.AsyncClient())  # type: ignore[arg-type]


def test_lone_surrogate_is_refused_before_any_request(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei") as client:
        with pytest.raises(ValueError, match="item 1 is not valid Unicode"):
            client.rerank("q", ["fine", "bad \ud800 text"])
        with pytest.raises(ValueError, match="query is not valid Unicode"):
            client.rerank("\udfff", ["fine"])
    assert wm.requests() == []


def test_stage_keeps_the_key_out_of_span_and_logs_on_escaped_echo(wm: WireMock) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/tei/echo/rerank"},
            "response": {"status": 401, "body": '{"message": "bad key abc\\u002fdef+ghi"}'},
        }
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with RerankClient(wm.url + "/tei/echo", api_key=KEY) as client:
        out = RerankStage(client, tracer_provider=provider).run("q", [Candidate("a", "x")])
    assert [r.reranked for r in out] == [False]
    (span,) = exporter.get_finished_spans()
    assert KEY not in (span.status.description or "")
    for event in span.events:
        assert all(KEY not in str(v) for v in (event.attributes or {}).values())


def test_settings_repr_masks_url_credentials() -> None:
    from retrieval_stage.config import RerankSettings

    settings = RerankSettings(endpoint="https://user:s3cret@rerank.example")
    assert "s3cret" not in repr(settings)
    assert "***@rerank.example" in repr(settings)


def test_non_finite_timeout_is_refused() -> None:
    for bad in (float("inf"), float("nan"), 0, -1.0):
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            RerankClient("http://127.0.0.1:9", timeout=bad)


def test_illegal_api_key_header_is_refused_at_construction() -> None:
    for bad in ("bad header", "", "x:y", "new\nline"):
        with pytest.raises(ValueError, match="api_key_header must be an HTTP header name"):
            RerankClient("http://127.0.0.1:9", api_key="k", api_key_header=bad)
    RerankClient("http://127.0.0.1:9", api_key="k", api_key_header="X-Api-Key").close()


def test_query_string_in_base_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError, match="query string") as caught:
        RerankClient("http://127.0.0.1:9/api?key=s3cret")
    assert "s3cret" not in str(caught.value)
