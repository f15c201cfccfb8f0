"""The minor cases of issue 23: baggage forwarding is said and switchable, a learned batch cap
can be forgotten."""

from __future__ import annotations

import socket

from opentelemetry import baggage, context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagate import get_global_textmap, set_global_textmap
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from retrieval_stage import RerankClient
from tests.client.hostile.server import Request, json_response, serve


def _ok(request: Request, conn: socket.socket) -> None:
    n = len(request.json()["texts"])
    conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))


def _baggage_sent(**client_kw: object) -> str | None:
    previous = get_global_textmap()
    set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    token = context.attach(baggage.set_baggage("tenant", "acme-secret-tenant"))
    try:
        with serve(_ok) as server, RerankClient(server.url, **client_kw) as client:  # type: ignore[arg-type]
            client.rerank("q", ["a", "b"])
            return server.requests[0].headers.get("baggage")
    finally:
        context.detach(token)
        set_global_textmap(previous)


def test_the_applications_baggage_is_forwarded_by_default() -> None:
    assert _baggage_sent() == "tenant=acme-secret-tenant"


def test_baggage_forwarding_can_be_switched_off() -> None:
    assert _baggage_sent(send_baggage=False) is None


def _refuse_above_one(request: Request, conn: socket.socket) -> None:
    n = len(request.json()["texts"])
    if n > 1:
        body = {"error": f"batch size {n} > maximum allowed batch size 1"}
        conn.sendall(json_response(body, status=413))
        return
    _ok(request, conn)


def test_a_learned_batch_cap_can_be_forgotten() -> None:
    with (
        serve(_refuse_above_one, keep_alive=True) as server,
        RerankClient(server.url, batch_size=8) as client,
    ):
        client.rerank("q", ["a", "b", "c"])
        assert client.batch_size == 1
        client.reset_batch_size()
        assert client.batch_size == 8
