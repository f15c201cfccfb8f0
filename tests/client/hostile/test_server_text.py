"""Server text from anywhere but a JSON error body is cleaned too (issue 23, cases 2 and 3).

A server echoing the key, the query and a document into the ``Content-Type`` of a 2xx that is
not JSON, into a status or header line h11 refuses (its message quotes the raw bytes), into the
response's ``model`` string or into TEI's ``/info`` must get none of them into the exception,
the ``rerank.fallback`` log line, the span (status, events, attributes) or a metric point, also
with ``OPENINFERENCE_HIDE_INPUTS/OUTPUTS`` set. A half-masked key (``sk-live-7Hq2Zr8K****``)
counts as the key.
"""

from __future__ import annotations

import json
import socket

import pytest

from retrieval_stage import RerankError, RerankProtocolError
from tests.client.hostile.echo import (
    DOCS,
    ECHO,
    assert_nothing_leaked,
    call_client,
    leaked,
    observed,
    run_stage,
)
from tests.client.hostile.server import Request, json_response, raw_response, serve

FLAVOURS = ["sync", "async"]


def _content_type(request: Request, conn: socket.socket) -> None:
    conn.sendall(raw_response(200, {"Content-Type": f"text/html; x={ECHO}"}, b"<html>no</html>"))


def _status_line(request: Request, conn: socket.socket) -> None:
    conn.sendall(f"HTTP/1.1 2OO {ECHO}\r\nContent-Length: 0\r\n\r\n".encode())


def _header_line(request: Request, conn: socket.socket) -> None:
    conn.sendall(f"HTTP/1.1 200 OK\r\n{ECHO}\r\nContent-Length: 0\r\n\r\n".encode())


ECHOING = {"content-type": _content_type, "status-line": _status_line, "header": _header_line}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("where", sorted(ECHOING))
def test_an_echo_in_headers_or_status_never_reaches_the_error(flavour: str, where: str) -> None:
    with serve(ECHOING[where]) as server:
        exc = call_client(flavour, server.url)
    assert isinstance(exc, RerankError), exc
    for text in (str(exc), repr(exc)):
        assert not leaked(text), text


@pytest.mark.parametrize("hide", [False, True])
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("where", sorted(ECHOING))
def test_an_echo_in_headers_or_status_never_reaches_logs_or_spans(
    flavour: str, where: str, hide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if hide:
        monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
        monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    with serve(ECHOING[where]) as server, observed() as seen:
        outputs = run_stage(flavour, server.url, seen)
    assert [o.candidate.text for o in outputs] == DOCS  # fell back to recall order
    assert any(e["event"] == "rerank.fallback" for e in seen["logs"])
    assert_nothing_leaked(seen, inputs_shown=not hide)


MODEL_CAP = 256
"""No model name we record may be longer than this (the client caps it well below)."""


def _model_echo(request: Request, conn: socket.socket) -> None:
    n = len(request.json()["documents"])
    results = [{"index": i, "relevance_score": 1.0 - i / 10} for i in range(n)]
    conn.sendall(json_response({"model": ECHO + "x" * 100_000, "results": results}))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_servers_model_string_is_cleaned_and_capped(flavour: str) -> None:
    with serve(_model_echo) as server, observed() as seen:
        outputs = run_stage(flavour, server.url, seen, provider="vllm")
    assert len(outputs) == len(DOCS)
    assert_nothing_leaked(seen)
    (span,) = seen["spans"]
    model = str((span.attributes or {}).get("reranker.model_name", ""))
    assert len(model) <= MODEL_CAP


def _new_model_each_time() -> object:
    count = iter(range(10**9))

    def handler(request: Request, conn: socket.socket) -> None:
        n = len(request.json()["documents"])
        results = [{"index": i, "relevance_score": 0.5} for i in range(n)]
        conn.sendall(json_response({"model": f"model-{next(count)}", "results": results}))

    return handler


def test_the_metric_model_attribute_never_takes_the_servers_string() -> None:
    """A new model name per answer would be unbounded metric cardinality: the metric's model
    comes from configuration, never from the response."""
    with serve(_new_model_each_time(), keep_alive=True) as server, observed() as seen:  # type: ignore[arg-type]
        for _ in range(5):
            run_stage("sync", server.url, seen, provider="vllm")
    models = {m for m in seen["metrics"] if m.startswith("retrieval_stage.model=")}
    assert not any("model-" in m for m in models), models


def _info_echo(request: Request, conn: socket.socket) -> None:
    if request.path == "/info":
        conn.sendall(raw_response(200, {"Content-Type": f"text/plain; {ECHO}"}, ECHO.encode()))
        return
    n = len(request.json()["texts"])
    conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))


def _info_model_echo(request: Request, conn: socket.socket) -> None:
    if request.path == "/info":
        conn.sendall(json_response({"model_id": ECHO, "max_client_batch_size": 8}))
        return
    n = len(request.json()["texts"])
    conn.sendall(json_response([{"index": i, "score": 0.5} for i in range(n)]))


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("handler", [_info_echo, _info_model_echo], ids=["not-json", "model_id"])
def test_an_echo_in_tei_info_never_reaches_logs_spans_or_metrics(
    flavour: str, handler: object
) -> None:
    with serve(handler) as server, observed() as seen:  # type: ignore[arg-type]
        outputs = run_stage(flavour, server.url, seen, batch_size="auto")
    assert len(outputs) == len(DOCS)
    assert_nothing_leaked(seen)


def _not_json_2xx_body(request: Request, conn: socket.socket) -> None:
    body = json.dumps({"note": ECHO})[:-1].encode()  # cut: not JSON, quoted in the error
    conn.sendall(raw_response(200, {"Content-Type": "application/json"}, body))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_half_masked_key_in_a_broken_2xx_counts_as_the_key(flavour: str) -> None:
    with serve(_not_json_2xx_body) as server:
        exc = call_client(flavour, server.url)
    assert isinstance(exc, RerankProtocolError), exc
    assert not leaked(str(exc)), str(exc)
