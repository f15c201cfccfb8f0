"""The README's tour, checked in a real Arize Phoenix: ``retrieval-stage serve`` in one process,
``retrieval-stage demo --endpoint`` in another, both exporting to Phoenix; Phoenix then holds
one trace from the pipeline through the server's model batch.

Phoenix is the session's (`tests.phoenix_server`, ``.venv-phoenix``; these tests skip where it
is not installed). The server runs the lexical reranker so that the test needs no model
load; the trace's shape is the same for every reranker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

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
