"""`RerankerChain` with in-process rerankers of a user's kind: contract checks, sanitising,
what escapes, cancellation. The real-server cases are in tests/failover/test_chain_wiremock.py."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage import (
    AsyncRerankerChain,
    Candidate,
    RerankChainError,
    RerankClient,
    RerankerChain,
    RerankError,
    RerankStage,
)
from retrieval_stage.failover import BreakerState
from tests.hooks import hooked_chain

T = TypeVar("T")
Spans = tuple[TracerProvider, InMemorySpanExporter]

CANDS = [Candidate("a", "the first document text", 0.3), Candidate("b", "second", 0.9)]


class Failing:
    """A user's reranker whose error quotes a URL credential and a document."""

    provider = "mine"
    model_name = "mine-v1"

    def __init__(self) -> None:
        self.calls = 0

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        self.calls += 1
        raise RerankError(
            "POST https://user:hunter2-pass@api.example/rerank failed on 'the first document text'"
        )


class Answering:
    """Scores items in reverse input order (best first), as the caller's own objects."""

    provider = "other"
    model_name = "other-v2"

    def __init__(self, result: Callable[[Sequence[Any]], list[tuple[Any, float]]] | None = None):
        self.calls = 0
        self.result = result

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        self.calls += 1
        if self.result is not None:
            return self.result(items)
        n = len(items)
        return [(items[i], (i + 1) / n) for i in reversed(range(n))]


class Raising:
    provider = "buggy"

    def rerank(self, query: str, items: Sequence[T], **kw: Any) -> list[tuple[T, float]]:
        raise ValueError("a bug, not a rerank failure")


class Hanging:
    provider = "slow"

    def __init__(self) -> None:
        self.cancelled = False

    async def rerank(self, query: str, items: Sequence[T], **kw: Any) -> list[tuple[T, float]]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


def test_the_next_tier_answers_and_scores_stay_on_their_documents(spans: Spans) -> None:
    failing, answering = Failing(), Answering()
    stage = RerankStage(RerankerChain([failing, answering]), tracer_provider=spans[0])
    outputs = stage.run("q", CANDS)
    assert [(r.candidate.id, r.score) for r in outputs] == [("b", 1.0), ("a", 0.5)]
    (span,) = spans[1].get_finished_spans()
    attrs = dict(span.attributes or {})
    assert attrs["retrieval_stage.tier"] == 1
    assert attrs["retrieval_stage.provider"] == "other"
    assert attrs["reranker.model_name"] == "other-v2"


def test_a_failed_tiers_message_is_sanitised_on_the_span_and_in_the_error(spans: Spans) -> None:
    stage = RerankStage(RerankerChain([Failing()]), tracer_provider=spans[0])
    stage.run("q", CANDS)
    (span,) = spans[1].get_finished_spans()
    (event,) = [e for e in span.events if e.name == "rerank.tier_failed"]
    message = str((event.attributes or {})["error"])
    assert "hunter2" not in message
    assert "the first document text" not in message
    assert "<echo removed>" in message
    assert "hunter2" not in (span.status.description or "")
    assert "the first document text" not in (span.status.description or "")


def test_an_answer_that_breaks_the_contract_hands_over_to_the_next_tier() -> None:
    foreign = Candidate("x", "not given")
    liar = Answering(lambda items: [(foreign, 1.0), (items[0], 0.5)])
    honest = Answering()
    chain = RerankerChain([liar, honest], failure_threshold=1)
    results = chain.rerank("q", CANDS)
    assert [item.id for item, _ in results] == ["b", "a"]
    assert honest.calls == 1
    assert chain.breakers[0].state is BreakerState.open


def test_an_error_outside_the_rerank_tree_is_the_tiers_failure_too() -> None:
    """A vendor SDK raises its own types: the next tier answers, and the breaker counts it."""
    chain = RerankerChain([Raising(), Answering()], failure_threshold=1)
    assert [item.id for item, _ in chain.rerank("q", CANDS)] == ["b", "a"]
    assert chain.breakers[0].state is BreakerState.open
    assert chain.breakers[0].failures == 1


def test_every_tier_failing_raises_one_error_naming_each_tier() -> None:
    clock = [0.0]
    chain = hooked_chain(
        RerankerChain([Failing(), Failing()], failure_threshold=1), clock=lambda: clock[0]
    )
    with pytest.raises(RerankChainError) as first:
        chain.rerank("q", CANDS)
    assert [(f.tier, f.cause) for f in first.value.failures] == [
        (0, "RerankError"),
        (1, "RerankError"),
    ]
    with pytest.raises(RerankChainError) as second:  # both circuits open: no call at all
        chain.rerank("q", CANDS)
    assert [f.cause for f in second.value.failures] == ["circuit_open", "circuit_open"]
    assert [t.calls for t in chain.tiers] == [1, 1]
    again = pickle.loads(pickle.dumps(second.value))
    assert again.failures == second.value.failures
    assert str(again) == str(second.value)


def test_empty_items_call_no_tier() -> None:
    tier = Answering()
    assert RerankerChain([tier]).rerank("q", []) == []
    assert tier.calls == 0


def test_construction_refuses_what_it_cannot_drive() -> None:
    with pytest.raises(ValueError, match="at least one tier"):
        RerankerChain([])
    with pytest.raises(TypeError, match="tier 1 must have a rerank"):
        RerankerChain([Answering(), object()])
    with pytest.raises(TypeError, match="use AsyncRerankerChain"):
        RerankerChain([Hanging()])
    with pytest.raises(ValueError, match="failure_threshold"):
        RerankerChain([Answering()], failure_threshold=0)
    with pytest.raises(ValueError, match="timeout"):
        RerankerChain([Answering()], timeout=-1.0)


def test_the_repr_shows_no_key() -> None:
    client = RerankClient("http://127.0.0.1:9", api_key="sk-secret-value-123")
    with RerankerChain([client]) as chain:
        assert "sk-secret" not in repr(chain)
        assert "RerankClient(" in repr(chain)


def test_an_async_tier_is_cancelled_at_the_chain_deadline() -> None:
    hanging, answering = Hanging(), Answering()

    async def go() -> tuple[list[tuple[Candidate, float]], float]:
        chain = AsyncRerankerChain([hanging, answering], timeout=0.2)
        started = asyncio.get_running_loop().time()
        with pytest.raises(RerankChainError, match="deadline"):
            await chain.rerank("q", CANDS)
        return [], asyncio.get_running_loop().time() - started

    _, seconds = asyncio.run(go())
    assert hanging.cancelled
    assert seconds < 0.2 + 3.0  # the deadline plus a generous scheduling margin
    assert answering.calls == 0  # no time was left for it


def test_a_cancelled_probe_frees_the_half_open_slot() -> None:
    clock = [0.0]
    hanging = Hanging()

    async def go() -> None:
        chain = hooked_chain(
            AsyncRerankerChain([hanging, Answering()], failure_threshold=1, cooldown=5.0),
            clock=lambda: clock[0],
        )
        breaker = chain.breakers[0]
        permit, _ = breaker.acquire()
        assert permit is not None
        breaker.failure(permit)  # opened
        clock[0] += 5.0
        task = asyncio.create_task(chain.rerank("q", CANDS))
        await asyncio.sleep(0.01)  # the probe is out, hanging
        assert breaker.state is BreakerState.half_open
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        permit, _ = breaker.acquire()  # the next call may probe
        assert permit is not None
        assert permit.probe

    asyncio.run(go())


def test_sync_tiers_in_an_async_chain_run_in_a_thread() -> None:
    chain = AsyncRerankerChain([Failing(), Answering()])
    results = asyncio.run(chain.rerank("q", CANDS))
    assert [item.id for item, _ in results] == ["b", "a"]


class FailingAsync:
    provider = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    async def rerank(self, query: str, items: Sequence[T], **kw: Any) -> list[tuple[T, float]]:
        self.calls += 1
        await asyncio.sleep(0)  # every task is in flight before any failure comes back
        raise RerankError("down")


def test_concurrent_tasks_open_the_circuit_once_and_all_get_their_answer() -> None:
    failing = FailingAsync()

    async def go() -> list[list[tuple[Candidate, float]]]:
        chain = AsyncRerankerChain([failing, Answering()], failure_threshold=3, cooldown=60.0)
        first = await asyncio.gather(*(chain.rerank("q", CANDS) for _ in range(40)))
        assert chain.breakers[0].state is BreakerState.open
        second = await asyncio.gather(*(chain.rerank("q", CANDS) for _ in range(10)))
        return [*first, *second]

    with capture_logs() as logs:
        results = asyncio.run(go())
    assert all([item.id for item, _ in r] == ["b", "a"] for r in results)
    assert failing.calls == 40  # all in flight at once; then the open circuit stops the rest
    opened = [e for e in logs if e["event"] == "rerank.breaker_opened"]
    assert len(opened) == 1


def test_an_answer_that_is_not_even_a_list_counts_as_the_tiers_failure() -> None:
    broken = Answering(lambda items: None)  # type: ignore[arg-type,return-value]
    chain = RerankerChain([broken, Answering()], failure_threshold=1, cooldown=0.0)
    assert [item.id for item, _ in chain.rerank("q", CANDS)] == ["b", "a"]
    assert chain.breakers[0].state is BreakerState.open
    chain.rerank("q", CANDS)  # cooldown 0: the probe goes out, fails, and frees its slot
    assert broken.calls == 2
    assert chain.breakers[0].state is BreakerState.open
