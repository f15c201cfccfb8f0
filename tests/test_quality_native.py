"""The quality walk in C gives exactly what the Python walk gives, or hands the call back.

`retrieval_stage._speedups.quality_walk` stands in for `quality._walk` when the package was
built with its C loops. Every signal must be the same float (the same operations in the same
order: a tau or an RBO one unit in the last place apart would be a different number on the
span and in the histograms), and every input it does not take (a position scored twice, a
score that is not a finite float, scores not best first, positions outside the candidates)
must end exactly as without it: the same result or the same exception.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import retrieval_stage.quality as quality
from retrieval_stage import Candidate
from retrieval_stage.models import recall_order
from retrieval_stage.quality import RerankQuality, rerank_quality

pytestmark = pytest.mark.skipif(
    quality._c is None, reason="the C loops are not built here: see test_the_c_loops_are_built"
)


def both(
    candidates: list[Candidate], scored: Any, top_k: int | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    """`rerank_quality` with the C walk and without it: each result, or the exception."""
    outcomes = []
    for native in (quality._c, None):
        with monkeypatch.context() as patch:
            patch.setattr(quality, "_c", native)
            try:
                outcomes.append(rerank_quality(candidates, list(scored), top_k))
            except Exception as exc:  # compared by type and message
                outcomes.append((type(exc), str(exc)))
    return outcomes[0], outcomes[1]


def same(a: Any, b: Any) -> bool:
    """Equal, NaN-free, and every float the identical double (``==`` would let -0.0 pass)."""
    if isinstance(a, RerankQuality) and isinstance(b, RerankQuality):
        return all(same(x, y) for x, y in zip(vars_of(a), vars_of(b), strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    return bool(a == b) and type(a) is type(b)


def vars_of(q: RerankQuality) -> list[Any]:
    return [getattr(q, name) for name in q.__dataclass_fields__]


@st.composite
def calls(draw: st.DrawFn) -> tuple[list[Candidate], list[tuple[Any, Any]], int | None, str]:
    """Candidates with recall scores (some tied, some missing, now and then all missing or all
    equal: no order, so only the first k are walked) and a reranker's pairs, best first with
    runs of ties, now and then broken in every way the C walk hands back."""
    n = draw(st.integers(1, 200))  # past 64 and 128: bit sets of several words
    rng = random.Random(draw(st.integers(0, 2**32)))
    recall_values = [0.1, 0.5, 0.9]
    uniform = draw(st.sampled_from([False, False, "none", "same"]))  # recall without an order
    cands = []
    for i in range(n):
        kind = rng.random()
        score = None if kind < 0.1 else rng.choice(recall_values) if kind < 0.4 else rng.random()
        if uniform:
            score = None if uniform == "none" else 0.5
        cands.append(Candidate(f"d{i}", "t", score))
    positions = list(range(n))
    rng.shuffle(positions)
    positions = positions[: draw(st.integers(1, n))]
    levels = sorted({round(rng.random(), 2) for _ in positions}, reverse=True)
    scores = sorted((rng.choice(levels) for _ in positions), reverse=True)
    scored: list[tuple[Any, Any]] = list(zip(positions, scores, strict=True))
    breakage = draw(
        st.sampled_from(
            ["none"] * 6 + ["twice", "nan", "inf", "int", "rises", "outside", "negative", "list"]
        )
    )
    at = rng.randrange(len(scored))
    position, score = scored[at]
    if breakage == "twice" and len(scored) > 1:
        scored[at] = (scored[(at + 1) % len(scored)][0], score)
    elif breakage in ("nan", "inf"):
        scored[at] = (position, math.nan if breakage == "nan" else -math.inf)
    elif breakage == "int":
        scored[at] = (position, 1)
    elif breakage == "rises" and len(scored) > 1:
        scored[-1] = (scored[-1][0], scored[0][1] + 1.0)
    elif breakage == "outside":
        scored[at] = (n + 5, score)
    elif breakage == "negative":
        scored[at] = (-1, score)
    elif breakage == "list":
        scored[at] = [position, score]  # type: ignore[call-overload]
    top_k = draw(st.one_of(st.none(), st.integers(-1, n + 3)))
    return cands, scored, top_k, breakage


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(call=calls())
def test_the_c_walk_gives_what_the_python_walk_gives(
    call: tuple[list[Candidate], list[tuple[Any, Any]], int | None, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cands, scored, top_k, breakage = call
    uniform = len({c.score for c in cands}) == 1
    native, python = both(cands, scored, top_k, monkeypatch)
    assert same(native, python), (native, python)
    if breakage == "none":  # the C walk answered itself: the Python did not stand in for it
        n_scored = len(scored)
        k = n_scored if top_k is None else max(min(top_k, n_scored), 0)
        weights, tails = quality._rbo_weights(k)
        assert quality._c is not None
        recall = recall_order(cands)
        walked = quality._c.quality_walk(scored, recall, k, not uniform, weights, tails)
        assert walked is not None


def test_the_c_walk_takes_the_stages_common_call() -> None:
    """Fifty candidates in recall order, every score distinct: the C walk answers (None would
    mean the Python ran, and every call paid for it)."""
    cands = [Candidate(f"d{i}", "t", 1.0 - i / 50) for i in range(50)]
    order = list(range(50))
    random.Random(3).shuffle(order)
    scored = [(p, 1.0 - i / 97.3) for i, p in enumerate(order)]
    recall = recall_order(cands)
    weights, tails = quality._rbo_weights(10)
    assert quality._c is not None
    walked = quality._c.quality_walk(scored, recall, 10, True, weights, tails)
    assert walked == quality._walk(scored, recall, 10, True)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 127, 128, 129, 300])
def test_bit_sets_of_every_width_walk_alike(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    cands = [Candidate(f"d{i}", "t", float(i % 7)) for i in range(n)]
    scored = [(p, 1.0 - i / (n + 1)) for i, p in enumerate(reversed(range(n)))]
    for top_k in (None, 0, 1, n // 2, n):
        native, python = both(cands, scored, top_k, monkeypatch)
        assert same(native, python)


def test_past_the_exact_range_the_c_walk_hands_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond 8,192 pairs tau's n0 * (n0 - tied) is not exact in a double (and far beyond,
    overflows a long long): the Python walk, in integers, answers there."""
    n = 8_193
    cands = [Candidate(f"d{i}", "t", float(n - i)) for i in range(n)]
    scored = [(p, float(n // 2 - i // 2)) for i, p in enumerate(range(n))]  # tied in pairs
    recall = recall_order(cands)
    weights, tails = quality._rbo_weights(n)
    assert quality._c is not None
    assert quality._c.quality_walk(scored, recall, n, True, weights, tails) is None
    small = scored[:8_192]
    weights, tails = quality._rbo_weights(8_192)
    assert quality._c.quality_walk(small, recall, 8_192, True, weights, tails) is not None
    native, python = both(cands, scored, None, monkeypatch)
    assert same(native, python)
