"""The server on the int8 embedding model: ``/info`` says ``model_dtype`` as TEI does, and the
``rerank.batch`` spans say which precision ran, also where int8 was asked for and cannot run.

Served in process (`create_app` on uvicorn in a thread), the graph shared with the library's
tests through the session's cache directory (`tests._int8`).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage.local import int8 as int8_module
from retrieval_stage.server import ServerSettings, create_app
from retrieval_stage.spans.keys import ATTR_MODEL_PRECISION

from .._int8 import cache_home, need
from .served import running_in_process

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def served(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, InMemorySpanExporter]]:
    """A server asked for the precision the test is parametrised with (``int8-no-vnni``: int8,
    with VNNI hidden from it)."""
    asked: str = request.param
    precision = asked.removesuffix("-no-vnni")
    need(precision)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home()))
    monkeypatch.setenv("RETRIEVAL_STAGE_EMBEDDING_BACKEND", "numpy")
    if asked.endswith("-no-vnni"):
        monkeypatch.setattr(int8_module, "cpu_flags", lambda: frozenset({"avx2"}))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(ServerSettings(precision=precision, model_threads=2), tracer_provider=provider)
    try:
        with running_in_process(app, wait=120.0) as url:
            yield url, exporter
    finally:
        provider.shutdown()


def _rerank(url: str) -> list[dict[str, object]]:
    reply = httpx.post(
        url + "/rerank",
        json={"query": "sort a list", "texts": ["json.dumps", "list.sort sorts in place"]},
        headers={"traceparent": TRACEPARENT},
        timeout=60.0,
    )
    assert reply.status_code == 200
    body: list[dict[str, object]] = reply.json()
    return body


def _batch_precision(exporter: InMemorySpanExporter) -> object:
    (batch,) = [s for s in exporter.get_finished_spans() if s.name == "rerank.batch"]
    assert batch.attributes is not None
    return batch.attributes.get(ATTR_MODEL_PRECISION)


@pytest.mark.parametrize(
    ("served", "dtype"), [("int8", "int8"), ("bf16", "bfloat16")], indirect=["served"]
)
def test_info_says_the_precision_in_teis_model_dtype_and_the_batch_span_says_it_ran(
    served: tuple[str, InMemorySpanExporter], dtype: str
) -> None:
    url, exporter = served
    assert httpx.get(url + "/info", timeout=10.0).json()["model_dtype"] == dtype
    assert _rerank(url)[0]["index"] == 1
    assert _batch_precision(exporter) == {"int8": "int8", "bfloat16": "bf16"}[dtype]


@pytest.mark.parametrize("served", ["int8-no-vnni"], indirect=True)
def test_where_int8_cannot_run_the_server_serves_float32_and_says_so(
    served: tuple[str, InMemorySpanExporter],
) -> None:
    url, exporter = served
    assert httpx.get(url + "/info", timeout=10.0).json()["model_dtype"] == "float32"
    assert _rerank(url)[0]["index"] == 1
    assert _batch_precision(exporter) == "fp32"


def test_precision_is_refused_for_a_model_it_does_not_apply_to() -> None:
    with pytest.raises(ValueError, match="embedding reranker only"):
        ServerSettings(reranker="lexical", precision="int8")
    with pytest.raises(ValueError, match="precision must be one of fp32, int8, bf16"):
        ServerSettings(precision="fp16")
