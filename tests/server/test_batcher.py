"""The batcher's bookkeeping, with a scorer whose score names its pair: whatever the budgets,
arrival order and sizes, every request gets back exactly the scores of its own texts, in its
own order, and no batch breaks its budget except a lone slice that cannot be cut."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage.server.batcher import Batch, Batcher, ClientGone, plan_slices
from retrieval_stage.server.scorers import Group
from retrieval_stage.server.wire import ApiError


def pair_score(query: str, text: str) -> float:
    """A score only this (query, text) pair gets."""
    return zlib.crc32(f"{query}\x00{text}".encode()) / 2**32


class NamingScorer:
    kind = "local"
    model_id = "naming"
    max_input_length = 512

    def __init__(self, splittable: bool = True, fail_on: str | None = None) -> None:
        self.splittable = splittable
        self.fail_on = fail_on
        self.batches: list[list[Group]] = []

    def load(self) -> None:
        return None

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        return 1, [len(t) for t in texts]

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        self.batches.append(list(groups))
        if any(g.query == self.fail_on for g in groups):
            raise RuntimeError("boom")
        return [[pair_score(g.query, t) for t in g.texts] for g in groups]


def run_requests(
    requests: list[tuple[str, list[str]]],
    scorer: NamingScorer,
    *,
    max_pairs: int,
    max_tokens: int,
) -> tuple[list[list[float] | BaseException], list[Batch]]:
    batches: list[Batch] = []

    async def main() -> list[list[float] | BaseException]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                scorer,
                pool,
                max_batch_pairs=max_pairs,
                max_batch_tokens=max_tokens,
                max_queue=10_000,
                batch_wait=0.001,
                max_request_tokens=10**9,
                on_batch=batches.append,
            )
            batcher.start()
            tickets = [
                batcher.submit(Group(q, tuple(t)), [len(x) for x in t], 1, None)
                for q, t in requests
            ]
            results = await asyncio.gather(*(t.future for t in tickets), return_exceptions=True)
            await batcher.stop()
            return list(results)

    return asyncio.run(main()), batches


texts_strategy = st.lists(st.text("abcdefgh", min_size=1, max_size=12), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(texts_strategy, min_size=1, max_size=12),
    max_pairs=st.integers(1, 40),
    max_tokens=st.integers(1, 200),
)
def test_every_request_gets_exactly_its_own_scores(
    requests: list[list[str]], max_pairs: int, max_tokens: int
) -> None:
    named = [(f"query-{i}", texts) for i, texts in enumerate(requests)]
    scorer = NamingScorer()
    results, batches = run_requests(named, scorer, max_pairs=max_pairs, max_tokens=max_tokens)
    for (query, texts), got in zip(named, results, strict=True):
        assert got == [pair_score(query, t) for t in texts]
    for batch in batches:
        pieces = len(batch.shares)
        assert batch.pairs <= max_pairs or pieces == 1
        assert batch.tokens <= max_tokens or (pieces == 1 and batch.shares[0].pairs == 1)
    assert sum(b.pairs for b in batches) == sum(len(t) for t in requests)


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(1, 50), max_size=40), pairs=st.integers(1, 10))
def test_slices_cover_a_request_in_order_within_the_budget(tokens: list[int], pairs: int) -> None:
    slices = plan_slices(tokens, 3, max_pairs=pairs, max_tokens=60)
    assert [i for start, end in slices for i in range(start, end)] == list(range(len(tokens)))
    for start, end in slices:
        assert end - start <= pairs
        assert 3 + sum(tokens[start:end]) <= 60 or end - start == 1


def test_requests_that_are_not_splittable_run_whole() -> None:
    scorer = NamingScorer(splittable=False)
    texts = [f"t{i}" for i in range(30)]
    results, batches = run_requests([("q", texts)], scorer, max_pairs=4, max_tokens=8)
    assert results[0] == [pair_score("q", t) for t in texts]
    assert [b.pairs for b in batches] == [30]


def test_a_failed_batch_fails_only_its_requests_with_a_backend_error() -> None:
    scorer = NamingScorer(fail_on="bad")
    requests = [("good-1", ["a"] * 3), ("bad", ["b"] * 3), ("good-2", ["c"] * 3)]
    # Three pairs a batch: each request is its own batch.
    results, batches = run_requests(requests, scorer, max_pairs=3, max_tokens=1000)
    assert results[0] == [pair_score("good-1", "a")] * 3
    assert isinstance(results[1], ApiError)
    assert (results[1].status, results[1].kind) == (424, "Backend")
    assert results[2] == [pair_score("good-2", "c")] * 3
    assert [b.error is not None for b in batches] == [False, True, False]


def test_a_full_queue_is_refused_with_429() -> None:
    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                NamingScorer(),
                pool,
                max_batch_pairs=8,
                max_batch_tokens=100,
                max_queue=2,
                batch_wait=0.5,
                max_request_tokens=100,
            )  # not started: nothing leaves the queue
            batcher.submit(Group("q", ("a",)), [1], 1, None)
            batcher.submit(Group("q", ("b",)), [1], 1, None)
            with pytest.raises(ApiError) as refused:
                batcher.submit(Group("q", ("c",)), [1], 1, None)
            assert (refused.value.status, refused.value.message) == (429, "Model is overloaded")
            await batcher.stop()

    asyncio.run(main())


class HeldScorer(NamingScorer):
    """Scores as `NamingScorer`, but the first batch waits on the model thread until released:
    whatever is submitted meanwhile stays queued."""

    def __init__(self, kind: str = "local") -> None:
        super().__init__()
        self.kind = kind
        self.entered = threading.Event()
        self.release = threading.Event()

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30), "the test never released the model"
        return super().score(groups)


def held_batcher(scorer: NamingScorer, pool: ThreadPoolExecutor, **budget: int) -> Batcher:
    return Batcher(
        scorer,
        pool,
        max_batch_pairs=budget.get("max_pairs", 64),
        max_batch_tokens=1000,
        max_queue=100,
        batch_wait=0.0,
        max_request_tokens=budget.get("max_request_tokens", 1000),
    )


async def until(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.005)


def scored_queries(scorer: NamingScorer) -> list[str]:
    return [g.query for batch in scorer.batches for g in batch]


def test_work_for_a_client_that_went_away_is_never_scored() -> None:
    async def main() -> None:
        scorer = HeldScorer()
        with ThreadPoolExecutor(1) as pool:
            batcher = held_batcher(scorer, pool)
            batcher.start()
            first = batcher.submit(Group("first", ("a",)), [1], 1, None)
            await until(scorer.entered)  # the model thread is busy with `first`
            left = batcher.submit(Group("left", ("b", "c")), [1, 1], 1, None)
            stays = batcher.submit(Group("stays", ("d",)), [1], 1, None)
            assert batcher.depth == 2
            hung_up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiting = asyncio.ensure_future(batcher.wait(left, hung_up))
            await asyncio.sleep(0)
            hung_up.set_result(None)  # what the server sees when the client disconnects
            with pytest.raises(ClientGone):
                await waiting
            assert left.future.cancelled()
            assert batcher.depth == 1
            scorer.release.set()
            never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            assert await batcher.wait(stays, never) == [pair_score("stays", "d")]
            assert await first.future == [pair_score("first", "a")]
            await batcher.stop()
        assert scored_queries(scorer) == ["first", "stays"]

    asyncio.run(main())


def test_a_cancelled_wait_abandons_its_ticket() -> None:
    """An ASGI server that cancels the handler when the client goes away reaches the queue too."""

    async def main() -> None:
        scorer = HeldScorer()
        with ThreadPoolExecutor(1) as pool:
            batcher = held_batcher(scorer, pool)
            batcher.start()
            batcher.submit(Group("first", ("a",)), [1], 1, None)
            await until(scorer.entered)
            left = batcher.submit(Group("left", ("b",)), [1], 1, None)
            never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiting = asyncio.ensure_future(batcher.wait(left, never))
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            scorer.release.set()
            after = batcher.submit(Group("after", ("c",)), [1], 1, None)
            assert await after.future == [pair_score("after", "c")]
            await batcher.stop()
        assert scored_queries(scorer) == ["first", "after"]

    asyncio.run(main())


def test_stop_answers_every_request_queued_or_on_the_model_thread_with_503() -> None:
    async def main() -> None:
        scorer = HeldScorer()
        with ThreadPoolExecutor(1) as pool:
            batcher = held_batcher(scorer, pool)
            batcher.start()
            running = batcher.submit(Group("running", ("a",)), [1], 1, None)
            await until(scorer.entered)
            queued = batcher.submit(Group("queued", ("b",)), [1], 1, None)
            stopping = asyncio.ensure_future(batcher.stop())
            await asyncio.sleep(0.05)
            for ticket in (running, queued):
                assert ticket.future.done()
                error = ticket.future.exception()
                assert isinstance(error, ApiError)
                assert (error.status, error.kind) == (503, "Unhealthy")
            scorer.release.set()
            await stopping

    asyncio.run(main())


def test_refuse_all_answers_the_waiting_requests_with_503_and_drops_their_work() -> None:
    async def main() -> None:
        scorer = HeldScorer()
        with ThreadPoolExecutor(1) as pool:
            batcher = held_batcher(scorer, pool)
            batcher.start()
            running = batcher.submit(Group("running", ("a",)), [1], 1, None)
            await until(scorer.entered)
            queued = batcher.submit(Group("queued", ("b",)), [1], 1, None)
            assert batcher.refuse_all() == 2
            assert batcher.depth == 0
            for ticket in (running, queued):
                with pytest.raises(ApiError) as refused:
                    await ticket.future
                assert refused.value.status == 503
            scorer.release.set()
            later = batcher.submit(Group("later", ("c",)), [1], 1, None)
            assert await later.future == [pair_score("later", "c")]
            await batcher.stop()
        assert scored_queries(scorer) == ["running", "later"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kind", "query_charged"), [("local", False), ("embedding", True), ("lexical", True)]
)
def test_a_request_over_the_token_budget_is_refused_before_it_is_queued(
    kind: str, query_charged: bool
) -> None:
    async def main() -> None:
        scorer = HeldScorer(kind)
        with ThreadPoolExecutor(1) as pool:
            batcher = held_batcher(scorer, pool, max_request_tokens=100)
            query = 10 if query_charged else 0
            exactly = [30, 30, 40 - query]
            accepted = batcher.submit(Group("q", ("a", "b", "c")), exactly, 10, None)
            with pytest.raises(ApiError) as refused:
                batcher.submit(Group("q", ("a", "b", "c")), [30, 30, 41 - query], 10, None)
            assert (refused.value.status, refused.value.kind) == (422, "Validation")
            assert refused.value.message == (
                "Input validation error: the request must have at most 100 tokens "
                "(its texts and query, as the model reads them). Given: 101"
            )
            assert batcher.depth == 1
            assert not accepted.future.done()
            await batcher.stop()

    asyncio.run(main())


def test_a_batch_fills_up_to_exactly_its_pair_budget() -> None:
    async def main() -> list[int]:
        scorer = HeldScorer()
        sizes: list[int] = []
        with ThreadPoolExecutor(1) as pool:
            batcher = held_batcher(scorer, pool, max_pairs=4)
            batcher.on_batch = lambda batch: sizes.append(batch.pairs)
            batcher.start()
            first = batcher.submit(Group("first", ("a",)), [1], 1, None)
            await until(scorer.entered)
            two = [batcher.submit(Group(f"q{i}", ("b", "c")), [1, 1], 1, None) for i in range(2)]
            scorer.release.set()
            await asyncio.gather(first.future, *(t.future for t in two))
            await batcher.stop()
        return sizes

    assert asyncio.run(main()) == [1, 4]


def test_an_embedding_request_is_charged_its_query_in_every_slice() -> None:
    """A bi-encoder embeds the query once per slice: 20 query tokens and 10 per text leave
    room for 4 texts in a 60-token batch, not 6."""

    async def main() -> list[int]:
        scorer = HeldScorer("embedding")
        sizes: list[int] = []
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                scorer,
                pool,
                max_batch_pairs=100,
                max_batch_tokens=60,
                max_queue=10,
                batch_wait=0.0,
                max_request_tokens=1000,
                on_batch=lambda batch: sizes.append(batch.pairs),
            )
            batcher.start()
            scorer.release.set()
            texts = tuple(f"t{i}" for i in range(10))
            ticket = batcher.submit(Group("q", texts), [10] * 10, 20, None)
            assert await ticket.future == [pair_score("q", t) for t in texts]
            await batcher.stop()
        return sizes

    assert asyncio.run(main()) == [4, 4, 2]
