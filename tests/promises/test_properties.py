"""Property tests (hypothesis): a response either maps every score to the right item or is refused.

For any response body (permutations, subsets, duplicates, out-of-range or ill-typed indices,
any float including NaN and the infinities, huge integers, wrong types anywhere), checked
against an independent oracle:

- `providers.parse_response` returns exactly the oracle's (index, score) pairs or raises
  `RerankProtocolError`, for every provider's envelope;
- the client, fed the same bodies through `httpx.MockTransport`, hands back each caller's item
  with the score the server gave *that* item, or raises `RerankProtocolError`; never anything
  else, never a mislabel;
- the stage's output is always a duplicate-free selection of its own candidates: on success
  min(top_k, n) of them, best first, with the server's scores; in fallback, recall order.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    Reranked,
    RerankProtocolError,
    RerankStage,
)
from retrieval_stage.client.providers import PROVIDERS, WireFormat, expected_results, parse_response

MISSING = object()

# -- bodies --------------------------------------------------------------------------------

WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**400), 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
"""Any JSON value, leaning towards the ones a sloppy server sends."""

SCORES = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 5),
    WEIRD,
)


@st.composite
def results(draw: st.DrawFn, fmt: WireFormat, n: int) -> list[Any]:
    """Result entries: mostly well-formed, in any order and number, with some entries broken."""
    keys = draw(
        st.one_of(
            st.permutations(range(n)),
            st.permutations(range(n)).flatmap(
                lambda p: st.integers(0, len(p)).map(lambda k: p[:k])
            ),
            st.lists(st.integers(0, max(n - 1, 0)), max_size=n + 1) if n else st.just([]),
            st.lists(st.integers(-2, n + 2), max_size=n + 2),
        )
    )
    entries: list[Any] = []
    for key in keys:
        entry: dict[str, Any] = {}
        if fmt.id_mapped:
            entry["id"] = str(key)
        else:
            entry["index"] = key
        entry[fmt.score_key] = draw(st.floats(-1e6, 1e6, allow_nan=False))
        mutation = draw(st.integers(0, 11))
        key_field = "id" if fmt.id_mapped else "index"
        if mutation == 0:
            entry[key_field] = draw(WEIRD)
        elif mutation == 1:
            entry[fmt.score_key] = draw(SCORES)
        elif mutation == 2:
            del entry[draw(st.sampled_from([key_field, fmt.score_key]))]
        elif mutation == 3:
            entries.append(draw(WEIRD))
            continue
        elif mutation == 4:
            entry["text"] = "echoed document"
        entries.append(entry)
    return entries


@st.composite
def bodies(draw: st.DrawFn, fmt: WireFormat, n: int) -> Any:
    """A whole response body for `fmt`, sometimes with the wrong envelope."""
    entries = draw(results(fmt, n))
    if draw(st.integers(0, 14)) == 0:
        return draw(st.one_of(WEIRD, st.just({"error": "x"}), st.just(entries)))
    if fmt.results_key is None:
        return entries
    return {fmt.results_key: entries, "model": "m"}


def oracle(fmt: WireFormat, body: Any, n: int, expected: int) -> list[tuple[int, float]] | None:
    """The (index, score) pairs a valid body holds, or None when it must be refused.

    Written independently of `providers`: membership tests instead of type juggling.
    """
    if fmt.results_key is None:
        entries = body if isinstance(body, list) else None
    else:
        entries = body.get(fmt.results_key) if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    keys = {str(i): i for i in range(n)}
    pairs: list[tuple[int, float]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        if fmt.id_mapped:
            raw = entry.get("id", MISSING)
            if not isinstance(raw, str) or raw not in keys:
                return None
            index = keys[raw]
        else:
            raw = entry.get("index", MISSING)
            if type(raw) is not int or raw not in range(n):
                return None
            index = raw
        if index in (i for i, _ in pairs):
            return None
        score = entry.get(fmt.score_key, MISSING)
        if type(score) not in (int, float):
            return None
        try:
            value = float(score)
        except OverflowError:
            return None
        if not math.isfinite(value):
            return None
        pairs.append((index, value))
    return pairs if len(pairs) == expected else None


# -- the pure level ------------------------------------------------------------------------


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_parse_response_maps_exactly_or_refuses(provider: str, data: st.DataObject) -> None:
    fmt = PROVIDERS[provider]
    n = data.draw(st.integers(0, 6), label="n")
    top_n = data.draw(st.one_of(st.none(), st.integers(1, 7)), label="top_n")
    expected = expected_results(fmt, n, top_n)
    body = data.draw(bodies(fmt, n), label="body")
    want = oracle(fmt, body, n, expected)
    try:
        parsed = parse_response(fmt, body, {}, n_texts=n, expected=expected)
    except RerankProtocolError:
        assert want is None, "a valid body was refused"
        return
    assert want is not None, "an invalid body was accepted"
    assert parsed.pairs == want


def test_oracle_accepts_a_permutation_and_refuses_a_duplicate() -> None:
    """The oracle itself can say both yes and no."""
    fmt = PROVIDERS["tei"]
    good = [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]
    assert oracle(fmt, good, 2, 2) == [(1, 0.9), (0, 0.1)]
    assert oracle(fmt, [*good[:1], {"index": 1, "score": 0.1}], 2, 2) is None
    assert oracle(fmt, [{"index": True, "score": 0.1}], 2, 1) is None
    assert oracle(fmt, [{"index": 0, "score": 10**400}], 1, 1) is None


# -- the client's mapping, through httpx.MockTransport -------------------------------------


class Item:
    """A caller's item: only identity tells two apart."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Item({self.text!r})"


def serve(body_of: Callable[[], Any]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(body_of()).encode())

    return handler


def check_client_result(
    fmt: WireFormat,
    body: Any,
    items: list[Item],
    top_k: int | None,
    outcome: list[tuple[Item, float]] | RerankProtocolError,
) -> None:
    """The client's answer against the oracle: refused iff invalid, else exactly mapped."""
    n = len(items)
    top_n = None if top_k is None else min(top_k, n)
    # The body went over the wire as JSON: NaN/Infinity survive, tuples become lists.
    wire = json.loads(json.dumps(body))
    want = oracle(fmt, wire, n, expected_results(fmt, n, top_n))
    if isinstance(outcome, RerankProtocolError):
        assert want is None, f"a valid body was refused: {outcome}"
        return
    assert want is not None, "an invalid body was accepted"
    best_first = sorted(want, key=lambda p: (-p[1], p[0]))
    if top_k:
        best_first = best_first[:top_k]
    assert [(id(items[i]), s) for i, s in best_first] == [(id(it), s) for it, s in outcome]


@pytest.mark.parametrize("provider", ["tei", "cohere", "sidecar"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_client_returns_each_item_with_its_own_score_or_refuses(
    provider: str, data: st.DataObject
) -> None:
    fmt = PROVIDERS[provider]
    n = data.draw(st.integers(1, 5), label="n")
    top_k = data.draw(st.one_of(st.none(), st.integers(1, 6)), label="top_k")
    body = data.draw(bodies(fmt, n), label="body")
    items = [Item(f"text {i}") for i in range(n)]
    transport = httpx.MockTransport(serve(lambda: body))
    client = RerankClient(
        "http://reranker.test",
        provider=provider,
        model="m",
        http_client=httpx.Client(transport=transport),
        max_retries=0,
    )
    outcome: list[tuple[Item, float]] | RerankProtocolError
    try:
        outcome = client.rerank("q", items, top_k=top_k)
    except RerankProtocolError as exc:
        outcome = exc
    finally:
        client.close()
    check_client_result(fmt, body, items, top_k, outcome)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_async_client_returns_each_item_with_its_own_score_or_refuses(
    data: st.DataObject,
) -> None:
    fmt = PROVIDERS["tei"]
    n = data.draw(st.integers(1, 5), label="n")
    body = data.draw(bodies(fmt, n), label="body")
    items = [Item(f"text {i}") for i in range(n)]

    async def go() -> list[tuple[Item, float]] | RerankProtocolError:
        transport = httpx.MockTransport(serve(lambda: body))
        async with AsyncRerankClient(
            "http://reranker.test",
            http_client=httpx.AsyncClient(transport=transport),
            max_retries=0,
        ) as client:
            try:
                return await client.rerank("q", items)
            except RerankProtocolError as exc:
                return exc

    check_client_result(fmt, body, items, None, asyncio.run(go()))


# -- the stage -----------------------------------------------------------------------------


@st.composite
def candidate_lists(draw: st.DrawFn) -> list[Candidate]:
    n = draw(st.integers(0, 7))
    scores = draw(
        st.lists(st.one_of(st.none(), st.floats(-10, 10, allow_nan=False)), min_size=n, max_size=n)
    )
    return [Candidate(f"c{i}", f"text {i}", score) for i, score in enumerate(scores)]


def recall_positions(cands: Sequence[Candidate]) -> list[int]:
    """Recall order, restated: by recall score descending, unscored last, ties by position."""
    scored = sorted(
        (i for i, c in enumerate(cands) if c.score is not None),
        key=lambda i: (-(cands[i].score or 0.0), i),
    )
    return scored + [i for i, c in enumerate(cands) if c.score is None]


def check_stage_output(cands: list[Candidate], top_k: int | None, outputs: list[Reranked]) -> bool:
    """The stage's invariants; returns whether the call was reranked (else it fell back).

    Either way exactly min(top_k, n) outputs: the stage refuses a reranker that returns fewer
    (a candidate silently dropped) and falls back to recall order instead.
    """
    positions = [o.input_index for o in outputs]
    assert len(set(positions)) == len(positions), "a candidate came back twice"
    assert all(
        0 <= p < len(cands) and o.candidate is cands[p]
        for p, o in zip(positions, outputs, strict=True)
    ), "an output is not the candidate at its input_index"
    want = len(cands) if not top_k else min(top_k, len(cands))
    assert len(outputs) == want
    if outputs and not outputs[0].reranked:
        assert not any(o.reranked for o in outputs)
        assert positions == recall_positions(cands)[:want]
        assert [o.score for o in outputs] == [cands[p].score for p in positions]
        return False
    assert all(o.reranked for o in outputs)
    scores = [o.score for o in outputs]
    assert all(s is not None and math.isfinite(s) for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    return True


@settings(max_examples=60, deadline=None)
@given(cands=candidate_lists(), top_k=st.one_of(st.none(), st.integers(0, 8)), data=st.data())
def test_stage_output_is_a_duplicate_free_selection_or_recall_order(
    cands: list[Candidate], top_k: int | None, data: st.DataObject
) -> None:
    fmt = PROVIDERS["tei"]
    body = data.draw(bodies(fmt, len(cands)), label="body")
    transport = httpx.MockTransport(serve(lambda: body))
    with RerankClient(
        "http://reranker.test", http_client=httpx.Client(transport=transport), max_retries=0
    ) as client:
        outputs = RerankStage(client, top_k=top_k).run("q", cands)
    reranked = check_stage_output(cands, top_k, outputs)
    if reranked and cands:
        want = oracle(fmt, json.loads(json.dumps(body)), len(cands), len(cands))
        assert want is not None, "reranked from a body the oracle refuses"
        server = dict(want)
        assert all(o.score == server[o.input_index] for o in outputs), "mislabelled score"


class ScriptedReranker:
    """A user's reranker that returns whatever the test draws: strangers, repeats, NaN."""

    def __init__(self, answer: Callable[[list[Candidate]], list[Any]]) -> None:
        self.answer = answer

    def rerank(
        self,
        query: str,
        items: Sequence[Candidate],
        *,
        text: Callable[[Candidate], str] | None = None,
        top_k: int | None = None,
    ) -> list[Any]:
        return self.answer(list(items))


SANE_SCORES = st.one_of(
    st.floats(-5, 5, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.text(max_size=2),
    st.integers(-(10**400), 10**400),
    st.sampled_from([math.nan, math.inf, -math.inf]),  # drawn often, not by luck of floats()
)
"""Scores a user's reranker might return, integers beyond a float included."""


@st.composite
def reranker_answers(draw: st.DrawFn, cands: list[Candidate]) -> list[Any]:
    """What a user's reranker returns: picks from the candidates (or strangers) with scores."""
    stranger = Candidate("stranger", "not given", 0.0)
    picks = draw(
        st.one_of(
            st.permutations(range(len(cands))),
            st.lists(st.integers(-1, len(cands) - 1), max_size=len(cands) + 1)
            if cands
            else st.just([]),
        )
    )
    answer: list[Any] = []
    for p in picks:
        item = stranger if p < 0 else cands[p]
        score = draw(st.one_of(st.floats(-5, 5, allow_nan=False), SANE_SCORES))
        answer.append((item, score) if draw(st.integers(0, 15)) else [item, score])
    return answer


@settings(max_examples=100, deadline=None)
@given(cands=candidate_lists(), top_k=st.one_of(st.none(), st.integers(0, 8)), data=st.data())
def test_stage_over_any_reranker_never_repeats_or_mislabels_a_candidate(
    cands: list[Candidate], top_k: int | None, data: st.DataObject
) -> None:
    answer = data.draw(reranker_answers(cands), label="answer")
    stage = RerankStage(ScriptedReranker(lambda items: answer), top_k=top_k)
    outputs = stage.run("q", cands)
    if check_stage_output(cands, top_k, outputs):
        given_scores = {id(pair[0]): pair[1] for pair in answer}
        # Scores are floats: an int beyond 2**53 is its nearest float, as float() gives it.
        assert all(o.score == float(given_scores[id(o.candidate)]) for o in outputs)


def test_an_int_score_beyond_a_floats_precision_is_its_nearest_float_on_its_candidate() -> None:
    # Found by an audit of the property above: 2**53 + 1 has no float of its own.
    cands = [Candidate("c0", "text 0", None), Candidate("c1", "text 1", None)]
    answer = [(cands[1], 2**53 + 1), (cands[0], 5)]
    outputs = RerankStage(ScriptedReranker(lambda items: answer)).run("q", cands)
    assert [(o.candidate.id, o.score) for o in outputs] == [("c1", 2.0**53), ("c0", 5.0)]
    assert all(type(o.score) is float for o in outputs)


def cands_abc() -> list[Candidate]:
    return [Candidate("a", "A", 0.3), Candidate("b", "B", 0.2), Candidate("c", "C", 0.1)]


@pytest.mark.parametrize("top_k", [None, 2])
def test_stage_falls_back_when_a_reranker_returns_too_few_results(top_k: int | None) -> None:
    cands = cands_abc()
    stage = RerankStage(ScriptedReranker(lambda items: [(items[2], 0.9)]), top_k=top_k)
    outputs = stage.run("q", cands)
    check_stage_output(cands, top_k, outputs)


def test_stage_falls_back_on_a_score_too_large_for_a_float() -> None:
    cands = cands_abc()
    huge = 10**400
    answer = [(cands[0], huge), (cands[1], 0.5), (cands[2], 0.1)]
    outputs = RerankStage(ScriptedReranker(lambda items: answer)).run("q", cands)
    assert not any(o.reranked for o in outputs)


def test_huge_integer_score_from_a_server_is_refused_not_raised() -> None:
    """JSON allows an integer literal no float can hold; it must be a protocol error."""
    body = [{"index": 0, "score": 10**400}]
    with pytest.raises(RerankProtocolError, match="not finite"):
        parse_response(PROVIDERS["tei"], body, {}, n_texts=1, expected=1)
    cohere = {
        "results": [{"index": 0, "relevance_score": 0.5}],
        "meta": {"billed_units": {"search_units": 10**400}},
    }
    parsed = parse_response(PROVIDERS["cohere"], cohere, {}, n_texts=1, expected=1)
    assert parsed.usage.search_units is None
