"""The README's tour, checked in a real Arize Phoenix: ``retrieval-stage serve`` in one process,
``retrieval-stage demo --endpoint`` in another, both exporting to Phoenix; Phoenix then holds
one trace from the pipeline through the server's model batch, with exactly one RERANKER span
(the demo's: its client's ``x-rstage-reranker`` header keeps the server's span a CHAIN). A
plain HTTP call to the same server, with no trace context, as curl sends it, shows one RERANKER
span too: the server's request span.

Phoenix is the session's (`tests.phoenix_server`, ``.venv-phoenix``; these tests skip where it
is not installed). The server runs the lexical reranker so that the test needs no model
load; the trace's shape is the same for every reranker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.phoenix_server import INGEST_SECONDS
from tests.third_party.test_phoenix import Run, _demo, _project_spans

from .served import Served, server_env, start_server

pytestmark = pytest.mark.phoenix

PROJECT = "retrieval-stage"


@pytest.fixture(scope="module")
def phoenix_server(phoenix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    env = server_env(OTEL_EXPORTER_OTLP_ENDPOINT=phoenix, OTEL_BSP_SCHEDULE_DELAY="100")
    tmp = tmp_path_factory.mktemp("phoenix-server")
    with start_server(tmp, "--reranker", "lexical", env=env) as served:
        yield served


@pytest.fixture(scope="module")
def tour(phoenix: str, phoenix_server: Served) -> tuple[Run, list[dict[str, Any]]]:
    run = _demo(phoenix, "--endpoint", phoenix_server.url)
    assert run.done.returncode == 0, run.done.stderr
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        spans = _project_spans(phoenix, PROJECT, run.trace_id)
        names = {s["name"] for s in spans}
        if {"POST /rerank", "rerank.batch"} <= names or time.monotonic() > deadline:
            return run, spans
        time.sleep(0.25)


def _named(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, f"{name}: {[s['name'] for s in spans]}"
    return found[0]


def _span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"])


def test_phoenix_shows_one_trace_from_the_pipeline_through_the_model_batch(
    tour: tuple[Run, list[dict[str, Any]]],
) -> None:
    run, spans = tour
    # The server's request span, its model batch, and the traced client's one /info question.
    assert len(spans) == run.span_count + 3, "the demo's spans and the server's three"
    chain = _named(spans, "pipeline")
    reranker = _named(spans, "rerank")
    server = _named(spans, "POST /rerank")
    batch = _named(spans, "rerank.batch")
    assert chain["parent_id"] is None
    assert chain["span_kind"] == "CHAIN"
    assert reranker["span_kind"] == "RERANKER"
    assert reranker["parent_id"] == _span_id(chain)
    assert server["parent_id"] == _span_id(reranker)
    assert batch["parent_id"] == _span_id(server)
    assert batch["attributes"]["retrieval_stage.batch.request_pairs"] == 10  # --recall-k 10
    assert server["attributes"]["retrieval_stage.documents"] == 10
    assert not any(key.startswith("reranker.") for key in server["attributes"])


def _kinds(spans: list[dict[str, Any]]) -> list[str]:
    return sorted(str(s["span_kind"]) for s in spans)


def test_our_traced_clients_call_through_serve_shows_exactly_one_reranker_span(
    tour: tuple[Run, list[dict[str, Any]]],
) -> None:
    _run, spans = tour
    # The caller's RERANKER holds the rerank; the client named it to the server's hop
    # (x-rstage-reranker), which stayed a CHAIN, as did its model batch and the client's /info
    # question: nothing "unknown".
    assert [s["name"] for s in spans if s["span_kind"] == "RERANKER"] == ["rerank"]
    assert _named(spans, "POST /rerank")["span_kind"] == "CHAIN"
    assert _named(spans, "rerank.batch")["span_kind"] == "CHAIN"
    assert _named(spans, "GET /info")["span_kind"] == "CHAIN"
    assert "UNKNOWN" not in _kinds(spans)
    assert {s["name"]: s["status_code"] for s in spans} == {s["name"]: "OK" for s in spans}


CURL_TEXTS = [
    "json.dumps serializes an object to a JSON formatted str",
    "shutil.rmtree deletes an entire directory tree",
    "os.rmdir removes an empty directory",
]


def _all_project_spans(phoenix: str) -> list[dict[str, Any]]:
    reply = httpx.get(
        f"{phoenix}/v1/projects/{PROJECT}/spans", params={"limit": 1000}, timeout=10.0
    )
    if reply.status_code == 404:
        return []
    reply.raise_for_status()
    data: list[dict[str, Any]] = reply.json()["data"]
    return data


def test_a_plain_http_call_to_serve_shows_one_reranker_span_in_phoenix(
    phoenix: str, phoenix_server: Served
) -> None:
    before = {_span_id(s) for s in _all_project_spans(phoenix)}
    # As curl sends it: no traceparent, no tracestate.
    reply = httpx.post(
        phoenix_server.url + "/rerank",
        json={"query": "remove a directory tree", "texts": CURL_TEXTS},
        timeout=30.0,
    )
    assert reply.status_code == 200
    answered = reply.json()
    assert answered[0]["index"] != 0, "out of order, so a position mix-up would show"
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        new = [s for s in _all_project_spans(phoenix) if _span_id(s) not in before]
        roots = [s for s in new if s["name"] == "POST /rerank" and s["parent_id"] is None]
        if roots:
            trace_id = roots[0]["context"]["trace_id"]
            spans = [s for s in new if s["context"]["trace_id"] == trace_id]
            if len(spans) >= 2:
                break
        assert time.monotonic() < deadline, [s["name"] for s in new]
        time.sleep(0.25)
    assert len(roots) == 1
    assert _kinds(spans) == ["CHAIN", "RERANKER"]
    server = _named(spans, "POST /rerank")
    assert server["span_kind"] == "RERANKER"
    attributes = server["attributes"]
    assert attributes["reranker.model_name"] == "lexical-coverage-proximity"
    assert attributes["reranker.top_k"] == len(CURL_TEXTS)
    for position, result in enumerate(answered):
        prefix = f"reranker.output_documents.{position}.document."
        assert attributes[prefix + "id"] == str(result["index"])
        assert attributes[prefix + "score"] == result["score"]
    assert "reranker.query" not in attributes, "no query without --trace-content"
    assert not any(text in str(spans) for text in CURL_TEXTS), "no text without --trace-content"
    batch = _named(spans, "rerank.batch")
    assert batch["span_kind"] == "CHAIN"
    assert batch["parent_id"] == _span_id(server)
