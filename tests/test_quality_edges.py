"""`rerank_quality` on what a misbehaving reranker or caller gives it: a top_k of 0 or below,
scores that are not finite, a position scored twice."""

from __future__ import annotations

import math

import pytest

from retrieval_stage import Candidate
from retrieval_stage.quality import RerankQuality, rerank_quality


def cands(*scores: float | None) -> list[Candidate]:
    return [Candidate(f"d{i}", f"text {i}", score=s) for i, s in enumerate(scores)]


SCORED = [(3, 0.95), (0, 0.9), (2, 0.5), (1, 0.25)]


@pytest.mark.parametrize("top_k", [0, -1, -50])
def test_a_top_k_below_one_leaves_overlap_and_promotion_undefined(top_k: int) -> None:
    quality = rerank_quality(cands(0.9, 0.8, 0.7, 0.6), SCORED, top_k=top_k)
    assert quality.topk_overlap is None
    assert quality.max_promotion is None
    # The rest does not depend on k: as measured with any k.
    with_k = rerank_quality(cands(0.9, 0.8, 0.7, 0.6), SCORED, top_k=2)
    assert quality.kendall_tau == with_k.kendall_tau == pytest.approx(-1 / 3)
    assert (quality.top_score, quality.score_margin) == (with_k.top_score, with_k.score_margin)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_score_that_is_not_finite_is_left_out(bad: float) -> None:
    given_ = cands(0.9, 0.8, 0.7, 0.6, 0.5)
    with_bad = [(4, bad), *SCORED] if bad != -math.inf else [*SCORED, (4, bad)]
    assert rerank_quality(given_, with_bad, top_k=2) == rerank_quality(given_, SCORED, top_k=2)


def test_nan_scores_in_the_middle_do_not_turn_the_order_around() -> None:
    given_ = cands(0.9, 0.8, 0.7, 0.6)
    echo = [(0, 0.9), (1, math.nan), (2, 0.5), (3, 0.25)]  # recall's order, one score lost
    quality = rerank_quality(given_, echo)
    assert quality.kendall_tau == 1.0
    # k is the 3 scored: {0, 2, 3} against recall's first three {0, 1, 2}.
    assert quality.topk_overlap == pytest.approx(2 / 3)
    assert quality.max_promotion == 4
    assert quality.top_score == 0.9
    assert quality.score_margin == pytest.approx(0.4)


def test_only_scores_that_are_not_finite_measure_nothing() -> None:
    quality = rerank_quality(cands(0.9, 0.8), [(0, math.nan), (1, math.nan)])
    assert quality == RerankQuality(None, None, None, None, None)


def test_a_position_scored_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="scored twice"):
        rerank_quality(cands(0.9, 0.8, 0.7), [(0, 0.9), (0, 0.8), (2, 0.1)])
