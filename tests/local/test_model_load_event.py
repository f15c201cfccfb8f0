"""The call that loads an in-process model says so on its span: one `retrieval_stage.model.load`
event with the load's duration, the model and its backend; later calls record none.

A rerank span that took seconds because the first call loaded the model (issue 39: 5.3 s beside
recall's 7 ms in Phoenix) must not read as a slow reranker. The real packaged MiniLM on the
numpy backend, through a traced `RerankStage`, and a model whose load is timed by hand.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import Candidate, RerankError, RerankStage
from retrieval_stage.local import AsyncEmbeddingReranker, EmbeddingReranker
from retrieval_stage.local.base import InProcessModel
from retrieval_stage.spans.keys import (
    ATTR_MODEL,
    ATTR_MODEL_BACKEND,
    ATTR_MODEL_LOAD_DURATION,
    EVENT_MODEL_LOAD,
)

from .._minilm import need_numpy_backend, reuse_packaged_model

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
CANDIDATES = [
    Candidate("a", "open a file for reading", score=0.9),
    Candidate("b", "copy a directory tree", score=0.8),
    Candidate("c", "read a file line by line", score=0.7),
]
LOAD_S = 0.2
"""How long `_SlowToLoad` takes to load: long enough to tell from a rerank's own time."""
CLOCK_MARGIN_S = 0.05
"""Slack for timers read a few statements apart on a busy machine."""


def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def load_events(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == EVENT_MODEL_LOAD]


class _SlowToLoad(InProcessModel):
    """Takes `LOAD_S` to load; scores by text length. `fail` makes the load raise."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail

    @property
    def model_name(self) -> str:
        return "slow-to-load"

    def _load(self) -> Any:
        time.sleep(LOAD_S)
        if self.fail:
            raise RerankError("no weights on disk")
        return len

    def _scores(self, query: str, texts: list[str]) -> list[float]:
        score = self._loaded()
        return [float(score(t)) for t in texts]


def test_the_first_rerank_of_the_real_model_says_it_loaded_and_how_long_it_took() -> None:
    need_numpy_backend()
    provider, exporter = traced()
    stage = RerankStage(EmbeddingReranker(backend="numpy"), tracer_provider=provider)

    stage.run("read a file", CANDIDATES)
    stage.run("read a file", CANDIDATES)

    first, second = exporter.get_finished_spans()
    (event,) = [e for e in first.events if e.name == EVENT_MODEL_LOAD]
    attributes = dict(event.attributes or {})
    seconds = attributes.pop(ATTR_MODEL_LOAD_DURATION)
    assert attributes == {ATTR_MODEL: MINILM, ATTR_MODEL_BACKEND: "numpy"}
    assert isinstance(seconds, float)
    assert seconds > 0
    # The load happened inside the span: it started after the span did, and took part of it.
    assert first.start_time is not None
    assert first.end_time is not None
    assert first.start_time <= event.timestamp <= first.end_time
    assert seconds * 1e9 <= first.end_time - first.start_time
    assert load_events(second) == []


def test_the_sentence_transformers_backend_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sentence_transformers")
    reuse_packaged_model(monkeypatch)
    provider, exporter = traced()
    stage = RerankStage(
        EmbeddingReranker(backend="sentence-transformers"), tracer_provider=provider
    )

    stage.run("read a file", CANDIDATES)

    (span,) = exporter.get_finished_spans()
    (event,) = load_events(span)
    assert event[ATTR_MODEL_BACKEND] == "sentence-transformers"
    assert event[ATTR_MODEL] == MINILM


def test_the_async_twin_records_the_load_on_the_span_of_the_call() -> None:
    need_numpy_backend()
    provider, exporter = traced()
    stage = RerankStage(AsyncEmbeddingReranker(backend="numpy"), tracer_provider=provider)

    async def twice() -> None:
        await stage.arun("read a file", CANDIDATES)
        await stage.arun("read a file", CANDIDATES)

    asyncio.run(twice())

    first, second = exporter.get_finished_spans()
    (event,) = load_events(first)
    assert event[ATTR_MODEL_BACKEND] == "numpy"
    assert load_events(second) == []


def test_the_load_time_is_the_loads_not_the_calls() -> None:
    provider, exporter = traced()
    model = _SlowToLoad()
    stage = RerankStage(model, tracer_provider=provider)

    stage.run("q", CANDIDATES)

    (span,) = exporter.get_finished_spans()
    (event,) = load_events(span)
    assert LOAD_S <= event[ATTR_MODEL_LOAD_DURATION] <= LOAD_S + CLOCK_MARGIN_S
    assert event[ATTR_MODEL_BACKEND] == "sentence-transformers"  # the default of a subclass


def test_load_under_a_span_of_the_callers_records_it_there_and_the_rerank_then_has_none() -> None:
    provider, exporter = traced()
    model = _SlowToLoad()
    stage = RerankStage(model, tracer_provider=provider)

    with provider.get_tracer("warm-up").start_as_current_span("model.load"):
        model.load()
    stage.run("q", CANDIDATES)

    warm, rerank = exporter.get_finished_spans()
    assert warm.name == "model.load"
    (event,) = load_events(warm)
    assert event[ATTR_MODEL] == "slow-to-load"
    assert load_events(rerank) == []


def test_a_closed_model_loads_again_and_says_so_again() -> None:
    provider, exporter = traced()
    model = _SlowToLoad()
    stage = RerankStage(model, tracer_provider=provider)

    stage.run("q", CANDIDATES)
    model.close()
    stage.run("q", CANDIDATES)

    assert [len(load_events(s)) for s in exporter.get_finished_spans()] == [1, 1]


def test_no_recording_span_no_event_and_no_error() -> None:
    model = _SlowToLoad()
    model.load()  # no span current: nothing to say it on
    assert model.rerank("q", ["xx", "x"]) == [("xx", 2.0), ("x", 1.0)]


def test_a_failed_load_records_no_load_event() -> None:
    provider, exporter = traced()
    stage = RerankStage(_SlowToLoad(fail=True), on_error="fallback", tracer_provider=provider)

    stage.run("q", CANDIDATES)

    (span,) = exporter.get_finished_spans()
    assert load_events(span) == []
