"""Failover through a `RerankerChain` against a real WireMock, through `RerankStage`.

The primary is a TEI client, the secondary a Jina client (another provider and model, so the
span's attribution of the answering tier can be told apart). Every reranker answer is out of
input order, so a score mapped by position instead of by index would land on the wrong
document. Breaker cooldowns run on a fake clock: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from structlog.testing import capture_logs

from retrieval_stage import (
    AsyncRerankClient,
    AsyncRerankerChain,
    Candidate,
    RerankClient,
    Reranked,
    RerankerChain,
    RerankStage,
)
from tests.hooks import hooked_chain

from ..conftest import WireMock

Spans = tuple[TracerProvider, InMemorySpanExporter]
Flavour = Literal["sync", "async"]
FLAVOURS: list[Flavour] = ["sync", "async"]

DEADLINE_MARGIN = 3.0
"""Seconds allowed past the chain's deadline for scheduling noise on a loaded two-core
machine; every delay a broken chain would wait out is longer than deadline + margin."""

PRIMARY_MODEL = "primary-cross-encoder"
SECONDARY_MODEL = "jina-reranker-v2-base-multilingual"
KEY = "sk-live-primary-key-0123456789"
PRIMARY = "/tier0"
SECONDARY = "/tier1"
PRIMARY_PATH = PRIMARY + "/rerank"
SECONDARY_PATH = SECONDARY + "/v1/rerank"

CANDIDATES = [
    Candidate("a", "alpha document", score=0.9),
    Candidate("b", "bravo document", score=0.1),
    Candidate("c", "charlie document", score=0.5),
]
RECALL = ["a", "c", "b"]
PRIMARY_SCORES = {"b": 0.8, "c": 0.6, "a": 0.1}  # the primary's ranking: b, c, a
SECONDARY_SCORES = {"c": 0.95, "a": 0.4, "b": 0.05}  # the secondary's: c, a, b


def tei_body(scores: dict[str, float]) -> list[dict[str, Any]]:
    ids = [c.id for c in CANDIDATES]
    ranked = sorted(scores, key=lambda i: -scores[i])
    return [{"index": ids.index(i), "score": scores[i]} for i in ranked]


def jina_body(scores: dict[str, float]) -> dict[str, Any]:
    ids = [c.id for c in CANDIDATES]
    ranked = sorted(scores, key=lambda i: -scores[i])
    results = [{"index": ids.index(i), "relevance_score": scores[i]} for i in ranked]
    return {"model": SECONDARY_MODEL, "results": results, "usage": {"total_tokens": 12}}


def stub_primary_failing(wm: WireMock, **response: Any) -> None:
    # The error body echoes the key: it must reach no span, log or error.
    wm.stub_json(
        PRIMARY_PATH,
        {"error": f"model crashed (key {KEY})", "error_type": "Backend"},
        status=500,
        **response,
    )


def stub_primary_healthy(wm: WireMock) -> None:
    wm.stub(
        {
            "priority": 1,  # wins over the failing stub
            "request": {"method": "POST", "urlPath": PRIMARY_PATH},
            "response": {
                "status": 200,
                "headers": {"Content-Type": "application/json"},
                "body": json.dumps(tei_body(PRIMARY_SCORES)),
            },
        }
    )


def stub_secondary(wm: WireMock, healthy: bool = True) -> None:
    if healthy:
        wm.stub_json(SECONDARY_PATH, jina_body(SECONDARY_SCORES))
    else:
        wm.stub_json(SECONDARY_PATH, {"detail": "overloaded"}, status=503)


@dataclass
class Run:
    outputs: list[Reranked]
    seconds: float


def clients(flavour: Flavour, wm: WireMock, primary_timeout: float) -> list[Any]:
    cls = RerankClient if flavour == "sync" else AsyncRerankClient
    primary = cls(
        wm.url + PRIMARY,
        model=PRIMARY_MODEL,
        api_key=KEY,
        timeout=primary_timeout,
        max_retries=0,
    )
    secondary = cls(wm.url + SECONDARY, provider="jina", model=SECONDARY_MODEL, max_retries=0)
    return [primary, secondary]


def make_chain(
    flavour: Flavour, wm: WireMock, *, primary_timeout: float = 5.0, **kw: Any
) -> RerankerChain | AsyncRerankerChain:
    tiers = clients(flavour, wm, primary_timeout)
    if flavour == "sync":
        return RerankerChain(tiers, **kw)
    return AsyncRerankerChain(tiers, **kw)


def run(
    flavour: Flavour, chain: RerankerChain | AsyncRerankerChain, spans: Spans, calls: int = 1
) -> list[Run]:
    """`calls` stage calls over `chain`, each timed; the chain is closed afterwards."""
    stage = RerankStage(chain, tracer_provider=spans[0])
    runs: list[Run] = []
    if flavour == "sync":
        assert isinstance(chain, RerankerChain)
        with chain:
            for _ in range(calls):
                started = time.monotonic()
                outputs = stage.run("which document", CANDIDATES)
                runs.append(Run(outputs, time.monotonic() - started))
        return runs

    async def go() -> None:
        assert isinstance(chain, AsyncRerankerChain)
        async with chain:
            for _ in range(calls):
                started = time.monotonic()
                outputs = await stage.arun("which document", CANDIDATES)
                runs.append(Run(outputs, time.monotonic() - started))

    asyncio.run(go())
    return runs


def scored(outputs: list[Reranked]) -> list[tuple[str, float | None]]:
    return [(r.candidate.id, r.score) for r in outputs]


def expected(scores: dict[str, float]) -> list[tuple[str, float | None]]:
    return [(i, scores[i]) for i in sorted(scores, key=lambda i: -scores[i])]


def rerank_spans(spans: Spans) -> list[ReadableSpan]:
    return [s for s in spans[1].get_finished_spans() if s.name == "rerank"]


def events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


def assert_no_key(spans: Spans, logs: Sequence[Mapping[str, Any]]) -> None:
    for span in spans[1].get_finished_spans():
        assert KEY[:12] not in repr(dict(span.attributes or {}))
        for event in span.events:
            assert KEY[:12] not in repr(dict(event.attributes or {}))
        assert KEY[:12] not in (span.status.description or "")
    assert KEY[:12] not in repr(logs)


@pytest.fixture
def metered() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def counters(reader: InMemoryMetricReader, name: str) -> dict[tuple[Any, ...], int]:
    """The points of counter `name`, by (tier, outcome) attributes."""
    found: dict[tuple[Any, ...], int] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name != name:
                    continue
                assert isinstance(metric.data, Sum)
                for point in metric.data.data_points:
                    attrs = dict(point.attributes or {})
                    key = (attrs.get("retrieval_stage.tier"), attrs.get("retrieval_stage.outcome"))
                    found[key] = int(point.value)
    return found


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_500_primary_hands_over_to_the_healthy_secondary(
    flavour: Flavour, wm: WireMock, spans: Spans
) -> None:
    stub_primary_failing(wm)
    stub_secondary(wm)
    with capture_logs() as logs:
        (result,) = run(flavour, make_chain(flavour, wm), spans)
    # The secondary's scores, on the right documents (its answer was out of input order).
    assert scored(result.outputs) == expected(SECONDARY_SCORES)
    assert all(r.reranked for r in result.outputs)
    assert len(wm.requests(PRIMARY_PATH)) == 1
    assert len(wm.requests(SECONDARY_PATH)) == 1
    (span,) = rerank_spans(spans)
    attrs = dict(span.attributes or {})
    assert attrs["retrieval_stage.tier"] == 1
    assert attrs["retrieval_stage.provider"] == "jina"
    assert attrs["reranker.model_name"] == SECONDARY_MODEL
    assert attrs["retrieval_stage.fallback"] is False
    assert attrs["retrieval_stage.requests"] == 2  # one to each tier
    assert span.status.status_code is StatusCode.OK  # a later tier answered
    (failed,) = events(span, "rerank.tier_failed")
    assert failed["tier"] == 0
    assert failed["provider"] == "tei"
    assert failed["model"] == PRIMARY_MODEL
    assert failed["caused_by"] == "RerankStatusError"
    assert "HTTP 500" in failed["error"]
    assert "model crashed" in failed["error"]
    assert [e["event"] for e in logs if e["event"].startswith("rerank.tier")] == [
        "rerank.tier_failed"
    ]
    assert_no_key(spans, logs)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_hanging_primary_leaves_the_secondary_time_within_the_shared_deadline(
    flavour: Flavour, wm: WireMock, spans: Spans
) -> None:
    chain_timeout, primary_timeout = 3.0, 0.5
    hang_ms = int((chain_timeout + DEADLINE_MARGIN + 2) * 1000)
    stub_primary_failing(wm, fixedDelayMilliseconds=hang_ms)
    stub_secondary(wm)
    chain = make_chain(flavour, wm, primary_timeout=primary_timeout, timeout=chain_timeout)
    (result,) = run(flavour, chain, spans)
    assert scored(result.outputs) == expected(SECONDARY_SCORES)
    assert result.seconds < chain_timeout + DEADLINE_MARGIN
    assert result.seconds >= primary_timeout  # the primary was waited for, up to its own bound
    (span,) = rerank_spans(spans)
    assert dict(span.attributes or {})["retrieval_stage.tier"] == 1
    (failed,) = events(span, "rerank.tier_failed")
    assert failed["caused_by"] == "RerankTransportError"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_chain_deadline_bounds_a_primary_whose_own_timeout_is_longer(
    flavour: Flavour, wm: WireMock, spans: Spans
) -> None:
    """The primary's own timeout (30 s) would outlast the chain's 1 s: the chain's deadline,
    passed down, cuts it; no time is left for the secondary, which is skipped unasked."""
    chain_timeout = 1.0
    stub_primary_failing(
        wm, fixedDelayMilliseconds=int((chain_timeout + DEADLINE_MARGIN + 2) * 1000)
    )
    stub_secondary(wm)
    chain = make_chain(flavour, wm, primary_timeout=30.0, timeout=chain_timeout)
    (result,) = run(flavour, chain, spans)
    assert result.seconds < chain_timeout + DEADLINE_MARGIN
    assert [r.candidate.id for r in result.outputs] == RECALL
    assert not any(r.reranked for r in result.outputs)
    assert wm.requests(SECONDARY_PATH) == []
    (span,) = rerank_spans(spans)
    (skipped,) = events(span, "rerank.tier_skipped")
    assert (skipped["tier"], skipped["reason"]) == (1, "deadline")
    assert "shared deadline" in events(span, "rerank.tier_failed")[0]["error"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_breaker_skips_the_failing_primary_then_closes_after_the_cooldown(
    flavour: Flavour,
    wm: WireMock,
    spans: Spans,
    metered: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    stub_primary_failing(wm)
    stub_secondary(wm)
    clock = [500.0]
    chain = hooked_chain(
        make_chain(flavour, wm, failure_threshold=2, cooldown=30.0, meter_provider=metered[0]),
        clock=lambda: clock[0],
    )
    stage = RerankStage(chain, tracer_provider=spans[0])
    loop = asyncio.new_event_loop()  # one loop for every async call: the clients live in it

    def call() -> list[Reranked]:
        if flavour == "sync":
            return stage.run("which document", CANDIDATES)
        return loop.run_until_complete(stage.arun("which document", CANDIDATES))

    try:
        scenario(call, wm, clock, spans, metered[1])
    finally:
        if isinstance(chain, AsyncRerankerChain):
            loop.run_until_complete(chain.aclose())
        else:
            chain.close()
        loop.close()


def scenario(
    call: Any, wm: WireMock, clock: list[float], spans: Spans, reader: InMemoryMetricReader
) -> None:
    """Four calls open the primary's circuit after two; the cooldown passes on the fake
    clock; the probe answers and closes it."""
    with capture_logs() as logs:
        first = [call() for _ in range(4)]
        # Two failures opened the primary's circuit: calls 3 and 4 never reached it.
        assert len(wm.requests(PRIMARY_PATH)) == 2
        assert len(wm.requests(SECONDARY_PATH)) == 4
        clock[0] += 29.9
        call()
        assert len(wm.requests(PRIMARY_PATH)) == 2  # still cooling down
        stub_primary_healthy(wm)
        clock[0] += 0.1
        probe = call()  # half-open: one probe, which answers and closes the circuit
        after = call()
    assert len(wm.requests(PRIMARY_PATH)) == 4
    assert len(wm.requests(SECONDARY_PATH)) == 5
    for outputs in first:
        assert scored(outputs) == expected(SECONDARY_SCORES)
    assert scored(probe) == expected(PRIMARY_SCORES)
    assert scored(after) == expected(PRIMARY_SCORES)

    tiers = [dict(s.attributes or {})["retrieval_stage.tier"] for s in rerank_spans(spans)]
    assert tiers == [1, 1, 1, 1, 1, 0, 0]
    third = rerank_spans(spans)[2]
    (skipped,) = events(third, "rerank.tier_skipped")
    assert (skipped["tier"], skipped["reason"]) == (0, "circuit_open")
    assert events(third, "rerank.tier_failed") == []
    answered = dict(rerank_spans(spans)[5].attributes or {})
    assert answered["retrieval_stage.provider"] == "tei"
    assert answered["reranker.model_name"] == PRIMARY_MODEL

    changes = [e for e in logs if e["event"].startswith("rerank.breaker")]
    assert [(e["event"], e["tier"]) for e in changes] == [
        ("rerank.breaker_opened", 0),
        ("rerank.breaker_half_open", 0),
        ("rerank.breaker_closed", 0),
    ]
    assert changes[0]["failures"] == 2
    assert changes[0]["log_level"] == "warning"
    assert changes[0]["caused_by"] == "RerankStatusError"

    assert counters(reader, "retrieval_stage.rerank.breaker.openings") == {(0, None): 1}
    assert counters(reader, "retrieval_stage.rerank.tier.calls") == {
        (0, "error"): 2,
        (0, "skipped_circuit_open"): 3,
        (0, "ok"): 2,
        (1, "ok"): 5,
    }
    assert_no_key(spans, logs)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_tier_failing_falls_back_to_recall_order(
    flavour: Flavour, wm: WireMock, spans: Spans
) -> None:
    stub_primary_failing(wm)
    stub_secondary(wm, healthy=False)
    with capture_logs() as logs:
        (result,) = run(flavour, make_chain(flavour, wm), spans)
    assert [r.candidate.id for r in result.outputs] == RECALL
    assert [r.score for r in result.outputs] == [0.9, 0.5, 0.1]  # recall scores
    assert not any(r.reranked for r in result.outputs)
    (span,) = rerank_spans(spans)
    attrs = dict(span.attributes or {})
    assert attrs["retrieval_stage.fallback"] is True
    assert attrs["error.type"] == "RerankChainError"
    assert "retrieval_stage.tier" not in attrs  # no tier answered
    assert attrs["retrieval_stage.provider"] == "chain"
    assert attrs["retrieval_stage.requests"] == 2
    assert span.status.status_code is StatusCode.ERROR
    description = span.status.description or ""
    assert description.startswith("fell back to recall order: RerankChainError")
    assert "tier 0 (tei)" in description
    assert "tier 1 (jina)" in description
    assert [e["caused_by"] for e in events(span, "rerank.tier_failed")] == [
        "RerankStatusError",
        "RerankStatusError",
    ]
    (fallback,) = [e for e in logs if e["event"] == "rerank.fallback"]
    assert fallback["caused_by"] == "RerankChainError"
    assert_no_key(spans, logs)
