"""OpenInference context, suppression, the current span, and what the span records on request.

- `using_session`/`using_attributes` land on the RERANKER, CHAIN and RETRIEVER spans;
- inside OpenTelemetry's instrumentation suppression or OpenInference's `suppress_tracing`
  no span is made and the rerank still runs;
- the RERANKER span is the current span while the reranker runs (what a client's
  ``traceparent`` names);
- `output_content=False` / ``RETRIEVAL_STAGE_OUTPUT_CONTENT=0``: output documents are id + score;
- ``output.value`` stays valid JSON under its cap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from openinference.instrumentation import suppress_tracing, using_attributes, using_session
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from retrieval_stage import Candidate, RerankStage, RerankTransportError
from retrieval_stage.models import Reranked
from retrieval_stage.pipeline import Pipeline
from retrieval_stage.spans import OUTPUT_CONTENT_ENV, output_value

from ..fakes import ByLength, FixedRecall

T = TypeVar("T")
Spans = tuple[TracerProvider, InMemorySpanExporter]

CONTEXT = {
    "session.id": "session-7",
    "user.id": "user-3",
    "metadata": '{"tenant": "acme"}',
    "tag.tags": ("beta", "docs"),
}


def scrambled() -> list[Candidate]:
    """Recall order (c, a, b) differs from input order."""
    return [Candidate("a", "aa", 2.0), Candidate("b", "bbbbbb", 1.0), Candidate("c", "c", 3.0)]


class Seen(ByLength):
    """A reranker scoring by text length that notes the current span while it runs."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__(provider="test")
        self.fail = fail
        self.current: list[SpanContext] = []

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        self.current.append(trace.get_current_span().get_span_context())
        if self.fail:
            raise RerankTransportError("down")
        return super().rerank(query, items, text=text, top_k=top_k)


class AsyncSeen(Seen):
    async def rerank(  # type: ignore[override]
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        return Seen.rerank(self, query, items, text=text, top_k=top_k)


def only_span(exporter: InMemorySpanExporter) -> Any:
    (span,) = exporter.get_finished_spans()
    return span


# -- context attributes ------------------------------------------------------------------------


def test_using_attributes_land_on_reranker_chain_and_retriever_spans(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(Seen(), tracer_provider=provider)
    pipeline = Pipeline(FixedRecall(scrambled()), stage, tracer_provider=provider)
    with using_attributes(
        session_id="session-7", user_id="user-3", metadata={"tenant": "acme"}, tags=["beta", "docs"]
    ):
        pipeline.run("q")
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert set(finished) == {"pipeline", "recall", "rerank"}
    for name, span in finished.items():
        attributes = dict(span.attributes or {})
        assert {key: attributes.get(key) for key in CONTEXT} == CONTEXT, name


def test_using_session_lands_on_the_reranker_span(spans: Spans) -> None:
    provider, exporter = spans
    with using_session("session-42"):
        RerankStage(Seen(), tracer_provider=provider).run("q", scrambled())
    assert only_span(exporter).attributes["session.id"] == "session-42"


async def test_using_session_lands_on_the_span_of_arun_in_a_thread_and_async(
    spans: Spans,
) -> None:
    provider, exporter = spans
    with using_session("s-async"):
        await RerankStage(Seen(), tracer_provider=provider).arun("q", scrambled())
        await RerankStage(AsyncSeen(), tracer_provider=provider).arun("q", scrambled())
    assert [s.attributes["session.id"] for s in exporter.get_finished_spans()] == ["s-async"] * 2


def test_no_context_attributes_without_a_context(spans: Spans) -> None:
    provider, exporter = spans
    RerankStage(Seen(), tracer_provider=provider).run("q", scrambled())
    assert not set(CONTEXT) & set(only_span(exporter).attributes)


def test_context_attributes_never_evict_the_span_identity() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=9))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with using_attributes(session_id="s", user_id="u", metadata={"m": 1}, tags=["t"]):
        RerankStage(Seen(), tracer_provider=provider, model_name="m").run("q", scrambled())
    span = only_span(exporter)
    assert span.dropped_attributes == 0
    assert span.attributes["openinference.span.kind"] == "RERANKER"
    assert span.attributes["reranker.query"] == "q"
    assert span.attributes["session.id"] == "s"  # the first context attribute still fits


# -- suppression -------------------------------------------------------------------------------


def otel_suppressed() -> Any:
    """OpenTelemetry's own suppression, as its instrumentations and exporters set it."""

    class Suppressed:
        def __enter__(self) -> None:
            self.token = otel_context.attach(
                otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True)
            )

        def __exit__(self, *_: object) -> None:
            otel_context.detach(self.token)

    return Suppressed()


SUPPRESSIONS = {
    "opentelemetry key": otel_suppressed,
    "openinference suppress_tracing": suppress_tracing,
}


@pytest.mark.parametrize("suppressed", SUPPRESSIONS.values(), ids=list(SUPPRESSIONS))
def test_suppressed_stage_makes_no_span_and_still_reranks(spans: Spans, suppressed: Any) -> None:
    provider, exporter = spans
    reranker = Seen()
    with suppressed():
        out = RerankStage(reranker, tracer_provider=provider).run("q", scrambled())
    assert [(r.candidate.id, r.score, r.reranked) for r in out] == [
        ("b", 6.0, True),
        ("a", 2.0, True),
        ("c", 1.0, True),
    ]
    assert len(reranker.current) == 1
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("suppressed", SUPPRESSIONS.values(), ids=list(SUPPRESSIONS))
def test_suppressed_stage_still_falls_back_to_recall_order(spans: Spans, suppressed: Any) -> None:
    provider, exporter = spans
    with suppressed():
        out = RerankStage(Seen(fail=True), tracer_provider=provider).run("q", scrambled())
    assert [(r.candidate.id, r.reranked) for r in out] == [("c", False), ("a", False), ("b", False)]
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("suppressed", SUPPRESSIONS.values(), ids=list(SUPPRESSIONS))
async def test_suppressed_pipeline_makes_no_span_and_still_runs(
    spans: Spans, suppressed: Any
) -> None:
    provider, exporter = spans
    stage = RerankStage(Seen(), tracer_provider=provider)
    pipeline = Pipeline(FixedRecall(scrambled()), stage, tracer_provider=provider)
    with suppressed():
        result = pipeline.run("q")
        async_result = await pipeline.arun("q")
    for got in (result, async_result):
        assert [r.candidate.id for r in got.results] == ["b", "a", "c"]
        assert got.trace_id is None
    assert exporter.get_finished_spans() == ()


# -- the current span --------------------------------------------------------------------------


@pytest.mark.parametrize("reranker", [Seen, AsyncSeen], ids=["sync in a thread", "async"])
async def test_reranker_span_is_current_while_the_reranker_runs_in_arun(
    spans: Spans, reranker: type[Seen]
) -> None:
    provider, exporter = spans
    seen = reranker()
    await RerankStage(seen, tracer_provider=provider).arun("q", scrambled())
    assert seen.current == [only_span(exporter).context]


def test_reranker_span_is_current_while_the_reranker_runs(spans: Spans) -> None:
    provider, exporter = spans
    seen = Seen()
    RerankStage(seen, tracer_provider=provider).run("q", scrambled())
    (context,) = seen.current
    assert context.is_valid
    assert context == only_span(exporter).context


# -- output documents without content ----------------------------------------------------------


def output_keys(span: Any) -> dict[str, Any]:
    prefix = "reranker.output_documents."
    return {k: v for k, v in span.attributes.items() if k.startswith(prefix)}


ID_AND_SCORE_ONLY = {
    "reranker.output_documents.0.document.id": "b",
    "reranker.output_documents.0.document.score": 6.0,
    "reranker.output_documents.1.document.id": "a",
    "reranker.output_documents.1.document.score": 2.0,
    "reranker.output_documents.2.document.id": "c",
    "reranker.output_documents.2.document.score": 1.0,
}


def with_metadata() -> list[Candidate]:
    return [Candidate(c.id, c.text, c.score, {"n": 1}) for c in scrambled()]


def test_output_content_false_records_output_documents_as_id_and_score(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(Seen(), tracer_provider=provider, output_content=False)
    stage.run("q", with_metadata())
    span = only_span(exporter)
    assert output_keys(span) == ID_AND_SCORE_ONLY
    assert span.attributes["reranker.input_documents.1.document.content"] == "bbbbbb"
    assert span.attributes["reranker.input_documents.1.document.metadata"] == '{"n": 1}'


@pytest.mark.parametrize("value", ["0", "false", "off", "NO"])
def test_output_content_env_variable_turns_content_off(
    spans: Spans, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    provider, exporter = spans
    monkeypatch.setenv(OUTPUT_CONTENT_ENV, value)
    RerankStage(Seen(), tracer_provider=provider).run("q", with_metadata())
    assert output_keys(only_span(exporter)) == ID_AND_SCORE_ONLY


def test_output_content_keyword_overrides_the_environment(
    spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    monkeypatch.setenv(OUTPUT_CONTENT_ENV, "0")
    RerankStage(Seen(), tracer_provider=provider, output_content=True).run("q", with_metadata())
    keys = output_keys(only_span(exporter))
    assert keys["reranker.output_documents.0.document.content"] == "bbbbbb"
    assert keys["reranker.output_documents.0.document.metadata"] == '{"n": 1}'


def test_output_content_env_variable_unparseable_keeps_content(
    spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, _ = spans
    monkeypatch.setenv(OUTPUT_CONTENT_ENV, "maybe")
    assert RerankStage(Seen(), tracer_provider=provider).output_content is True
    monkeypatch.setenv(OUTPUT_CONTENT_ENV, "1")
    assert RerankStage(Seen(), tracer_provider=provider).output_content is True


# -- output.value ------------------------------------------------------------------------------


def test_output_value_is_cut_to_its_cap_and_stays_json() -> None:
    cands = [Candidate(f"doc-{i}", "t") for i in range(50)]
    outputs = [Reranked(c, 1.0 - i / 100, i) for i, c in enumerate(cands)]
    text = output_value(outputs, fell_back=False, max_bytes=200)
    assert len(text.encode()) <= 200
    parsed = json.loads(text)
    kept = parsed["documents"]
    assert kept[0] == {"id": "doc-0", "score": 1.0}
    assert [d["id"] for d in kept] == [f"doc-{i}" for i in range(len(kept))]
    assert parsed["omitted"] == 50 - len(kept) > 0


def test_output_value_of_a_fallback_has_no_scores() -> None:
    cands = [Candidate("é" * 10, "t", 0.5), Candidate("b", "t", 0.9)]
    outputs = [Reranked(cands[1], 0.9, 1, reranked=False), Reranked(cands[0], 0.5, 0, False)]
    assert json.loads(output_value(outputs, fell_back=True, max_bytes=2000)) == {
        "order": "recall",
        "documents": [{"id": "b"}, {"id": "é" * 10}],
    }
