"""A reranker's claimed result positions (`RerankResponse.indices`) are checked, never trusted.

The HTTP clients know each result's index (the APIs answer by index), so they hand it to the
stage beside the results, which then skips rebuilding the positions from object identities
(issue 26). A claim is only a shortcut: `map_results` takes it only when every result's item
*is* the candidate at its claimed position, so whatever the claim says, the stage's mapping is
the one identity gives. These tests feed it true claims and every kind of false one.

Also here: the C-speed fast paths of the argument snapshot, the ranking and the stage's input
check, each against the plain definition it replaces.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage import Candidate, RerankProtocolError, RerankResponse, RerankStage
from retrieval_stage._args import rank, snapshot
from retrieval_stage.stage import map_results


def _outcome(f: Any) -> Any:
    """What `f()` returns, or the type and message of the `RerankProtocolError` it raises."""
    try:
        return f()
    except RerankProtocolError as exc:
        return ("raised", str(exc))


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[Candidate], list[tuple[Any, Any]], list[Any]]:
    """Candidates (one object possibly given twice), a plausible answer, and a claim about
    it: true, or false in one of the ways a buggy reranker could get it wrong."""
    n = draw(st.integers(0, 12))
    cands = [Candidate(f"d{i}", f"text {i}", score=1.0 - i / 16) for i in range(n)]
    if n >= 2 and draw(st.booleans()):
        cands[draw(st.integers(1, n - 1))] = cands[0]  # the same object at two positions
    order = draw(st.permutations(range(n)))
    scores = draw(st.lists(st.sampled_from([0.9, 0.5, 0.5, 0.1, -2.0]), min_size=n, max_size=n))
    results: list[tuple[Any, Any]] = [
        (cands[i], s) for i, s in zip(order, sorted(scores, reverse=True), strict=True)
    ]
    claim: list[Any] = list(order)
    lie = draw(
        st.sampled_from(
            [
                "true",
                "swap",
                "shift",
                "negative",
                "out_of_range",
                "duplicate",
                "bool",
                "float",
                "short",
                "long",
            ]
        )
    )
    if lie == "swap" and n >= 2:
        a, b = draw(st.permutations(range(n)))[:2]
        claim[a], claim[b] = claim[b], claim[a]
    elif lie == "shift" and n:
        claim = [(i + 1) % n for i in claim]
    elif lie == "negative" and n:
        claim[draw(st.integers(0, n - 1))] -= n  # a valid Python index, a wrong position
    elif lie == "out_of_range" and n:
        claim[draw(st.integers(0, n - 1))] = n
    elif lie == "duplicate" and n >= 2:
        claim[1] = claim[0]
    elif lie == "bool" and n:
        claim = [bool(i) if i in (0, 1) else i for i in claim]
    elif lie == "float" and n:
        claim[0] = float(claim[0])
    elif lie == "short" and n:
        claim = claim[:-1]
    elif lie == "long":
        claim = [*claim, 0]
    if draw(st.booleans()) and results:  # sometimes the answer itself is off too
        j = draw(st.integers(0, len(results) - 1))
        results[j] = draw(
            st.sampled_from(
                [
                    (results[j][0], float("nan")),
                    (results[j][0], 1),
                    (Candidate("intruder", "x"), 0.5),
                    (results[0][0], results[j][1]),
                    [results[j][0], results[j][1]],  # a list, not a tuple
                ]
            )
        )
    return cands, results, claim


@settings(max_examples=400, deadline=None)
@given(answers(), st.sampled_from([None, 1, 3]))
def test_any_claim_maps_exactly_as_identity_does(
    case: tuple[list[Candidate], list[tuple[Any, Any]], list[Any]], top_k: int | None
) -> None:
    cands, results, claim = case
    plain = _outcome(lambda: map_results(cands, results, top_k))
    claimed = _outcome(lambda: map_results(cands, results, top_k, indices=claim))
    assert claimed == plain
    if not isinstance(plain, tuple):  # mapped: each position's candidate has its result's score
        answered = Counter((id(item), float(score)) for item, score in results)
        assert Counter((id(cands[i]), s) for i, s in plain) == answered
        assert len({i for i, _ in plain}) == len(plain)


def test_a_true_claim_gives_the_sorted_checked_mapping() -> None:
    cands = [Candidate(f"d{i}", f"t{i}") for i in range(4)]
    results: list[tuple[Any, Any]] = [(cands[2], 0.9), (cands[0], 0.5), (cands[3], 0.5)]
    results.append((cands[1], 0.1))
    assert map_results(cands, results, indices=[2, 0, 3, 1]) == [
        (2, 0.9),
        (0, 0.5),
        (3, 0.5),
        (1, 0.1),
    ]


@pytest.mark.parametrize("claim", [None, (1, 0), iter([1, 0]), 7, "10"])
def test_a_claim_of_any_type_is_only_ever_a_shortcut(claim: Any) -> None:
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    results: list[tuple[Any, Any]] = [(cands[1], 0.7), (cands[0], 0.2)]
    assert map_results(cands, results, indices=claim) == [(1, 0.7), (0, 0.2)]


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
