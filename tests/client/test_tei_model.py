"""TEI names its model only in ``GET /info``: a client with no model configured asks it once.

So the stage's RERANKER span (and the metrics) carry ``reranker.model_name`` for TEI as for the
providers that echo their model (issue 24). Against the session's real WireMock: the question is
asked at most once per client, whatever the number of calls (sync or concurrent async), never
when a model is configured or the provider is not TEI, the batch cap in the same answer is taken
too (issue 51: tests/client/test_info_batch_cap.py), and a failed ``/info`` costs the call
nothing.
"""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, Candidate, RerankClient, RerankStage

from ..conftest import WireMock

MODEL = "BAAI/bge-reranker-base"
TEXTS = ["t0", "t1", "t2"]
ANSWER = [{"index": 2, "score": 0.9}, {"index": 0, "score": 0.5}, {"index": 1, "score": 0.1}]


def _serve(wm: WireMock, *, info: bool = True) -> str:
    wm.stub_json("/m/rerank", ANSWER)
    if info:
        wm.stub_json("/m/info", {"model_id": MODEL, "max_client_batch_size": 128}, method="GET")
    return wm.url + "/m"


def test_the_model_comes_from_info_asked_once_and_lands_on_the_span(
    wm: WireMock, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    with RerankClient(_serve(wm)) as client:
        stage = RerankStage(client, tracer_provider=provider)
        for _ in range(3):
            stage.run("q", [Candidate(t, t) for t in TEXTS])
        assert client.model_name == MODEL
        assert client.batch_size == 128  # the same answer's cap is taken too

    assert len(wm.requests("/m/info")) == 1
    assert len(wm.requests("/m/rerank")) == 3  # one batch per call
    assert [s.attributes["reranker.model_name"] for s in exporter.get_finished_spans()] == [
        MODEL
    ] * 3


def test_concurrent_first_calls_of_an_async_client_ask_once(
    wm: WireMock, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer = spans[0].get_tracer("t")

    async def main() -> list[str | None]:
        async with AsyncRerankClient(_serve(wm)) as client:
            with tracer.start_as_current_span("caller"):
                responses = await asyncio.gather(
                    *(client.rerank_response("q", TEXTS) for _ in range(5))
                )
                await client.rerank_response("q", TEXTS)
            return [r.model for r in responses]

    models = asyncio.run(main())
    assert len(wm.requests("/m/info")) == 1
    assert MODEL in models


def test_a_configured_model_or_another_provider_never_asks(wm: WireMock) -> None:
    with RerankClient(_serve(wm), model="mine") as client:
        assert client.rerank_response("q", TEXTS).model == "mine"
    wm.stub_json("/c/v2/rerank", {"results": [{"index": 0, "relevance_score": 0.5}]})
    with RerankClient(wm.url + "/c", provider="cohere", model="rerank-v3.5") as client:
        client.rerank("q", ["t0"])

    assert [r["method"] for r in wm.requests()] == ["POST", "POST"]


def test_an_untraced_call_never_asks(wm: WireMock) -> None:
    """The model name is for the span: with none recording, no ``/info`` is sent."""
    with RerankClient(_serve(wm)) as client:
        client.rerank("q", TEXTS)
        client.rerank("q", TEXTS)
    assert [r["method"] for r in wm.requests()] == ["POST", "POST"]


def test_a_failed_info_costs_the_call_nothing_and_is_not_asked_again(
    wm: WireMock, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer = spans[0].get_tracer("t")
    with (
        capture_logs() as logs,
        RerankClient(_serve(wm, info=False)) as client,
        tracer.start_as_current_span("caller"),
    ):
        first = client.rerank("q", TEXTS)
        client.rerank("q", TEXTS)
        assert client.model_name is None

    assert [t for t, _ in first] == ["t2", "t0", "t1"]
    assert len(wm.requests("/m/info")) == 1
    assert [e for e in logs if e["event"] == "rerank.model_unknown"] == [
        {
            "event": "rerank.model_unknown",
            "provider": "tei",
            "caused_by": "HTTP 404",
            "log_level": "info",
        }
    ]
