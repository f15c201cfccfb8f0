"""Rank-biased overlap (`retrieval_stage.quality.rank_biased_overlap`, RBO_ext of Webber,
Moffat and Zobel 2010) and the score spread, on hand-computed cases and by its properties.

Every expected value was worked out by hand from RBO_ext = X_k/k * p^k + (1-p)/p * sum over
d = 1..k of X_d/d * p^d, X_d the items the first d of both rankings share.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage import Candidate
from retrieval_stage.quality import RBO_PERSISTENCE, rank_biased_overlap, rerank_quality


def cands(*scores: float | None) -> list[Candidate]:
    return [Candidate(f"d{i}", f"text {i}", score=s) for i, s in enumerate(scores)]


def test_the_stage_persistence_is_the_documented_one() -> None:
    assert RBO_PERSISTENCE == 0.9


def test_identical_rankings_score_one_disjoint_zero() -> None:
    assert rank_biased_overlap([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(1.0, abs=1e-12)
    assert rank_biased_overlap(["a", "b"], ["c", "d"]) == 0.0


def test_one_swap_below_the_head_by_hand() -> None:
    # [1, 2, 3] vs [1, 3, 2]: X = 1, 1, 3; A = X/d = 1, 1/2, 1.
    # 0.1/0.9 * (0.9 + 0.5 * 0.81 + 0.729) + 1 * 0.729 = 0.226 + 0.729.
    assert rank_biased_overlap([1, 2, 3], [1, 3, 2]) == pytest.approx(0.955)


def test_two_swaps_by_hand() -> None:
    # [1, 2, 3, 4] vs [2, 1, 4, 3]: X = 0, 2, 2, 4; A = 0, 1, 2/3, 1.
    # 0.1/0.9 * (0.81 + 2/3 * 0.729 + 0.6561) + 0.6561 = 0.2169 + 0.6561.
    assert rank_biased_overlap([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.873)


def test_a_swap_at_the_head_costs_more_than_one_at_the_tail() -> None:
    head = rank_biased_overlap([1, 2, 3, 4], [2, 1, 3, 4])
    tail = rank_biased_overlap([1, 2, 3, 4], [1, 2, 4, 3])
    assert head is not None
    assert tail is not None
    assert head < tail < 1.0


def test_another_persistence_by_hand() -> None:
    # p = 0.5, [1, 2, 3] vs [1, 3, 2]: A = 1, 1/2, 1. 1 * (0.5 + 0.125 + 0.125) + 0.125.
    assert rank_biased_overlap([1, 2, 3], [1, 3, 2], p=0.5) == pytest.approx(0.875)


def test_the_longer_ranking_is_read_to_the_shorter_ones_depth() -> None:
    assert rank_biased_overlap([1, 2, 3], [1, 3, 2, 9, 8]) == pytest.approx(0.955)


def test_an_empty_ranking_measures_nothing() -> None:
    assert rank_biased_overlap([], [1, 2]) is None
    assert rank_biased_overlap([], []) is None


@pytest.mark.parametrize("p", [0.0, 1.0, -0.5, 1.5, math.nan])
def test_a_persistence_outside_zero_one_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match="persistence"):
        rank_biased_overlap([1, 2], [2, 1], p=p)


def test_an_item_twice_in_a_ranking_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        rank_biased_overlap([1, 1, 2], [1, 2, 3])


rankings = st.lists(st.integers(0, 15), unique=True, max_size=16)
persistence = st.floats(0.01, 0.99)


@settings(max_examples=300, deadline=None)
@given(rankings, rankings, persistence)
def test_symmetric_and_in_zero_one(a: list[int], b: list[int], p: float) -> None:
    forward = rank_biased_overlap(a, b, p)
    assert forward == rank_biased_overlap(b, a, p)
    if not a or not b:
        assert forward is None
    else:
        assert forward is not None
        assert 0.0 <= forward <= 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(), unique=True, min_size=1, max_size=60), persistence)
def test_identical_rankings_are_one_at_any_depth_and_persistence(a: list[int], p: float) -> None:
    assert rank_biased_overlap(a, list(a), p) == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(range(12))), persistence)
def test_disjoint_heads_are_zero_shared_ones_above_zero(order: list[int], p: float) -> None:
    a, b = order[:6], order[6:]
    assert rank_biased_overlap(a, b, p) == 0.0
    assert (rank_biased_overlap(a, [b[0], *a[1:]], p) or 0.0) > 0.0


# -- on one call --------------------------------------------------------------------------


def test_a_call_that_kept_recalls_top_k_in_order_has_rbo_one() -> None:
    # The reranker reorders below k = 3 only.
    scored = [(0, 0.9), (1, 0.7), (2, 0.4), (4, 0.3), (3, 0.1)]
    quality = rerank_quality(cands(0.9, 0.8, 0.7, 0.6, 0.5), scored, top_k=3)
    assert quality.rbo == pytest.approx(1.0, abs=1e-12)
    assert quality.topk_overlap == 1.0
    assert quality.score_spread == pytest.approx(0.5)  # 0.9 - 0.4: the top 3 only


def test_rbo_against_recall_by_hand_with_candidates_not_in_recall_order() -> None:
    # Recall order 2, 0, 1 (by recall score); the reranker ranks 2, 1, 0: [2, 0, 1] vs [2, 1, 0],
    # one swap below the head: 0.955 as in the hand example above.
    quality = rerank_quality(cands(0.5, 0.1, 0.9), [(2, 3.0), (1, 2.0), (0, 1.0)])
    assert quality.rbo == pytest.approx(0.955)
    assert quality.score_spread == 2.0


def test_scores_not_best_first_spread_is_max_minus_min() -> None:
    # A direct caller's scores in any order: the first k as given, their max minus their min.
    quality = rerank_quality(cands(0.9, 0.8, 0.7), [(0, 1.0), (1, 3.0), (2, 2.0)], top_k=2)
    assert quality.score_spread == 2.0
    assert quality.rbo == pytest.approx(1.0, abs=1e-12)  # [0, 1] vs recall's [0, 1]


def test_a_collapsed_top_k_has_spread_zero() -> None:
    quality = rerank_quality(cands(0.9, 0.8, 0.7), [(2, 0.5), (0, 0.5), (1, 0.5)])
    assert quality.score_spread == 0.0


def test_undefined_where_the_top_k_is_empty_or_single() -> None:
    one = rerank_quality(cands(0.9, 0.8), [(1, 0.7), (0, 0.2)], top_k=1)
    assert one.score_spread is None  # as score_margin is for one score
    assert one.rbo == 0.0  # [1] vs [0]
    none = rerank_quality(cands(0.9, 0.8), [(1, 0.7), (0, 0.2)], top_k=0)
    assert none.rbo is None
    assert none.score_spread is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_score_that_is_not_finite_is_left_out_of_both(bad: float) -> None:
    # As for the other signals: the pair is dropped, k counts what is left.
    given_ = cands(0.9, 0.8, 0.7, 0.6)
    clean = [(3, 0.95), (0, 0.9), (2, 0.5)]
    quality = rerank_quality(given_, [clean[0], (1, bad), *clean[1:]])
    expected = rerank_quality(given_, clean)
    assert (quality.rbo, quality.score_spread) == (expected.rbo, expected.score_spread)
    assert quality.score_spread == pytest.approx(0.45)
    assert quality.rbo is not None
    assert math.isfinite(quality.rbo)
