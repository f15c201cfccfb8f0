"""The quality signals on a real stage call: on the RERANKER span, as histograms, and only
when someone is listening (a recording span or a configured MeterProvider), never on a fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from retrieval_stage import Candidate, RerankError, RerankResponse, RerankStage
from retrieval_stage import stage as stage_module

from ..fakes import Failing, FixedScores, Reverse

T = TypeVar("T")

QUALITY_KEYS = {
    "retrieval_stage.quality.kendall_tau",
    "retrieval_stage.quality.topk_overlap",
    "retrieval_stage.quality.max_promotion",
    "retrieval_stage.quality.top_score",
    "retrieval_stage.quality.score_margin",
    "retrieval_stage.quality.rbo",
    "retrieval_stage.quality.score_spread",
}
TAU = "retrieval_stage.rerank.kendall_tau_normalized"
TAU_DEPRECATED = "retrieval_stage.rerank.kendall_tau"  # the same points, for one release
HISTOGRAMS = {
    TAU,
    TAU_DEPRECATED,
    "retrieval_stage.rerank.topk_overlap",
    "retrieval_stage.rerank.max_promotion",
    "retrieval_stage.rerank.top_score",
    "retrieval_stage.rerank.score_margin",
    "retrieval_stage.rerank.rbo",
    "retrieval_stage.rerank.score_spread",
}


class InRecallOrder:
    """Returns the candidates as recall ranked them, with descending scores, and reports a
    different model than it was configured with (as a server's alias would)."""

    provider = "echo"
    model_name = "configured-model"

    def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        ranked = [(item, 10.0 - i) for i, item in enumerate(items)]
        return RerankResponse(results=ranked[: top_k or None], model="served-model-v2")

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        return self.rerank_response(query, items, text=text, top_k=top_k).results


def pool(n: int = 6) -> list[Candidate]:
    return [Candidate(f"d{i}", f"text {i}", score=1.0 - i / 10) for i in range(n)]


def telemetry() -> tuple[TracerProvider, InMemorySpanExporter, MeterProvider, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return tracer_provider, exporter, MeterProvider(metric_readers=[reader]), reader


def points(reader: InMemoryMetricReader) -> dict[str, list[HistogramDataPoint]]:
    data = reader.get_metrics_data()
    found: dict[str, list[HistogramDataPoint]] = {}
    if data is None:
        return found
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name in HISTOGRAMS:
                    found[metric.name] = list(metric.data.data_points)  # type: ignore[arg-type]
    return found


def test_a_reranker_returning_recall_order_shows_tau_one_and_overlap_one() -> None:
    tracer_provider, exporter, meter_provider, reader = telemetry()
    stage = RerankStage(
        InRecallOrder(), top_k=3, tracer_provider=tracer_provider, meter_provider=meter_provider
    )

    stage.run("q", pool())

    (span,) = exporter.get_finished_spans()
    quality = {k: v for k, v in (span.attributes or {}).items() if k in QUALITY_KEYS}
    assert quality == {
        "retrieval_stage.quality.kendall_tau": 1.0,
        "retrieval_stage.quality.topk_overlap": 1.0,
        "retrieval_stage.quality.max_promotion": 3,
        "retrieval_stage.quality.top_score": 10.0,
        "retrieval_stage.quality.score_margin": 1.0,
        "retrieval_stage.quality.rbo": 1.0,
        "retrieval_stage.quality.score_spread": 2.0,  # 10 - 8, the top 3
    }
    found = points(reader)
    assert set(found) == HISTOGRAMS
    for name, (point,) in found.items():
        assert point.count == 1, name
        # The configured model, not the one the response named; and the provider.
        assert dict(point.attributes or {}) == {
            "retrieval_stage.model": "configured-model",
            "retrieval_stage.provider": "echo",
        }
    # The histogram holds (1 + tau) / 2 (no negative values): tau = 1 is recorded as 1, alone
    # above the 0.99995 boundary the alert rules count.
    tau = found[TAU][0]
    assert tau.sum == 1.0
    assert tau.explicit_bounds[-1] == 0.99995
    assert tau.bucket_counts[-1] == 1
    assert found["retrieval_stage.rerank.topk_overlap"][0].sum == 1.0
    assert found["retrieval_stage.rerank.rbo"][0].sum == 1.0
    assert found["retrieval_stage.rerank.rbo"][0].bucket_counts[-1] == 1  # alone above 0.9999
    assert found["retrieval_stage.rerank.score_spread"][0].sum == 2.0


def test_the_tau_histogram_says_what_it_holds_and_the_old_name_says_deprecated() -> None:
    _tracer_provider, _, meter_provider, reader = telemetry()
    stage = RerankStage(InRecallOrder(), top_k=3, meter_provider=meter_provider)
    stage.run("q", pool())

    data = reader.get_metrics_data()
    assert data is not None
    described = {
        metric.name: metric.description
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }
    assert described[TAU].startswith("(1 + τ)/2, in [0, 1]")
    assert described[TAU_DEPRECATED].startswith(f"Deprecated, use {TAU}")


def test_negative_tau_and_top_score_reach_the_histograms_in_non_negative_form() -> None:
    tracer_provider, exporter, meter_provider, reader = telemetry()
    stage = RerankStage(
        FixedScores({f"d{i}": -4.0 + i for i in range(4)}),  # reverses recall; logits < 0
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )

    stage.run("q", list(reversed(pool(4))))  # given d3..d0; recall order is d0..d3

    attributes = exporter.get_finished_spans()[0].attributes or {}
    assert attributes["retrieval_stage.quality.kendall_tau"] == -1.0  # exact on the span
    assert attributes["retrieval_stage.quality.top_score"] == -1.0  # d3
    found = points(reader)
    assert found[TAU][0].sum == 0.0  # (1 - 1) / 2
    assert found[TAU][0].count == 1
    # The deprecated name holds the same point, so a dashboard on it reads the same.
    deprecated = found[TAU_DEPRECATED][0]
    assert (deprecated.sum, deprecated.count) == (0.0, 1)
    assert deprecated.bucket_counts == found[TAU][0].bucket_counts
    assert found["retrieval_stage.rerank.top_score"][0].sum == 0.0  # counted, in the lowest
    assert found["retrieval_stage.rerank.top_score"][0].bucket_counts[0] == 1
    # Reversed, k = 4: overlap 1 but RBO of [3, 2, 1, 0] vs [0, 1, 2, 3], X = 0, 0, 2, 4:
    # 0.1/0.9 * (2/3 * 0.729 + 0.6561) + 0.6561 = 0.783; the logits -1..-4 spread by 3.
    assert attributes["retrieval_stage.quality.rbo"] == pytest.approx(0.783)
    assert attributes["retrieval_stage.quality.score_spread"] == 3.0
    assert found["retrieval_stage.rerank.topk_overlap"][0].sum == 1.0
    assert found["retrieval_stage.rerank.rbo"][0].sum == pytest.approx(0.783)
    assert found["retrieval_stage.rerank.score_spread"][0].sum == 3.0


def test_signals_compare_everything_scored_not_only_what_the_threshold_kept() -> None:
    tracer_provider, exporter, _, _ = telemetry()
    # Recall order d0..d5; the reranker reverses it (scores 1.0, 0.99, ...).
    stage = RerankStage(Reverse(), top_k=2, min_score=0.995, tracer_provider=tracer_provider)

    out = stage.run("q", pool())

    assert [r.candidate.id for r in out] == ["d5"]  # min_score kept one of the top 2
    attributes = exporter.get_finished_spans()[0].attributes or {}
    assert attributes["retrieval_stage.quality.kendall_tau"] == -1.0
    assert attributes["retrieval_stage.quality.topk_overlap"] == 0.0  # {d5, d4} vs {d0, d1}
    assert attributes["retrieval_stage.quality.max_promotion"] == 6
    assert attributes["retrieval_stage.quality.score_margin"] == pytest.approx(0.01)
    assert attributes["retrieval_stage.quality.rbo"] == 0.0  # [d5, d4] vs [d0, d1]: disjoint
    assert attributes["retrieval_stage.quality.score_spread"] == pytest.approx(0.01)


def test_no_recall_scores_no_tau_on_the_span_or_the_histogram() -> None:
    tracer_provider, exporter, meter_provider, reader = telemetry()
    unscored = [Candidate(f"d{i}", "t") for i in range(4)]
    stage = RerankStage(
        FixedScores({"d0": 0.1, "d1": 0.9, "d2": 0.5, "d3": 0.3}),
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )

    stage.run("q", unscored)

    attributes = exporter.get_finished_spans()[0].attributes or {}
    assert "retrieval_stage.quality.kendall_tau" not in attributes
    assert attributes["retrieval_stage.quality.max_promotion"] == 4  # d3, last in input order
    assert set(points(reader)) == HISTOGRAMS - {TAU, TAU_DEPRECATED}


def test_a_fallback_has_no_quality_signals() -> None:
    tracer_provider, exporter, meter_provider, reader = telemetry()
    stage = RerankStage(
        Failing(RerankError("down")),
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )

    stage.run("q", pool())

    attributes = exporter.get_finished_spans()[0].attributes or {}
    assert attributes["retrieval_stage.fallback"] is True
    assert not QUALITY_KEYS & set(attributes)
    assert points(reader) == {}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the stage's calls of `rerank_quality`."""
    calls: list[int] = []
    real = stage_module.rerank_quality

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(stage_module, "rerank_quality", counting)
    return calls


def test_nobody_listening_nothing_computed(counted: list[int]) -> None:
    sampled_out = TracerProvider(sampler=ALWAYS_OFF)
    # No meter provider given and none set globally: the API's placeholder drops points.
    stage = RerankStage(Reverse(), tracer_provider=sampled_out)

    assert len(stage.run("q", pool())) == 6
    assert counted == []


def test_metrics_alone_are_reason_enough(counted: list[int]) -> None:
    _, _, meter_provider, reader = telemetry()
    stage = RerankStage(
        Reverse(), tracer_provider=TracerProvider(sampler=ALWAYS_OFF), meter_provider=meter_provider
    )

    stage.run("q", pool())

    assert counted == [1]
    assert set(points(reader)) == HISTOGRAMS


def test_a_recording_span_alone_is_reason_enough(counted: list[int]) -> None:
    tracer_provider, exporter, _, _ = telemetry()
    stage = RerankStage(Reverse(), tracer_provider=tracer_provider)

    stage.run("q", pool())

    assert counted == [1]
    assert set(exporter.get_finished_spans()[0].attributes or {}) >= QUALITY_KEYS
