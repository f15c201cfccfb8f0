"""The chain with broken tiers: any exception of a tier is its failure (counted by its
breaker, cleaned on the span) except cancellation; a hung sync tier fills only its own pool;
an answer longer than `top_k` is cut to it. And `RerankStage(on_error="fallback")` falls back
on a reranker's own error types too."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import (
    AsyncRerankerChain,
    Candidate,
    RerankChainError,
    RerankerChain,
    RerankStage,
)
from retrieval_stage.failover import BreakerState

T = TypeVar("T")
Spans = tuple[TracerProvider, InMemorySpanExporter]

CANDS = [Candidate(c, f"document {c}", 1.0 - i / 10) for i, c in enumerate("abcde")]
SECRET = "SECRET-in-the-vendor-message"


class VendorDown:
    """A vendor SDK's tier: it raises the SDK's own exception type, quoting a document."""

    provider = "vendor"

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error or ConnectionError(f"{SECRET}: could not reach the service")
        self.calls = 0

    def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[T, float]]:
        self.calls += 1
        raise self.error


class Reverse:
    """Answers every item, in reverse input order, ignoring `top_k`."""

    provider = "reverse"

    def __init__(self) -> None:
        self.calls = 0

    def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[T, float]]:
        self.calls += 1
        n = len(items)
        return [(items[i], (i + 1) / n) for i in reversed(range(n))]


class Hung:
    """A sync tier that blocks until released (a socket with no timeout, a deadlock)."""

    provider = "hung"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0

    def rerank(self, query: str, items: Sequence[T], **_: Any) -> list[tuple[T, float]]:
        self.entered += 1
        self.release.wait(60)
        return [(item, 0.0) for item in items]


def ids(results: Sequence[tuple[Candidate, float]]) -> list[str]:
    return [item.id for item, _ in results]


def test_a_vendor_error_hands_the_call_on_and_counts_on_the_breaker(spans: Spans) -> None:
    vendor = VendorDown()
    chain = RerankerChain([vendor, Reverse()], failure_threshold=2)
    stage = RerankStage(chain, tracer_provider=spans[0])
    outputs = stage.run("q", CANDS)
    assert [r.candidate.id for r in outputs] == ["e", "d", "c", "b", "a"]
    assert chain.breakers[0].failures == 1
    stage.run("q", CANDS)
    assert chain.breakers[0].state is BreakerState.open
    stage.run("q", CANDS)
    assert vendor.calls == 2, "an open circuit costs no call"
    span = spans[1].get_finished_spans()[0]
    (failed,) = [e for e in span.events if e.name == "rerank.tier_failed"]
    assert dict(failed.attributes or {})["caused_by"] == "ConnectionError"
    for finished in spans[1].get_finished_spans():
        for event in finished.events:
            assert "document a" not in str(dict(event.attributes or {}))


def test_every_tier_failing_with_vendor_errors_is_one_chain_error() -> None:
    chain = RerankerChain([VendorDown(), VendorDown(TimeoutError("slow"))])
    with pytest.raises(RerankChainError) as failed:
        chain.rerank("q", CANDS)
    assert [f.cause for f in failed.value.failures] == ["ConnectionError", "TimeoutError"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(3)])
def test_an_interrupt_is_not_a_tier_failure(stop: BaseException) -> None:
    chain = RerankerChain([VendorDown(stop), Reverse()], failure_threshold=1)
    with pytest.raises(type(stop)):
        chain.rerank("q", CANDS)
    assert chain.breakers[0].state is BreakerState.closed
    assert chain.breakers[0].failures == 0


def test_a_cancelled_async_call_is_not_a_tier_failure() -> None:
    class Slow:
        provider = "slow"

        async def rerank(self, query: str, items: Sequence[T], **_: Any) -> Any:
            await asyncio.sleep(60)

    async def main() -> AsyncRerankerChain:
        chain = AsyncRerankerChain([Slow(), Reverse()], failure_threshold=1)
        task = asyncio.ensure_future(chain.rerank("q", CANDS))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return chain

    chain = asyncio.run(main())
    assert chain.breakers[0].failures == 0


def test_the_async_chain_counts_a_vendor_error_as_the_tiers_failure() -> None:
    async def main() -> tuple[list[str], int]:
        chain = AsyncRerankerChain([VendorDown(), Reverse()], failure_threshold=5)
        results = await chain.rerank("q", CANDS)
        return ids(results), chain.breakers[0].failures

    assert asyncio.run(main()) == (["e", "d", "c", "b", "a"], 1)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_chain_answers_no_more_than_top_k(flavour: str) -> None:
    if flavour == "sync":
        got = RerankerChain([Reverse()]).rerank_response("q", CANDS, top_k=2)
    else:
        got = asyncio.run(AsyncRerankerChain([Reverse()]).rerank_response("q", CANDS, top_k=2))
    assert ids(got.results) == ["e", "d"]


def test_a_hung_sync_tier_cannot_take_the_threads_of_the_tier_behind_it() -> None:
    """The first burst hangs in tier 0 until the deadline and opens its circuit; the calls
    after go straight to tier 1, which must still find a thread (the default pool is full of
    tier 0's hung calls: more of them than it has threads)."""
    hung, healthy = Hung(), Reverse()

    async def main() -> list[Any]:
        chain = AsyncRerankerChain([hung, healthy], timeout=0.5, failure_threshold=1)
        try:
            burst = [chain.rerank("q", CANDS) for _ in range(12)]
            await asyncio.gather(*burst, return_exceptions=True)
            assert chain.breakers[0].state is BreakerState.open
            after = [chain.rerank("q", CANDS) for _ in range(4)]
            return list(await asyncio.gather(*after, return_exceptions=True))
        finally:
            hung.release.set()
            await chain.aclose()

    answers = asyncio.run(main())
    assert [ids(a) if isinstance(a, list) else repr(a) for a in answers] == [
        ["e", "d", "c", "b", "a"]
    ] * 4
    assert hung.entered >= 6
    assert healthy.calls == 4


def test_the_stage_falls_back_on_a_rerankers_own_error_type(spans: Spans) -> None:
    stage = RerankStage(VendorDown(), tracer_provider=spans[0])
    outcome = stage.run_outcome("q", CANDS)
    assert [r.candidate.id for r in outcome.outputs] == ["a", "b", "c", "d", "e"]
    assert not any(r.reranked for r in outcome.outputs)
    (span,) = spans[1].get_finished_spans()
    assert SECRET not in str(dict(span.attributes or {}))
    assert all(SECRET not in str(dict(e.attributes or {})) for e in span.events)


def test_the_async_stage_falls_back_on_a_rerankers_own_error_type() -> None:
    outputs = asyncio.run(RerankStage(VendorDown()).arun("q", CANDS))
    assert [r.candidate.id for r in outputs] == ["a", "b", "c", "d", "e"]


def test_a_stage_that_raises_still_raises_the_rerankers_own_error() -> None:
    with pytest.raises(ConnectionError):
        RerankStage(VendorDown(), on_error="raise").run("q", CANDS)
