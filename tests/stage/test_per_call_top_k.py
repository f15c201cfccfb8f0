"""`RerankStage.run/arun(top_k=...)`: one call's top_k, honoured and recorded (issue 24).

Haystack's rankers take ``run(top_k=...)`` per call; the stage takes it too, so an adapter has
no second call path. None keeps the stage's own top_k, 0 means all, and the span's
``reranker.top_k`` is the one the call used.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import Candidate, RerankStage, RerankTransportError

from ..fakes import ByLength, Failing

CANDIDATES = [
    Candidate("a", "x", 0.9),
    Candidate("b", "xxx", 0.5),
    Candidate("c", "xx", 0.1),
]


def _top_k(exporter: InMemorySpanExporter) -> object:
    (span,) = exporter.get_finished_spans()
    return (span.attributes or {}).get("reranker.top_k")


@pytest.mark.parametrize(
    ("per_call", "ids", "recorded"),
    [(1, ["b"], 1), (None, ["b", "c"], 2), (0, ["b", "c", "a"], None)],
)
async def test_a_calls_top_k_overrides_the_stages_and_is_the_one_recorded(
    spans: tuple[TracerProvider, InMemorySpanExporter],
    per_call: int | None,
    ids: list[str],
    recorded: int | None,
) -> None:
    provider, exporter = spans
    stage = RerankStage(ByLength(), top_k=2, tracer_provider=provider)

    out = stage.run("q", CANDIDATES, top_k=per_call)
    assert [r.candidate.id for r in out] == ids
    assert _top_k(exporter) == recorded

    exporter.clear()
    out = await stage.arun("q", CANDIDATES, top_k=per_call)
    assert [r.candidate.id for r in out] == ids
    assert _top_k(exporter) == recorded
    assert stage.top_k == 2  # the stage's own setting is untouched


def test_a_calls_top_k_cuts_the_fallback_too(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    stage = RerankStage(Failing(RerankTransportError("down")), tracer_provider=provider)

    out = stage.run("q", CANDIDATES, top_k=2)

    assert [(r.candidate.id, r.reranked) for r in out] == [("a", False), ("b", False)]
    assert _top_k(exporter) == 2


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_calls_top_k_is_checked_like_the_stages(bad: object) -> None:
    stage = RerankStage(ByLength())
    with pytest.raises(ValueError, match="top_k"):
        stage.run("q", CANDIDATES, top_k=bad)  # type: ignore[arg-type]
