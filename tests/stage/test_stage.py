"""RerankStage: results, fallback and the exact RERANKER span, through a real WireMock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    NullReranker,
    RerankClient,
    RerankProtocolError,
    RerankStage,
    RerankStatusError,
)
from retrieval_stage.telemetry import configure_tracing
from tests.hooks import hooked

from ..conftest import WireMock
from ..fakes import ByLength

T = TypeVar("T")
Spans = tuple[TracerProvider, InMemorySpanExporter]


def two() -> list[Candidate]:
    return [
        Candidate("doc-a", "first text", 0.9, {"source": "wiki", "page": 3}),
        Candidate("doc-b", "second text", 0.4),
    ]


def only_span(exporter: InMemorySpanExporter) -> Any:
    (span,) = exporter.get_finished_spans()
    return span


def test_out_of_order_rerank_returns_the_candidates_themselves(wm: WireMock, spans: Spans) -> None:
    provider, _ = spans
    cands = two()
    with RerankClient(wm.url + "/tei/out-of-order") as client:
        out = RerankStage(client, tracer_provider=provider).run("q", cands)
    assert [r.candidate for r in out] == [cands[1], cands[0]]
    assert out[0].candidate is cands[1]
    assert [(r.score, r.input_index, r.reranked) for r in out] == [(0.97, 1, True), (0.02, 0, True)]


def test_span_has_exactly_the_openinference_reranker_attributes(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans
    with RerankClient(wm.url + "/tei/out-of-order", model="bge-reranker-base") as client:
        RerankStage(client, tracer_provider=provider, top_k=2).run("what moved?", two())
    span = only_span(exporter)
    attributes = dict(span.attributes)
    expected = {  # in the order they are set: identity, outcome, inputs, outputs
        "openinference.span.kind": "RERANKER",
        "reranker.query": "what moved?",
        "reranker.top_k": 2,
        "retrieval_stage.provider": "tei",
        "retrieval_stage.documents": 2,
        "input.value": "what moved?",
        "input.mime_type": "text/plain",
        "retrieval_stage.fallback": False,
        "retrieval_stage.top1_changed": True,
        "retrieval_stage.requests": 1,
        "retrieval_stage.retries": 0,
        "retrieval_stage.batches": 1,
        # doc-b (recall 0.4) rose above doc-a (recall 0.9): the one pair reversed.
        "retrieval_stage.quality.kendall_tau": -1.0,
        "retrieval_stage.quality.topk_overlap": 1.0,
        "retrieval_stage.quality.max_promotion": 2,
        "retrieval_stage.quality.top_score": 0.97,
        "retrieval_stage.quality.score_margin": 0.97 - 0.02,
        # [doc-b, doc-a] against recall's [doc-a, doc-b]: X = 0, 2; 0.1/0.9 * 0.81 + 0.81.
        "retrieval_stage.quality.rbo": pytest.approx(0.9),
        "retrieval_stage.quality.score_spread": 0.97 - 0.02,
        "reranker.model_name": "bge-reranker-base",  # from the response: set at the end
        "output.value": '{"documents":[{"id":"doc-b","score":0.97},{"id":"doc-a","score":0.02}]}',
        "output.mime_type": "application/json",
        "reranker.input_documents.0.document.id": "doc-a",
        "reranker.input_documents.0.document.content": "first text",
        "reranker.input_documents.0.document.score": 0.9,
        "reranker.input_documents.0.document.metadata": '{"page": 3, "source": "wiki"}',
        "reranker.input_documents.1.document.id": "doc-b",
        "reranker.input_documents.1.document.content": "second text",
        "reranker.input_documents.1.document.score": 0.4,
        "reranker.output_documents.0.document.id": "doc-b",
        "reranker.output_documents.0.document.content": "second text",
        "reranker.output_documents.0.document.score": 0.97,
        "reranker.output_documents.1.document.id": "doc-a",
        "reranker.output_documents.1.document.content": "first text",
        "reranker.output_documents.1.document.score": 0.02,
        "reranker.output_documents.1.document.metadata": '{"page": 3, "source": "wiki"}',
    }
    assert list(attributes) == list(expected), "attributes are set in this order"
    for key, value in expected.items():
        assert attributes.pop(key) == value, key
    assert not attributes, f"unexpected attributes: {attributes}"
    assert span.name == "rerank"
    assert span.status.status_code == StatusCode.OK
    assert span.dropped_attributes == 0


def scrambled() -> list[Candidate]:
    """Candidates whose recall order (high, tie, low, none) is not their input order."""
    return [
        Candidate("low", "l", 0.1),
        Candidate("none", "n"),
        Candidate("high", "h", 0.8, {"k": 1}),
        Candidate("tie", "t", 0.8),
    ]


RECALL_ORDER = ["high", "tie", "low", "none"]

SCRAMBLED_INPUTS = {
    "reranker.input_documents.0.document.id": "low",
    "reranker.input_documents.0.document.content": "l",
    "reranker.input_documents.0.document.score": 0.1,
    "reranker.input_documents.1.document.id": "none",
    "reranker.input_documents.1.document.content": "n",
    "reranker.input_documents.2.document.id": "high",
    "reranker.input_documents.2.document.content": "h",
    "reranker.input_documents.2.document.score": 0.8,
    "reranker.input_documents.2.document.metadata": '{"k": 1}',
    "reranker.input_documents.3.document.id": "tie",
    "reranker.input_documents.3.document.content": "t",
    "reranker.input_documents.3.document.score": 0.8,
}

UNAUTHORIZED = "RerankStatusError: tei answered HTTP 401: invalid api key (Unauthorized)"


def assert_exactly(attributes: Any, expected: dict[str, Any]) -> None:
    """Pop each expected attribute, then nothing may be left: an extra one fails too."""
    left = dict(attributes)
    for key, value in expected.items():
        assert key in left, f"missing {key}"
        assert left.pop(key) == value, key
    assert not left, f"unexpected attributes: {left}"


def test_fallback_returns_recall_order_and_marks_the_span_exactly(
    wm: WireMock, spans: Spans
) -> None:
    provider, exporter = spans
    cands = scrambled()
    with RerankClient(wm.url + "/tei/unauthorized") as client:
        out = RerankStage(client, tracer_provider=provider).run("q", cands)
    assert [r.candidate.id for r in out] == RECALL_ORDER
    assert [r.input_index for r in out] == [2, 3, 0, 1]
    assert [r.score for r in out] == [0.8, 0.8, 0.1, None]
    assert not any(r.reranked for r in out)
    span = only_span(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == f"fell back to recall order: {UNAUTHORIZED}"
    assert [e.name for e in span.events] == ["exception"]
    # The reranker produced no output: no output documents, so no recall score is ever
    # shown under the reranker's "score"; output.value names the returned order as recall.
    assert_exactly(
        span.attributes,
        {
            "openinference.span.kind": "RERANKER",
            "reranker.query": "q",
            "retrieval_stage.provider": "tei",
            "retrieval_stage.documents": 4,
            "input.value": "q",
            "input.mime_type": "text/plain",
            "error.type": "RerankStatusError",
            "retrieval_stage.requests": 1,
            "retrieval_stage.retries": 0,
            "retrieval_stage.batches": 0,
            "retrieval_stage.fallback": True,
            "retrieval_stage.top1_changed": False,
            "output.value": '{"order":"recall","documents":'
            '[{"id":"high"},{"id":"tie"},{"id":"low"},{"id":"none"}]}',
            "output.mime_type": "application/json",
            **SCRAMBLED_INPUTS,
        },
    )


def test_failed_call_records_what_it_spent(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans
    wm.stub_json("/tei/down/rerank", {"error": "down", "error_type": "Unhealthy"}, status=503)
    with hooked(RerankClient(wm.url + "/tei/down", max_retries=2), random=lambda: 1.0) as client:
        with pytest.raises(RerankStatusError) as caught:
            client.rerank("q", ["A"])
        assert (caught.value.requests, caught.value.retries) == (3, 2)
        out = RerankStage(client, tracer_provider=provider).run("q", scrambled())
    assert [r.candidate.id for r in out] == RECALL_ORDER
    span = only_span(exporter)
    assert span.attributes["retrieval_stage.fallback"] is True
    assert span.attributes["retrieval_stage.requests"] == 3
    assert span.attributes["retrieval_stage.retries"] == 2
    assert [e.name for e in span.events].count("rerank.retry_scheduled") == 2


def test_on_error_raise_reraises_and_records_once_exactly(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans
    with RerankClient(wm.url + "/tei/unauthorized") as client, pytest.raises(RerankStatusError):
        RerankStage(client, tracer_provider=provider, on_error="raise").run("q", scrambled())
    span = only_span(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == UNAUTHORIZED
    assert [e.name for e in span.events] == ["exception"]
    assert_exactly(
        span.attributes,
        {
            "openinference.span.kind": "RERANKER",
            "reranker.query": "q",
            "retrieval_stage.provider": "tei",
            "retrieval_stage.documents": 4,
            "input.value": "q",
            "input.mime_type": "text/plain",
            "error.type": "RerankStatusError",
            "retrieval_stage.requests": 1,
            "retrieval_stage.retries": 0,
            "retrieval_stage.batches": 0,
            "retrieval_stage.fallback": False,
            **SCRAMBLED_INPUTS,
        },
    )


def fifty() -> list[Candidate]:
    return [
        Candidate(f"doc-{i}", f"text number {i}", round(1.0 - i / 100, 2), {"n": i})
        for i in range(50)
    ]


def reversed_scores(wm: WireMock, path: str, n: int) -> None:
    """Stub a TEI answer that ranks the last input first, sorted by score."""
    wm.stub_json(path, [{"index": i, "score": i / n} for i in reversed(range(n))])


def test_fifty_candidates_under_default_limit_keep_the_span_identity(
    wm: WireMock, spans: Spans
) -> None:
    provider, exporter = spans
    reversed_scores(wm, "/tei/fifty/rerank", 50)
    with RerankClient(wm.url + "/tei/fifty", batch_size=64, model="m") as client:
        out = RerankStage(client, tracer_provider=provider, top_k=10).run("fifty?", fifty())
    assert [r.candidate.id for r in out] == [f"doc-{i}" for i in range(49, 39, -1)]
    span = only_span(exporter)
    attributes = span.attributes
    assert span.dropped_attributes == 0
    assert len(attributes) <= 128
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["reranker.query"] == "fifty?"
    assert attributes["reranker.model_name"] == "m"
    assert attributes["reranker.top_k"] == 10
    inputs = _indices(attributes, "reranker.input_documents")
    outputs = _indices(attributes, "reranker.output_documents")
    assert inputs == list(range(len(inputs))), "inputs are kept from the head, never the tail"
    assert outputs == list(range(10)), "all ten outputs fit"
    assert attributes["retrieval_stage.input_documents.omitted"] == 50 - len(inputs)
    assert "retrieval_stage.output_documents.omitted" not in attributes
    assert attributes["reranker.output_documents.0.document.id"] == "doc-49"


def test_fifty_candidates_under_configure_tracing_keep_every_document(
    wm: WireMock,
) -> None:
    exporter = InMemorySpanExporter()
    provider = configure_tracing("test", exporter=exporter)
    reversed_scores(wm, "/tei/fifty/rerank", 50)
    with RerankClient(wm.url + "/tei/fifty", batch_size=64) as client:
        RerankStage(client, tracer_provider=provider).run("fifty?", fifty())
    provider.force_flush()
    span = only_span(exporter)
    provider.shutdown()
    attributes = span.attributes
    assert span.dropped_attributes == 0
    assert _indices(attributes, "reranker.input_documents") == list(range(50))
    assert _indices(attributes, "reranker.output_documents") == list(range(50))
    assert attributes["reranker.input_documents.7.document.id"] == "doc-7"
    assert attributes["reranker.input_documents.7.document.score"] == 0.93
    assert attributes["reranker.output_documents.7.document.id"] == "doc-42"
    assert attributes["reranker.output_documents.7.document.score"] == 42 / 50
    assert "retrieval_stage.input_documents.omitted" not in attributes


def _indices(attributes: Any, prefix: str) -> list[int]:
    found = {int(k.split(".")[2]) for k in attributes if k.startswith(prefix + ".")}
    return sorted(found)


def test_not_recording_span_builds_no_document_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    import retrieval_stage.spans.reranker as reranker_spans

    monkeypatch.setattr(reranker_spans, "outcome_plan", lambda *a, **k: calls.append(a) or {})
    provider = TracerProvider(sampler=ALWAYS_OFF)
    reranker = ByLength()
    out = RerankStage(reranker, tracer_provider=provider).run("q", fifty())
    assert reranker.calls == 1
    assert len(out) == 50
    assert calls == []


def test_user_reranker_returning_a_stranger_falls_back(spans: Spans) -> None:
    provider, exporter = spans

    class Liar:
        def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[Any, float]]:
            return [(Candidate("x", "not given"), 1.0), *((i, 0.5) for i in items[1:])]

    cands = scrambled()
    out = RerankStage(Liar(), tracer_provider=provider).run("q", cands)
    assert [r.candidate.id for r in out] == RECALL_ORDER
    span = only_span(exporter)
    assert span.attributes["error.type"] == RerankProtocolError.__name__
    assert span.status.description == (
        "fell back to recall order: RerankProtocolError: "
        "reranker result 0 is not one of the candidates given, or is returned twice"
    )


def test_empty_candidates_make_no_request_and_a_span(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans
    with RerankClient(wm.url + "/tei") as client:
        assert RerankStage(client, tracer_provider=provider).run("q", []) == []
    assert wm.requests() == []
    assert only_span(exporter).attributes["retrieval_stage.documents"] == 0


def test_bad_candidate_is_rejected_before_any_request(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei") as client, pytest.raises(TypeError, match="candidate 1"):
        RerankStage(client).run("q", [Candidate("a", "x"), {"id": "b"}])  # type: ignore[list-item]
    assert wm.requests() == []


def test_min_score_drops_low_outputs(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei/three") as client:
        out = RerankStage(client, min_score=0.0).run(
            "q", [Candidate("x", "x"), Candidate("y", "y"), Candidate("z", "z")]
        )
    assert [(r.candidate.id, r.score) for r in out] == [("z", 0.9), ("x", 0.5)]


def test_null_reranker_keeps_input_order(spans: Spans) -> None:
    provider, exporter = spans
    cands = two()[::-1]
    out = RerankStage(NullReranker(), tracer_provider=provider).run("q", cands)
    assert [r.candidate for r in out] == cands
    assert [r.score for r in out] == [0.0, 0.0]
    assert only_span(exporter).attributes["retrieval_stage.provider"] == "null"


async def test_arun_with_async_client_maps_out_of_order(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans
    cands = two()
    async with AsyncRerankClient(wm.url + "/tei/out-of-order") as client:
        out = await RerankStage(client, tracer_provider=provider).arun("q", cands)
    assert [r.candidate for r in out] == [cands[1], cands[0]]
    assert only_span(exporter).attributes["reranker.output_documents.0.document.id"] == "doc-b"


async def test_arun_with_sync_reranker_runs_in_a_thread(spans: Spans) -> None:
    provider, exporter = spans
    out = await RerankStage(ByLength(), tracer_provider=provider).arun("q", two())
    assert [r.candidate.id for r in out] == ["doc-b", "doc-a"]  # len("second text") > ...
    assert only_span(exporter).attributes["openinference.span.kind"] == "RERANKER"


def test_run_with_async_reranker_says_to_use_arun(wm: WireMock) -> None:
    client = AsyncRerankClient(wm.url + "/tei")
    with pytest.raises(TypeError, match="arun"):
        RerankStage(client).run("q", two())


def test_metadata_is_a_json_string(spans: Spans) -> None:
    provider, exporter = spans
    RerankStage(NullReranker(), tracer_provider=provider).run("q", two())
    raw = only_span(exporter).attributes["reranker.input_documents.0.document.metadata"]
    assert json.loads(raw) == {"source": "wiki", "page": 3}


async def test_cancelled_arun_ends_its_span_as_cancelled(wm: WireMock, spans: Spans) -> None:
    import asyncio

    provider, exporter = spans
    wm.stub_json("/tei/hang/rerank", [{"index": 0, "score": 1.0}], fixedDelayMilliseconds=5000)
    async with AsyncRerankClient(wm.url + "/tei/hang") as client:
        task = asyncio.ensure_future(
            RerankStage(client, tracer_provider=provider).arun("q", [Candidate("a", "x")])
        )
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    span = only_span(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "cancelled"
    assert span.attributes["retrieval_stage.cancelled"] is True


class Scoring:
    """A user's reranker that gives every candidate the same, given score."""

    def __init__(self, score: Any) -> None:
        self.score = score

    def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[T, Any]]:
        return [(item, self.score) for item in items]


NOT_FINITE = {
    "nan": float("nan"),
    "+inf": float("inf"),
    "-inf": float("-inf"),
    "numpy.float32 nan": np.float32("nan"),
    "numpy.float64 +inf": np.float64("inf"),
}


@pytest.mark.parametrize("score", NOT_FINITE.values(), ids=list(NOT_FINITE))
def test_a_score_that_is_not_finite_from_a_users_reranker_falls_back(
    spans: Spans, score: Any
) -> None:
    provider, exporter = spans
    out = RerankStage(Scoring(score), tracer_provider=provider).run("q", scrambled())
    assert [r.candidate.id for r in out] == RECALL_ORDER
    assert [r.score for r in out] == [0.8, 0.8, 0.1, None]
    assert not any(r.reranked for r in out)
    span = only_span(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == (
        "fell back to recall order: RerankProtocolError: "
        "reranker result 0: score is not a finite number"
    )
    assert span.attributes["error.type"] == "RerankProtocolError"
    assert span.attributes["retrieval_stage.fallback"] is True
    assert not [k for k in span.attributes if k.startswith("reranker.output_documents.")]


@pytest.mark.parametrize("score", NOT_FINITE.values(), ids=list(NOT_FINITE))
async def test_a_score_that_is_not_finite_from_an_async_reranker_falls_back(
    spans: Spans, score: Any
) -> None:
    provider, exporter = spans

    class AsyncScoring:
        async def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[T, Any]]:
            return Scoring(score).rerank(query, items)

    out = await RerankStage(AsyncScoring(), tracer_provider=provider).arun("q", scrambled())
    assert [r.candidate.id for r in out] == RECALL_ORDER
    assert only_span(exporter).status.description.startswith(
        "fell back to recall order: RerankProtocolError"
    )


def test_a_score_that_is_not_finite_raises_with_on_error_raise(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(Scoring(float("nan")), tracer_provider=provider, on_error="raise")
    with pytest.raises(RerankProtocolError, match="not a finite number"):
        stage.run("q", scrambled())
    assert only_span(exporter).status.status_code == StatusCode.ERROR
