"""Pipeline: one trace per call (CHAIN → RETRIEVER, RERANKER); BM25 recall; lexical reranker."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest
from openinference.instrumentation import TraceConfig
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from retrieval_stage import Candidate, RerankStage, RerankTransportError
from retrieval_stage.local import LexicalReranker
from retrieval_stage.pipeline import Pipeline, PipelineResult, compare_ranks
from retrieval_stage.recall import BM25Recall
from retrieval_stage.stage import Reranked

from .fakes import ByLength, Failing, FixedRecall

T = TypeVar("T")
Spans = tuple[TracerProvider, InMemorySpanExporter]


def length_reranker() -> ByLength:
    """Scores by text length; the provider and model name are the ones the span checks name."""
    return ByLength(provider="test", model_name="length")


def failing_reranker() -> Failing:
    """A provider that is down: every call raises `RerankTransportError`."""
    return Failing(RerankTransportError("connection refused"), provider="test")


def three() -> list[Candidate]:
    return [
        Candidate("a", "short", 3.0, {"module": "json"}),
        Candidate("b", "the longest text", 2.0),
        Candidate("c", "medium text", 1.0),
    ]


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    finished = exporter.get_finished_spans()
    named = {span.name: span for span in finished}
    assert len(named) == len(finished) == 3
    return named


def run_three(spans: Spans, **stage_kwargs: Any) -> tuple[PipelineResult, dict[str, ReadableSpan]]:
    provider, exporter = spans
    stage = RerankStage(length_reranker(), tracer_provider=provider, **stage_kwargs)
    pipeline = Pipeline(FixedRecall(three()), stage, recall_k=3, tracer_provider=provider)
    result = pipeline.run("which is longest?")
    return result, by_name(exporter)


def test_one_call_is_one_trace_chain_parent_of_retriever_and_reranker(spans: Spans) -> None:
    result, named = run_three(spans)
    chain, retriever, reranker = named["pipeline"], named["recall"], named["rerank"]
    assert chain.parent is None
    assert chain.context is not None
    assert retriever.parent is not None
    assert reranker.parent is not None
    assert retriever.parent.span_id == chain.context.span_id
    assert reranker.parent.span_id == chain.context.span_id
    trace_ids = {span.context.trace_id for span in named.values() if span.context}
    assert trace_ids == {chain.context.trace_id}
    assert result.trace_id == format(chain.context.trace_id, "032x")
    assert retriever.end_time is not None
    assert reranker.start_time is not None
    assert retriever.end_time <= reranker.start_time  # recall, then rerank


def test_chain_span_has_exactly_its_attributes(spans: Spans) -> None:
    result, named = run_three(spans)
    attributes = dict(named["pipeline"].attributes or {})
    assert attributes.pop("openinference.span.kind") == "CHAIN"
    assert attributes.pop("input.value") == "which is longest?"
    assert attributes.pop("input.mime_type") == "text/plain"
    assert attributes.pop("retrieval_stage.recall") == "fixed"
    assert attributes.pop("retrieval_stage.recall_k") == 3
    assert json.loads(str(attributes.pop("output.value"))) == ["b", "c", "a"]
    assert attributes.pop("output.mime_type") == "application/json"
    assert attributes.pop("retrieval_stage.fallback") is False
    assert not attributes
    assert [r.candidate.id for r in result.results] == ["b", "c", "a"]
    assert named["pipeline"].status.status_code is StatusCode.OK


def test_retriever_span_lists_the_recalled_documents_with_recall_scores(spans: Spans) -> None:
    _, named = run_three(spans)
    attributes = dict(named["recall"].attributes or {})
    assert attributes.pop("openinference.span.kind") == "RETRIEVER"
    assert attributes.pop("input.value") == "which is longest?"
    assert attributes.pop("input.mime_type") == "text/plain"
    assert attributes.pop("retrieval_stage.recall") == "fixed"
    assert attributes.pop("retrieval_stage.recall_k") == 3
    assert attributes.pop("retrieval_stage.documents") == 3
    prefix = "retrieval.documents"
    assert attributes.pop(f"{prefix}.0.document.id") == "a"
    assert attributes.pop(f"{prefix}.0.document.content") == "short"
    assert attributes.pop(f"{prefix}.0.document.score") == 3.0
    assert attributes.pop(f"{prefix}.0.document.metadata") == '{"module": "json"}'
    assert attributes.pop(f"{prefix}.1.document.id") == "b"
    assert attributes.pop(f"{prefix}.1.document.content") == "the longest text"
    assert attributes.pop(f"{prefix}.1.document.score") == 2.0
    assert attributes.pop(f"{prefix}.2.document.id") == "c"
    assert attributes.pop(f"{prefix}.2.document.content") == "medium text"
    assert attributes.pop(f"{prefix}.2.document.score") == 1.0
    assert not attributes


def test_reranker_span_is_the_stages_with_its_documents(spans: Spans) -> None:
    _, named = run_three(spans)
    attributes = dict(named["rerank"].attributes or {})
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["reranker.query"] == "which is longest?"
    assert attributes["reranker.model_name"] == "length"
    assert attributes["retrieval_stage.provider"] == "test"
    assert attributes["reranker.input_documents.0.document.id"] == "a"
    assert attributes["reranker.output_documents.0.document.id"] == "b"
    assert attributes["reranker.output_documents.0.document.score"] == 16.0


def test_retriever_documents_stop_at_the_attribute_limit_head_first(spans: Spans) -> None:
    provider, exporter = spans  # the SDK's default limit: 128 attributes
    many = [Candidate(f"d{i}", f"text {i}", float(100 - i), {"n": i}) for i in range(50)]
    stage = RerankStage(length_reranker(), tracer_provider=provider)
    Pipeline(FixedRecall(many), stage, recall_k=50, tracer_provider=provider).run("q")
    attributes = dict(by_name(exporter)["recall"].attributes or {})
    assert attributes["openinference.span.kind"] == "RETRIEVER"
    assert attributes["input.value"] == "q"
    kept = sum(1 for key in attributes if key.endswith(".document.id"))
    assert 0 < kept < 50
    assert attributes["retrieval_stage.retrieval_documents.omitted"] == 50 - kept
    assert {f"retrieval.documents.{i}.document.id" for i in range(kept)} <= set(attributes)
    assert len(attributes) <= 128


def test_chain_and_retriever_cap_values_at_the_stages_content_length(spans: Spans) -> None:
    provider, exporter = spans
    long_id = "id-" + "é" * 200
    recalled = [
        Candidate(long_id, "text " * 100, 2.0, {"blob": "x" * 500, 3: float("nan")}),
        Candidate("short", "tiny", 1.0),
    ]
    stage = RerankStage(length_reranker(), tracer_provider=provider, max_content_length=64)
    Pipeline(FixedRecall(recalled), stage, tracer_provider=provider).run("q" * 300)
    named = by_name(exporter)
    chain = dict(named["pipeline"].attributes or {})
    retriever = dict(named["recall"].attributes or {})
    for attributes in (chain, retriever):
        assert len(str(attributes["input.value"]).encode()) <= 64
        assert str(attributes["input.value"]).endswith("…[truncated]")
    assert len(str(chain["output.value"]).encode()) <= 64
    assert chain["output.mime_type"] == "text/plain"  # no longer the whole JSON list
    prefix = "retrieval.documents.0.document"
    for key in ("id", "content", "metadata"):
        assert len(str(retriever[f"{prefix}.{key}"]).encode()) <= 64
    assert str(retriever[f"{prefix}.id"]).startswith("id-é")

    def no_nan(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    json.loads(str(retriever[f"{prefix}.metadata"]), parse_constant=no_nan)  # still JSON


def test_metadata_on_the_retriever_span_is_json_whatever_it_holds(spans: Spans) -> None:
    provider, exporter = spans
    odd = Candidate("a", "x", 1.0, {"nan": float("nan"), 7: "seven"})
    stage = RerankStage(length_reranker(), tracer_provider=provider)
    Pipeline(FixedRecall([odd]), stage, tracer_provider=provider).run("q")
    raw = str(
        dict(by_name(exporter)["recall"].attributes or {})[
            "retrieval.documents.0.document.metadata"
        ]
    )

    def no_nan(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    assert "seven" in json.dumps(json.loads(raw, parse_constant=no_nan))  # strict JSON


def test_hidden_inputs_and_outputs_are_redacted_on_chain_and_retriever(spans: Spans) -> None:
    provider, exporter = spans
    config = TraceConfig(hide_inputs=True, hide_outputs=True)
    stage = RerankStage(length_reranker(), tracer_provider=provider, trace_config=config)
    Pipeline(FixedRecall(three()), stage, tracer_provider=provider).run("secret query")
    named = by_name(exporter)
    for name in ("pipeline", "recall"):
        attributes = dict(named[name].attributes or {})
        assert attributes["input.value"] == "__REDACTED__"
        assert "input.mime_type" not in attributes
        assert "secret query" not in json.dumps(attributes)
    retrieved = dict(named["recall"].attributes or {})
    assert retrieved["retrieval.documents.0.document.content"] == "__REDACTED__"
    assert retrieved["retrieval.documents.0.document.id"] == "a"
    assert dict(named["pipeline"].attributes or {})["output.value"] == "__REDACTED__"


def test_recall_failure_fails_the_call_and_marks_both_spans(spans: Spans) -> None:
    provider, exporter = spans

    class Broken:
        def recall(self, query: str, k: int) -> list[Candidate]:
            raise RuntimeError("index offline")

    stage = RerankStage(length_reranker(), tracer_provider=provider)
    with pytest.raises(RuntimeError, match="index offline"):
        Pipeline(Broken(), stage, tracer_provider=provider).run("q")
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert set(finished) == {"pipeline", "recall"}
    assert finished["recall"].status.status_code is StatusCode.ERROR
    assert finished["pipeline"].status.status_code is StatusCode.ERROR


def scrambled_recall() -> FixedRecall:
    """A recall whose answer is not in recall-score order: recall order is c, a, b."""
    return FixedRecall(
        [
            Candidate("a", "short", 2.0),
            Candidate("b", "the longest text", 1.0),
            Candidate("c", "medium text", 3.0),
        ]
    )


FELL_BACK = "fell back to recall order: RerankTransportError: connection refused"


def assert_chain_says_it_fell_back(chain: ReadableSpan) -> None:
    attributes = dict(chain.attributes or {})
    assert attributes.pop("openinference.span.kind") == "CHAIN"
    assert attributes.pop("input.value") == "q"
    assert attributes.pop("input.mime_type") == "text/plain"
    assert attributes.pop("retrieval_stage.recall") == "fixed"
    assert attributes.pop("retrieval_stage.recall_k") == 50
    assert json.loads(str(attributes.pop("output.value"))) == ["c", "a", "b"]
    assert attributes.pop("output.mime_type") == "application/json"
    assert attributes.pop("retrieval_stage.fallback") is True
    assert not attributes
    assert chain.status.status_code is StatusCode.ERROR
    assert chain.status.description == FELL_BACK


def test_reranker_failure_falls_back_to_recall_order_inside_the_trace(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(failing_reranker(), tracer_provider=provider)
    result = Pipeline(scrambled_recall(), stage, tracer_provider=provider).run("q")
    assert result.fell_back
    assert [r.candidate.id for r in result.results] == ["c", "a", "b"]
    assert [c.movement for c in result.changes] == ["=", "=", "="]
    named = by_name(exporter)
    assert named["rerank"].status.status_code is StatusCode.ERROR
    assert named["rerank"].status.description == FELL_BACK
    assert_chain_says_it_fell_back(named["pipeline"])
    assert named["recall"].status.status_code is StatusCode.OK


async def test_async_reranker_failure_marks_the_chain_span_too(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(failing_reranker(), tracer_provider=provider)
    result = await Pipeline(scrambled_recall(), stage, tracer_provider=provider).arun("q")
    assert [r.candidate.id for r in result.results] == ["c", "a", "b"]
    assert_chain_says_it_fell_back(by_name(exporter)["pipeline"])


async def test_arun_writes_the_same_trace_shape(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(length_reranker(), tracer_provider=provider)
    result = await Pipeline(FixedRecall(three()), stage, tracer_provider=provider).arun("q")
    named = by_name(exporter)
    chain = named["pipeline"]
    assert chain.context is not None
    for child in ("recall", "rerank"):
        parent = named[child].parent
        assert parent is not None
        assert parent.span_id == chain.context.span_id
    assert [r.candidate.id for r in result.results] == ["b", "c", "a"]


class HangingReranker:
    """An async reranker that never answers: the caller has to cancel it."""

    provider = "test"

    def __init__(self) -> None:
        self.called = asyncio.Event()

    async def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[T, float]]:
        self.called.set()
        await asyncio.Event().wait()
        return []


def assert_cancelled(span: ReadableSpan) -> None:
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "cancelled"
    assert (span.attributes or {})["retrieval_stage.cancelled"] is True


async def test_cancelled_arun_marks_the_chain_span_cancelled(spans: Spans) -> None:
    provider, exporter = spans
    reranker = HangingReranker()
    stage = RerankStage(reranker, tracer_provider=provider)
    pipeline = Pipeline(FixedRecall(three()), stage, tracer_provider=provider)
    task = asyncio.ensure_future(pipeline.arun("q"))
    await asyncio.wait_for(reranker.called.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    named = by_name(exporter)
    assert_cancelled(named["pipeline"])
    assert_cancelled(named["rerank"])
    assert named["recall"].status.status_code is StatusCode.OK  # recall had finished


async def test_cancelled_arun_during_recall_marks_retriever_and_chain(spans: Spans) -> None:
    provider, exporter = spans
    started, release = threading.Event(), threading.Event()

    class SlowRecall(FixedRecall):
        def recall(self, query: str, k: int) -> list[Candidate]:
            started.set()
            release.wait(10)
            return super().recall(query, k)

    stage = RerankStage(length_reranker(), tracer_provider=provider)
    pipeline = Pipeline(SlowRecall(three()), stage, tracer_provider=provider)
    task = asyncio.ensure_future(pipeline.arun("q"))
    try:
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        release.set()
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert set(finished) == {"pipeline", "recall"}
    assert_cancelled(finished["recall"])
    assert_cancelled(finished["pipeline"])


def test_recall_is_asked_for_recall_k_and_extra_results_are_cut(spans: Spans) -> None:
    provider, _ = spans

    class Generous(FixedRecall):
        def recall(self, query: str, k: int) -> list[Candidate]:
            self.asked.append((query, k))
            return self.candidates  # ignores k

    recall = Generous(three())
    stage = RerankStage(length_reranker(), tracer_provider=provider)
    result = Pipeline(recall, stage, recall_k=2, tracer_provider=provider).run("q")
    assert recall.asked == [("q", 2)]
    assert [c.id for c in result.recalled] == ["a", "b"]


def test_recall_returning_something_else_than_candidates_is_a_type_error(spans: Spans) -> None:
    provider, _ = spans

    class Wrong:
        def recall(self, query: str, k: int) -> list[Any]:
            return [{"id": "a", "text": "x"}]

    stage = RerankStage(length_reranker(), tracer_provider=provider)
    with pytest.raises(TypeError, match=r"Wrong\.recall\(\) returned a dict at position 0"):
        Pipeline(Wrong(), stage, tracer_provider=provider).run("q")


def test_pipeline_rejects_bad_arguments() -> None:
    stage = RerankStage(length_reranker())
    with pytest.raises(TypeError, match="recall\\(\\) method"):
        Pipeline(object(), stage)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="recall_k"):
        Pipeline(FixedRecall([]), stage, recall_k=0)


# -- rank changes -----------------------------------------------------------------------------


def test_compare_ranks_gives_recall_rank_and_movement_labels() -> None:
    # recall order by score: c1 (0.9), c2 (0.8), c3 (0.7), c4 (0.6), c5 (no score, last)
    cands = [
        Candidate("c3", "x", 0.7),
        Candidate("c1", "x", 0.9),
        Candidate("c5", "x"),
        Candidate("c2", "x", 0.8),
        Candidate("c4", "x", 0.6),
    ]
    outputs = [Reranked(cands[4], 5.0, 4), Reranked(cands[1], 4.0, 1), Reranked(cands[0], 3.0, 0)]
    changes = compare_ranks(cands, outputs)
    got = [(c.candidate.id, c.rank, c.recall_rank, c.moved, c.movement) for c in changes]
    assert got == [
        ("c4", 1, 4, 3, "new"),  # recall rank 4 is outside the 3 kept: brought in from below
        ("c1", 2, 1, -1, "↓1"),
        ("c3", 3, 3, 0, "="),
    ]
    assert changes[0].recall_score == 0.6
    assert changes[0].score == 5.0


def test_movement_up_inside_the_window_is_an_arrow() -> None:
    cands = [Candidate("a", "x", 2.0), Candidate("b", "x", 1.0)]
    changes = compare_ranks(cands, [Reranked(cands[1], 1.0, 1), Reranked(cands[0], 0.5, 0)])
    assert [c.movement for c in changes] == ["↑1", "↓1"]


# -- BM25 recall ------------------------------------------------------------------------------

DOCS = [
    Candidate("cat", "The cat sat on the mat. A cat purrs.", metadata={"kind": "animal"}),
    Candidate("dog", "A dog barks at the mailman."),
    Candidate("mat", "A mat is a flat piece of fabric on the floor."),
    Candidate("bird", "Birds can fly."),
]


def test_bm25_returns_matching_documents_best_first_with_scores() -> None:
    found = BM25Recall(DOCS).recall("cat on a mat", 10)
    assert [c.id for c in found] == ["cat", "mat"]
    assert all(c.score is not None and c.score > 0 for c in found)
    assert found[0].score is not None
    assert found[1].score is not None
    assert found[0].score > found[1].score
    assert found[0].metadata == {"kind": "animal"}
    assert found[0].text == DOCS[0].text
    assert DOCS[0].score is None  # the corpus is not changed


def test_bm25_keeps_k_and_returns_nothing_for_unknown_words() -> None:
    recall = BM25Recall(DOCS)
    assert [c.id for c in recall.recall("cat mat", 1)] == ["cat"]
    assert recall.recall("zebra xylophone", 5) == []
    assert recall.recall("the a", 5) == []  # only stop words


def test_bm25_ties_keep_corpus_order() -> None:
    docs = [Candidate(f"d{i}", "same words here") for i in range(5)]
    assert [c.id for c in BM25Recall(docs).recall("words", 5)] == ["d0", "d1", "d2", "d3", "d4"]


def test_bm25_rejects_duplicate_ids_and_bad_k() -> None:
    with pytest.raises(ValueError, match="'a' appears twice"):
        BM25Recall([Candidate("a", "x"), Candidate("a", "y")])
    with pytest.raises(ValueError, match="k must be"):
        BM25Recall(DOCS).recall("cat", 0)
    assert BM25Recall([]).recall("cat", 3) == []


# -- the lexical reranker ---------------------------------------------------------------------


def test_lexical_reranker_prefers_covering_all_query_terms_close_together() -> None:
    items = [
        "remove a file",
        "recursively delete a directory tree",
        "a directory listing; later, delete whatever you like",
    ]
    result = LexicalReranker().rerank("delete directory tree", items)
    assert [text for text, _ in result] == [items[1], items[2], items[0]]
    assert result[0][1] == pytest.approx(1.0)
    assert result[-1][1] == 0.0


def test_lexical_reranker_keeps_input_order_on_ties_and_honours_top_k() -> None:
    items = ["alpha", "beta", "gamma"]
    assert LexicalReranker().rerank("zeta", items) == [(i, 0.0) for i in items]
    assert LexicalReranker().rerank("zeta", items, top_k=2) == [("alpha", 0.0), ("beta", 0.0)]
    assert LexicalReranker().rerank("zeta", []) == []


def test_lexical_reranker_says_it_is_lexical_on_the_span(spans: Spans) -> None:
    provider, exporter = spans
    RerankStage(LexicalReranker(), tracer_provider=provider).run("q", [Candidate("a", "q")])
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert attributes["retrieval_stage.provider"] == "lexical"
    assert attributes["reranker.model_name"] == "lexical-coverage-proximity"


def test_local_module_exports_every_public_class_and_function() -> None:
    """Every public class and function defined in a module of ``retrieval_stage.local`` is
    exported by the package (the in-process model base classes excepted: they are shared
    within the folder, not offered to users)."""
    import inspect

    import retrieval_stage.local as local

    shared = {"InProcessModel", "InThread"}
    defined = {
        name
        for module_name in ("base", "cross_encoder", "embedding", "lexical")
        for name, value in vars(getattr(local, module_name)).items()
        if not name.startswith("_")
        and name not in shared
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == f"{local.__name__}.{module_name}"
    }
    assert "AsyncCrossEncoderReranker" in defined
    assert defined <= set(local.__all__)
