"""The batcher's bookkeeping, with a scorer whose score names its pair: whatever the budgets,
arrival order and sizes, every request gets back exactly the scores of its own texts, in its
own order, and no batch breaks its budget except a lone slice that cannot be cut."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage.server.batcher import Batch, Batcher, plan_slices
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
            )  # not started: nothing leaves the queue
            batcher.submit(Group("q", ("a",)), [1], 1, None)
            batcher.submit(Group("q", ("b",)), [1], 1, None)
            with pytest.raises(ApiError) as refused:
                batcher.submit(Group("q", ("c",)), [1], 1, None)
            assert (refused.value.status, refused.value.message) == (429, "Model is overloaded")
            await batcher.stop()

    asyncio.run(main())
