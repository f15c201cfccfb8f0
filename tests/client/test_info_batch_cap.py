"""The batch cap comes from the server's ``GET /info`` (issue 51), against real servers.

A TEI client with the default ``batch_size`` plans with 32 (TEI's default cap) only until it
has read ``/info``: it asks once per client, on its first call larger than 32 texts (or its first
traced call without a model, for the model's name), and then sends as many texts per request
as ``max_client_batch_size`` allows. So 50 candidates against ``retrieval-stage serve``, which
advertises 128, are one request, not 32 + 18. A smaller advertised cap still splits, a refusal
("maximum allowed batch size N") still teaches a smaller one, and an explicit ``batch_size`` is
never raised. The servers are `serve`'s own app on uvicorn in this process (the lexical
reranker: no model), wrapped in a journal of every request it received, and, for a refusal
below the advertised cap, a scripted loopback server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, RerankClient
from retrieval_stage.models import RerankResponse

from .hostile.server import Request, json_response, serve

pytest.importorskip("uvicorn", reason="`serve` needs the [server] extra")

from retrieval_stage.server import ServerSettings, create_app

from ..server.served import running_in_process

QUERY = "delete a directory tree"
TEXTS = [f"text {i}: {'delete a directory' if i % 7 == 0 else 'bananas'} {i}" for i in range(50)]
Spans = tuple[TracerProvider, InMemorySpanExporter]


class Journal:
    """An ASGI wrapper keeping (method, path, number of texts) of every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int | None]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Kept before the app answers (a GET at once, a POST once its body is in), so the
        # journal is complete when the client has its response.
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            self.seen.append((scope["method"], scope["path"], None))
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def kept() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    texts = len(json.loads(b"".join(chunks))["texts"])
                    self.seen.append((scope["method"], scope["path"], texts))
            return message

        await self.app(scope, kept, send)

    def take(self) -> list[tuple[str, str, int | None]]:
        seen, self.seen = self.seen, []
        return seen


@pytest.fixture(scope="module", params=[128, 32], ids=["cap128", "cap32"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Journal, int]]:
    """`serve`'s app with the lexical reranker and ``--max-client-batch-size`` 128 (its
    default) or 32 (TEI's); its URL, its journal and the cap."""
    cap: int = request.param
    journal = Journal(create_app(ServerSettings(reranker="lexical", max_client_batch_size=cap)))
    with running_in_process(journal) as url:
        journal.take()
        yield url, journal, cap


def calls(
    flavour: str, url: str, batches: list[list[str]], **client_kw: Any
) -> tuple[list[RerankResponse[str]], int]:
    """Each list of texts reranked in turn by one client of `flavour`; the responses and the
    client's batch size at the end."""
    if flavour == "sync":
        with RerankClient(url, **client_kw) as client:
            return [client.rerank_response(QUERY, texts) for texts in batches], client.batch_size

    async def run() -> tuple[list[RerankResponse[str]], int]:
        async with AsyncRerankClient(url, **client_kw) as client:
            done = [await client.rerank_response(QUERY, texts) for texts in batches]
            return done, client.batch_size

    return asyncio.run(run())


def every_text_scored_once(response: RerankResponse[str], texts: list[str]) -> None:
    assert sorted(t for t, _ in response.results) == sorted(texts)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_50_texts_are_one_request_when_info_allows_128_and_split_at_32_when_it_says_32(
    served: tuple[str, Journal, int], flavour: str
) -> None:
    url, journal, cap = served
    with capture_logs() as logs:
        (response, again), batch_size = calls(flavour, url, [TEXTS, TEXTS])

    assert batch_size == cap
    assert journal.take()[0] == ("GET", "/info", None)
    for r in (response, again):
        every_text_scored_once(r, TEXTS)
    if cap == 128:
        assert (response.requests, again.requests) == (1, 1)
    else:
        assert (response.requests, again.requests) == (2, 2)
    assert [
        e for e in logs if e["event"] in ("rerank.batch_split", "rerank.info_unavailable")
    ] == []


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_wire_holds_one_info_then_requests_of_the_advertised_cap(
    served: tuple[str, Journal, int], flavour: str
) -> None:
    url, journal, cap = served
    calls(flavour, url, [TEXTS[:10], TEXTS, TEXTS])
    seen = journal.take()
    # The 10-text call fits TEI's default: nothing to ask. The first 50-text call asks once.
    assert seen[0] == ("POST", "/rerank", 10)
    assert seen[1] == ("GET", "/info", None)
    posts = sorted((n for method, _, n in seen[2:] if method == "POST"), reverse=True)
    assert posts == ([50, 50] if cap == 128 else [32, 32, 18, 18])
    assert [s for s in seen[2:] if s[0] != "POST"] == []


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_an_explicit_batch_size_is_never_raised_by_info_and_asks_nothing_untraced(
    served: tuple[str, Journal, int], flavour: str
) -> None:
    url, journal, _ = served
    (response,), batch_size = calls(flavour, url, [TEXTS], batch_size=16)
    assert batch_size == 16
    assert response.requests == 4
    seen = journal.take()
    assert sorted(n for _, _, n in seen) == [2, 16, 16, 16]  # type: ignore[type-var]
    assert all(path == "/rerank" for _, path, _ in seen)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_traced_call_reads_info_for_the_model_and_its_cap_only_lowers_an_explicit_size(
    served: tuple[str, Journal, int], flavour: str, spans: Spans
) -> None:
    """The model question's answer carries the cap: an explicit 16 stays 16 against a server
    allowing 128, and an explicit 64 is lowered to a server's 32 before any refusal."""
    url, journal, cap = served
    explicit = 16 if cap == 128 else 64
    tracer = spans[0].get_tracer("caller")
    with tracer.start_as_current_span("caller"):
        (response,), batch_size = calls(flavour, url, [TEXTS], batch_size=explicit)
    assert batch_size == min(explicit, cap)
    seen = journal.take()
    assert seen[0] == ("GET", "/info", None)
    sizes = sorted(n for _, _, n in seen[1:])  # type: ignore[type-var]
    assert sizes == ([2, 16, 16, 16] if cap == 128 else [18, 32])
    assert response.model is not None
    every_text_scored_once(response, TEXTS)


def _info_128_refusing_above_20(request: Request, conn: socket.socket) -> None:
    """A TEI whose ``/info`` says 128 behind something that refuses more than 20 texts."""
    if request.method == "GET" and request.path == "/info":
        conn.sendall(json_response({"model_id": "m", "max_client_batch_size": 128}))
        return
    n = len(request.json()["texts"])
    if n > 20:
        body = {
            "error": f"batch size {n} > maximum allowed batch size 20",
            "error_type": "Validation",
        }
        conn.sendall(json_response(body, status=422))
        return
    conn.sendall(json_response([{"index": i, "score": 1.0 - i / n} for i in range(n)]))


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_refusal_below_the_advertised_cap_still_splits_and_is_remembered(flavour: str) -> None:
    with serve(_info_128_refusing_above_20, keep_alive=True) as server:
        with capture_logs() as logs:
            (first, again), batch_size = calls(flavour, server.url, [TEXTS, TEXTS])
        sizes = [
            (r.method, r.path, len(r.json()["texts"]) if r.body else None) for r in server.requests
        ]
    assert batch_size == 20
    assert sizes[:2] == [("GET", "/info", None), ("POST", "/rerank", 50)]
    assert sorted(n for _, _, n in sizes[2:5]) == [10, 20, 20]  # type: ignore[type-var]
    assert sorted(n for _, _, n in sizes[5:]) == [10, 20, 20]  # type: ignore[type-var]
    assert (first.requests, again.requests) == (4, 3)
    for r in (first, again):
        every_text_scored_once(r, TEXTS)
    learned = [e for e in logs if e["event"] == "rerank.batch_size_learned"]
    assert [(e["batch_size"], e["refused"]) for e in learned] == [(20, 50)]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_an_unanswered_info_keeps_32_says_so_at_info_level_and_is_not_asked_again(
    flavour: str,
) -> None:
    def no_info(request: Request, conn: socket.socket) -> None:
        if request.method == "GET":
            conn.sendall(json_response({"error": "not found"}, status=404))
            return
        n = len(request.json()["texts"])
        conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))

    with serve(no_info, keep_alive=True) as server, capture_logs() as logs:
        (first, again), batch_size = calls(flavour, server.url, [TEXTS, TEXTS])
        methods = [r.method for r in server.requests]
    assert batch_size == 32
    assert methods.count("GET") == 1
    assert (first.requests, again.requests) == (2, 2)
    events = [e for e in logs if e["event"] == "rerank.info_unavailable"]
    assert events == [
        {
            "event": "rerank.info_unavailable",
            "provider": "tei",
            "caused_by": "HTTP 404",
            "batch_size": 32,
            "log_level": "info",
        }
    ]
