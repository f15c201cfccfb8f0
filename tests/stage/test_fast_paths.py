"""The hot path's shortcuts give exactly what the plain way gives (issue 26).

Each shortcut of the stage and of its RERANKER span is checked against the plain way it
replaces, written out here as the specification: results mapped and sorted by a Python key,
recall order by its documented key, ``output.value`` by ``json.dumps``, the span started by the
SDK's ``start_as_current_span``, metric points only where a MeterProvider can read them, and
vouched attributes stored without the per-value check but as the SDK stores them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import retrieval_stage.spans.otel_private as otel_private
from retrieval_stage import Candidate, RerankStage
from retrieval_stage.errors import RerankProtocolError
from retrieval_stage.metrics import RerankMetrics
from retrieval_stage.models import Reranked, recall_order, reranked_outputs
from retrieval_stage.protocols import _mapped_checked, _mapped_plain, map_results
from retrieval_stage.spans.content import output_value

from ..fakes import ByLength

SCORES = st.one_of(
    st.sampled_from([0.0, -0.0, 0.5, 1.0, -1.0]),
    st.floats(allow_nan=False, allow_infinity=False),
)
RECALL_SCORES = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 0.5, 1, 2]), SCORES)


def sorted_by_spec(mapped: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Best first, ties in input order: the order map_results promises."""
    return sorted(mapped, key=lambda p: (-p[1], p[0]))


@settings(max_examples=150, deadline=None)
@given(
    scores=st.lists(SCORES, max_size=12),
    repeat=st.booleans(),
    data=st.data(),
)
def test_the_one_pass_mapping_agrees_with_the_checked_one(
    scores: list[float], repeat: bool, data: st.DataObject
) -> None:
    cands = [Candidate(f"d{i}", "t") for i in range(len(scores))]
    if repeat and cands:
        cands.append(cands[0])  # one object given twice: the checked path's business
    order = data.draw(st.permutations(range(len(cands))))
    order = order[: data.draw(st.integers(0, len(order)))]  # the reranker may return fewer
    results: list[tuple[Any, Any]] = [
        (cands[i], scores[i % len(scores)] if scores else 0.0) for i in order
    ]
    plain = _mapped_plain(cands, results)
    checked = _mapped_checked(cands, results)
    if repeat and cands:
        assert plain is None
    else:
        assert plain is not None
        assert sorted(plain) == sorted(checked)
    assert map_results(cands, results, top_k=len(results)) == sorted_by_spec(checked)


@pytest.mark.parametrize(
    ("case", "score", "message"),
    [
        ("NaN", math.nan, "result 1: score is not a finite number"),
        ("a bool", True, "result 1: score is a bool"),
        ("a string", "0.5", "result 1: score is a str"),
    ],
)
def test_an_unusual_answer_is_judged_result_by_result(case: str, score: Any, message: str) -> None:
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    results: list[tuple[Any, Any]] = [(cands[0], 0.5), (cands[1], score)]
    assert _mapped_plain(cands, results) is None
    with pytest.raises(RerankProtocolError, match=message):
        map_results(cands, results)


@pytest.mark.parametrize("other", ["a stranger", "the same candidate again"])
def test_a_result_that_is_not_a_free_candidate_is_refused(other: str) -> None:
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    results: list[tuple[Any, Any]]
    if other == "a stranger":  # equal to a candidate, but not one of them: ids join nothing
        results = [(Candidate("a", "x"), 0.5), (cands[1], 0.4)]
    else:
        results = [(cands[0], 0.5), (cands[0], 0.4)]
    assert _mapped_plain(cands, results) is None
    with pytest.raises(RerankProtocolError, match="is not one of the candidates"):
        map_results(cands, results)


def test_an_int_score_is_taken_as_a_float_as_before() -> None:
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    assert map_results(cands, [(cands[0], 1), (cands[1], 2.5)]) == [(1, 2.5), (0, 1.0)]


@settings(max_examples=100, deadline=None)
@given(st.lists(SCORES, max_size=8), st.data())
def test_outputs_built_through_the_slots_are_ordinary_rerankeds(
    scores: list[float], data: st.DataObject
) -> None:
    cands = [Candidate(f"d{i}", "t") for i in range(len(scores))]
    order = data.draw(st.permutations(range(len(cands))))
    mapped = [(i, scores[i]) for i in order]
    built = reranked_outputs(cands, mapped)
    expected = [Reranked(cands[i], score, i) for i, score in mapped]
    assert built == expected
    assert [hash(r) for r in built] == [hash(r) for r in expected]
    assert all(type(r) is Reranked and r.candidate is cands[r.input_index] for r in built)
    for r in built:
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.score = 0.0  # type: ignore[misc]


@settings(max_examples=150, deadline=None)
@given(st.lists(RECALL_SCORES, max_size=12))
def test_recall_order_is_the_documented_order(scores: list[float | None]) -> None:
    cands = [Candidate(f"d{i}", "t", s) for i, s in enumerate(scores)]
    expected = sorted(
        range(len(cands)),
        key=lambda i: (cands[i].score is None, -(cands[i].score or 0.0), i),
    )
    assert recall_order(cands) == expected


@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.text(min_size=1, max_size=12), max_size=8),
    scores=st.lists(st.one_of(SCORES, st.sampled_from([math.nan, math.inf, 3, None])), max_size=8),
    fell_back=st.booleans(),
)
def test_output_value_is_what_json_dumps_writes(
    ids: list[str], scores: list[Any], fell_back: bool
) -> None:
    outputs = [
        Reranked(Candidate(cid, "t"), scores[i] if i < len(scores) else 0.5, i)
        for i, cid in enumerate(ids)
    ]
    max_bytes = 100_000  # nothing cut: the cut is pinned in tests/spans/test_reranker.py
    if fell_back:
        expected = {"order": "recall", "documents": [{"id": r.candidate.id} for r in outputs]}
    else:
        expected = {"documents": [{"id": r.candidate.id, "score": r.score} for r in outputs]}
    written = json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
    assert output_value(outputs, fell_back=fell_back, max_bytes=max_bytes) == written


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(
        st.one_of(
            st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=6),
            st.sampled_from(['a"b', "a\\b", "a\nb", "\x00", "\x7f", "é"]),
        ),
        max_size=6,
    ),
    scores=st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.sampled_from([0.0, -0.0, 1e-4, -1e-4, 9.99e-5, 1e16, 9.99e15, -1e16, 5e-324]),
        ),
        min_size=6,
        max_size=6,
    ),
)
def test_output_value_written_whole_by_orjson_is_what_json_dumps_writes(
    ids: list[str], scores: list[float]
) -> None:
    """ASCII ids (quotes, backslashes and control characters included) and finite scores of
    every magnitude: where orjson writes the whole value, and where it must not."""
    outputs = [Reranked(Candidate(cid, "t"), scores[i], i) for i, cid in enumerate(ids)]
    expected = {"documents": [{"id": r.candidate.id, "score": r.score} for r in outputs]}
    written = json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
    assert output_value(outputs, fell_back=False, max_bytes=100_000) == written


class Boom:
    """A reranker whose failure is not a RerankError: it escapes a stage that raises."""

    provider = None
    model_name = None

    def rerank(self, query: str, items: Any, **_: Any) -> Any:
        raise ValueError("boom")


def test_an_escaping_exception_ends_the_span_as_start_as_current_span_does() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("reference")
    outer = tracer.start_span("outer")
    with trace.use_span(outer):
        with pytest.raises(ValueError, match="boom"):
            RerankStage(Boom(), tracer_provider=provider, on_error="raise").run(
                "q", [Candidate("a", "x")]
            )
        assert trace.get_current_span() is outer  # the stage's span is no longer current
        with pytest.raises(ValueError, match="boom"), tracer.start_as_current_span("reference"):
            raise ValueError("boom")
    ours, reference = exporter.get_finished_spans()
    assert ours.parent is not None
    assert ours.parent.span_id == outer.get_span_context().span_id
    assert ours.status.status_code == reference.status.status_code
    assert ours.status.description == reference.status.description == "ValueError: boom"
    assert [e.name for e in ours.events] == [e.name for e in reference.events] == ["exception"]
    assert ours.events[0].attributes is not None
    assert reference.events[0].attributes is not None
    assert (
        ours.events[0].attributes["exception.message"]
        == reference.events[0].attributes["exception.message"]
    )
    outer.end()
    provider.shutdown()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count `RerankMetrics.record` calls (points built for one call)."""
    calls: list[int] = []
    real = RerankMetrics.record

    def counting(self: RerankMetrics, **kwargs: Any) -> None:
        calls.append(1)
        real(self, **kwargs)

    monkeypatch.setattr(RerankMetrics, "record", counting)
    return calls


def test_no_metric_points_are_built_for_a_no_op_meter_provider(recorded: list[int]) -> None:
    RerankStage(ByLength(), meter_provider=NoOpMeterProvider()).run("q", [Candidate("a", "x")])
    assert recorded == []


def test_metric_points_are_recorded_where_a_reader_can_see_them(recorded: list[int]) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    RerankStage(ByLength(), meter_provider=meters).run("q", [Candidate("a", "x")])
    assert recorded == [1]
    data = reader.get_metrics_data()
    assert data is not None
    assert data.resource_metrics
    meters.shutdown()


def test_vouched_attributes_skip_the_value_check_and_land_as_the_sdk_lands_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracer = TracerProvider(span_limits=SpanLimits(max_span_attributes=50)).get_tracer("t")
    ours: Any = tracer.start_span("s", attributes={"a": 1})
    theirs: Any = tracer.start_span("s")
    theirs.set_attributes({"a": 1})
    attributes: dict[str, Any] = {"b": "x", "a": 2.5, "c": True, "d": 3}

    def refuse(_: Any) -> bool:
        raise AssertionError("vouched attributes were checked value by value")

    monkeypatch.setattr(otel_private, "plain_attributes", refuse)
    otel_private.set_span_attributes(ours, attributes, vouched=True)
    theirs.set_attributes(attributes)
    assert list(ours.attributes.items()) == list(theirs.attributes.items())
    assert list(ours.attributes) == ["b", "a", "c", "d"]  # a key set again moves to the end
    ours.end()
    theirs.end()
