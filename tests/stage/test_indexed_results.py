"""Result positions (`RerankResponse.indices`): taken from our clients, ignored from others.

The HTTP clients know each result's index (the APIs answer by index, and every index is
checked before it is used), so they answer with a `ClientResponse` carrying them, and the stage
maps it without rebuilding the positions from object identities (issue 26). Any other
reranker's `indices` are not trusted: its results are checked one by one, as before.

Also here: the C-speed fast paths of the argument snapshot, the ranking and the stage's input
check, each against the plain definition it replaces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage import Candidate, RerankClient, RerankResponse, RerankStage
from retrieval_stage._args import rank, snapshot
from retrieval_stage.client.steps import Pairs
from retrieval_stage.models import ClientResponse
from retrieval_stage.protocols import map_results


class _Lying:
    """A reranker whose answer is right but whose claimed indices are reversed."""

    model_name = "lying"

    async def rerank_response(
        self, query: str, items: Sequence[Candidate], *, text: Any = None, top_k: Any = None
    ) -> RerankResponse[Candidate]:
        results = [(items[1], 0.9), (items[0], 0.4), (items[2], 0.1)]
        return RerankResponse(results=results, indices=[2, 1, 0])

    async def rerank(self, query: str, items: Sequence[Candidate], **kw: Any) -> Any:
        return (await self.rerank_response(query, items, **kw)).results


def test_the_stage_labels_by_identity_whatever_the_claim() -> None:
    cands = [Candidate(n, n, score=s) for n, s in (("a", 0.3), ("b", 0.2), ("c", 0.1))]
    out = asyncio.run(RerankStage(_Lying()).arun("q", cands))
    assert [(r.candidate.id, r.score, r.input_index) for r in out] == [
        ("b", 0.9, 1),
        ("a", 0.4, 0),
        ("c", 0.1, 2),
    ]
    assert all(r.candidate is cands[r.input_index] for r in out)


class _Reversing:
    """A wrapper that hands our client the candidates reversed: the client's answer is right,
    but its indices are positions in the reversed list, not in the stage's."""

    model_name = "reversing"

    def __init__(self, client: RerankClient) -> None:
        self.client = client

    async def rerank_response(
        self, query: str, items: Sequence[Candidate], *, text: Any = None, top_k: Any = None
    ) -> RerankResponse[Candidate]:
        flipped = list(reversed(items))
        kept, call = self.client._begin(query, flipped, text, top_k)
        pairs: Pairs = [(0, 0.9), (2, 0.4), (1, 0.1)]  # as a server answers: by index
        return self.client._finish(kept, call, pairs)

    async def rerank(self, query: str, items: Sequence[Candidate], **kw: Any) -> Any:
        return (await self.rerank_response(query, items, **kw)).results


def test_our_clients_answer_for_the_same_items_is_mapped_from_its_indices(
    client: RerankClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shortcut is taken: an answer our client made for the stage's own candidates never
    goes through `map_results`."""
    import retrieval_stage.stage as stage_module

    class Same(_Reversing):
        async def rerank_response(
            self, query: str, items: Sequence[Candidate], *, text: Any = None, top_k: Any = None
        ) -> RerankResponse[Candidate]:
            kept, call = self.client._begin(query, items, text, top_k)
            return self.client._finish(kept, call, [(0, 0.9), (2, 0.4), (1, 0.1)])

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("map_results was called")

    monkeypatch.setattr(stage_module, "map_results", refused)
    cands = [Candidate(n, n, score=s) for n, s in (("a", 0.3), ("b", 0.2), ("c", 0.1))]
    out = asyncio.run(RerankStage(Same(client)).arun("q", cands))
    assert [(r.candidate.id, r.score, r.input_index) for r in out] == [
        ("a", 0.9, 0),
        ("c", 0.4, 2),
        ("b", 0.1, 1),
    ]


def test_a_client_response_for_other_items_is_labelled_by_identity(client: RerankClient) -> None:
    """A `ClientResponse` is trusted only where its indices name the stage's own candidates:
    one made for a reordered (or filtered) copy is mapped result by result."""
    cands = [Candidate(n, n, score=s) for n, s in (("a", 0.3), ("b", 0.2), ("c", 0.1))]
    out = asyncio.run(RerankStage(_Reversing(client)).arun("q", cands))
    assert [(r.candidate.id, r.score, r.input_index) for r in out] == [
        ("c", 0.9, 2),
        ("a", 0.4, 0),
        ("b", 0.1, 1),
    ]
    assert all(r.candidate is cands[r.input_index] for r in out)


@pytest.fixture(scope="module")
def client() -> Iterator[RerankClient]:
    """One client for every example: making one (its HTTP pool and TLS context) took 40 ms,
    nine tenths of the property test's time; `_begin` and `_finish` keep no state."""
    made = RerankClient("http://127.0.0.1:9")
    yield made
    made.close()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.9, 0.5, 0.5, 0.1, -2.0, 0.0]), max_size=40),
    st.randoms(use_true_random=False),
    st.sampled_from([None, 1, 5]),
)
def test_a_client_response_maps_as_the_checked_way_does(
    client: RerankClient, scores: list[float], rnd: Any, top_k: int | None
) -> None:
    """The client's `_finish` (what turns checked server pairs into its answer) gives indices
    whose mapping is exactly what checking every result against the candidates gives."""
    cands = [Candidate(f"d{i}", f"text {i}") for i in range(len(scores))]
    pairs: Pairs = list(enumerate(scores))
    rnd.shuffle(pairs)  # the server's order: any
    kept, call = client._begin("q", cands, lambda c: c.text, top_k)
    response = client._finish(kept, call, pairs)
    assert type(response) is ClientResponse
    assert response.indices is not None
    trusted = list(zip(response.indices, (s for _, s in response.results), strict=True))
    assert trusted == map_results(cands, response.results, top_k)


# -- the snapshot, the ranking and the input check ------------------------------------------


class Text(str):
    """A str subclass: a text, though not exactly a str."""


def test_snapshot_calls_text_once_per_item_in_order() -> None:
    seen: list[int] = []

    def text(item: int) -> str:
        seen.append(item)
        return str(item)

    kept, texts, _ = snapshot("q", (3, 1, 2), text, None)
    assert (kept, texts, seen) == ([3, 1, 2], ["3", "1", "2"], [3, 1, 2])


@pytest.mark.parametrize(
    ("items", "text", "message"),
    [
        (["a", 1, "c"], None, "cannot take the text of a int"),
        (["a", "b"], lambda s: None if s == "b" else s, "text of item 1 must be a str, got None"),
        ([Candidate("a", "x"), 5], lambda c: c.text, "'int' object has no attribute 'text'"),
    ],
)
def test_snapshot_names_the_first_item_without_a_text(
    items: list[Any], text: Any, message: str
) -> None:
    with pytest.raises((TypeError, AttributeError), match=message):
        snapshot("q", items, text, None)


def test_snapshot_accepts_str_subclasses_and_copies_the_lists() -> None:
    items = [Text("a"), "b"]
    kept, texts, _ = snapshot("q", items, None, None)
    assert texts == ["a", "b"]
    assert kept == items
    assert kept is not items
    assert texts is not kept
    plain = ["x", "y"]
    kept, texts, _ = snapshot("q", plain, None, None)
    assert kept == texts == plain
    assert kept is not plain
    assert texts is not kept
    _, texts, _ = snapshot("q", ["z"], lambda s: Text(s), None)
    assert texts == ["z"]


@settings(deadline=None)  # pure, but CI builds images alongside: no 200 ms deadline
@given(st.lists(st.sampled_from([0.9, 0.5, 0.5, 0.0, -0.0, -1.5, 1e300]), max_size=30))
def test_rank_is_best_first_with_ties_in_input_order(scores: list[float]) -> None:
    pairs = list(enumerate(scores))
    shuffled = pairs[::-1]
    want = sorted(pairs, key=lambda p: (-p[1], p[0]))
    assert rank(shuffled, None) == want
    assert rank(shuffled, 3) == want[:3]


def test_the_stage_takes_candidate_subclasses_and_names_anything_else() -> None:
    class Mine(Candidate):
        __slots__ = ()

    class Echo:
        model_name = "echo"

        def rerank(self, query: str, items: Sequence[Any], **kw: Any) -> Any:
            return [(item, 1.0 - i / 10) for i, item in enumerate(items)]

    stage = RerankStage(Echo())
    assert [r.candidate.id for r in stage.run("q", [Mine("a", "x"), Candidate("b", "y")])] == [
        "a",
        "b",
    ]
    wrong = r"candidate 1 must be a retrieval_stage\.Candidate, got str"
    with pytest.raises(TypeError, match=wrong):
        stage.run("q", [Candidate("a", "x"), "b"])  # type: ignore[list-item]


def test_a_chain_passes_on_only_indices_our_clients_checked() -> None:
    from retrieval_stage import AsyncRerankerChain

    cands = [Candidate(n, n, score=s) for n, s in (("a", 0.3), ("b", 0.2), ("c", 0.1))]
    chain = AsyncRerankerChain([_Lying()])
    response = asyncio.run(chain.rerank_response("q", cands, text=lambda c: c.text))
    assert [item.id for item, _ in response.results] == ["b", "a", "c"]
    assert response.indices is None  # the tier's claim ([2, 1, 0]) was wrong, and not passed on


def test_a_chain_passes_on_no_indices_our_client_made_for_other_items(
    client: RerankClient,
) -> None:
    from retrieval_stage import AsyncRerankerChain

    cands = [Candidate(n, n, score=s) for n, s in (("a", 0.3), ("b", 0.2), ("c", 0.1))]
    chain = AsyncRerankerChain([_Reversing(client)])
    response = asyncio.run(chain.rerank_response("q", cands, text=lambda c: c.text))
    assert [item.id for item, _ in response.results] == ["c", "a", "b"]
    assert response.indices is None  # positions in the reversed copy, not in `cands`
