"""The label-free quality signals (`retrieval_stage.quality`), exact on hand-computed cases.

Each expected value below was worked out by hand from the definitions in the module docstring,
and tau-b is held to scipy's on random orders (with ties) by a property test.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from retrieval_stage import Candidate
from retrieval_stage.models import recall_order
from retrieval_stage.quality import (
    ATTR_KENDALL_TAU,
    ATTR_MAX_PROMOTION,
    ATTR_SCORE_MARGIN,
    ATTR_TOP_SCORE,
    ATTR_TOPK_OVERLAP,
    RerankQuality,
    kendall_tau_b,
    max_promotion,
    rerank_quality,
    topk_overlap,
)


def cands(*scores: float | None) -> list[Candidate]:
    return [Candidate(f"d{i}", f"text {i}", score=s) for i, s in enumerate(scores)]


# -- Kendall's tau-b ----------------------------------------------------------------------


def test_tau_is_one_for_the_same_order_and_minus_one_reversed() -> None:
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0


def test_tau_one_swap_in_four() -> None:
    # 6 pairs, one discordant (the swapped neighbours): (5 - 1) / 6.
    assert kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)


def test_tau_b_with_ties_on_both_sides() -> None:
    # x = 1 1 2 3, y = 1 2 2 3. Pairs: (0,1) tied in x; (1,2) tied in y; the other four are
    # concordant. n0 = 6, ties_x = 1, ties_y = 1: 4 / sqrt(5 * 5) = 0.8.
    assert kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8)


def test_tau_undefined_when_one_side_has_a_single_value() -> None:
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    assert kendall_tau_b([1, 2, 3], [0.5, 0.5, 0.5]) is None
    assert kendall_tau_b([1], [1]) is None
    assert kendall_tau_b([], []) is None


def test_tau_refuses_unpaired_samples() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        kendall_tau_b([1, 2], [1, 2, 3])


def _samples(rng: random.Random, n: int, ties: float) -> list[float]:
    """`n` values, a share `ties` of them from a handful of small ints (ties), the rest
    spread floats."""
    return [rng.randint(0, 4) if rng.random() < ties else rng.uniform(-1e6, 1e6) for _ in range(n)]


# One drawn seed builds each case with `random`: as varied as nested list strategies, at a
# fraction of hypothesis's cost per example (the suite runs these on every CI run).
@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**64))
def test_tau_matches_scipy_on_random_orders(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 60)
    x = _samples(rng, n, rng.choice([0.0, 0.5, 1.0]))
    y = _samples(rng, n, rng.choice([0.0, 0.5, 1.0]))
    expected = stats.kendalltau(x, y).statistic  # tau-b is scipy's default variant
    got = kendall_tau_b(x, y)
    if math.isnan(expected):
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(30))))
def test_tau_matches_scipy_on_permutations(order: list[int]) -> None:
    expected = stats.kendalltau(list(range(30)), order).statistic
    assert kendall_tau_b(list(range(30)), order) == pytest.approx(expected, abs=1e-12)


# -- top-k overlap and promotion ----------------------------------------------------------


def test_overlap_and_promotion_by_hand() -> None:
    recall = [0, 1, 2, 3, 4]
    reranked = [3, 0, 4, 1, 2]
    # top-2: {3, 0} vs {0, 1} share one; 3 sits at recall rank 4.
    assert topk_overlap(recall, reranked, 2) == 0.5
    assert max_promotion(recall, reranked, 2) == 4
    # top-3: {3, 0, 4} vs {0, 1, 2}: one shared; 4 is at recall rank 5.
    assert topk_overlap(recall, reranked, 3) == pytest.approx(1 / 3)
    assert max_promotion(recall, reranked, 3) == 5


def test_overlap_and_promotion_when_nothing_moved() -> None:
    assert topk_overlap([2, 0, 1], [2, 0, 1], 2) == 1.0
    assert max_promotion([2, 0, 1], [2, 0, 1], 2) == 2


def test_overlap_and_promotion_undefined_for_k_zero() -> None:
    assert topk_overlap([0, 1], [1, 0], 0) is None
    assert max_promotion([0, 1], [1, 0], 0) is None
    assert max_promotion([0, 1], [], 3) is None


def test_promotion_of_a_position_recall_never_had_is_an_error() -> None:
    with pytest.raises(KeyError):
        max_promotion([0, 1], [7], 1)


# -- one call -----------------------------------------------------------------------------


def test_a_reranker_returning_recall_order_scores_tau_one_overlap_one() -> None:
    given_ = cands(0.3, 0.9, 0.5, 0.1)  # recall order: 1, 2, 0, 3
    scored = [(1, 4.0), (2, 3.0), (0, 2.0), (3, 1.0)]

    quality = rerank_quality(given_, scored, top_k=2)

    assert quality == RerankQuality(
        kendall_tau=1.0, topk_overlap=1.0, max_promotion=2, top_score=4.0, score_margin=1.0
    )


def test_a_reranking_call_by_hand() -> None:
    given_ = cands(0.9, 0.8, 0.7, 0.6)  # recall order 0, 1, 2, 3
    scored = [(3, 0.95), (0, 0.9), (2, 0.5), (1, 0.25)]  # the last recall one came first

    quality = rerank_quality(given_, scored, top_k=2)

    # Pairs (recall, rerank) over 6: (0,1) C, (0,2) C, (0,3) D, (1,2) D, (1,3) D, (2,3) D:
    # (2 - 4) / 6.
    assert quality.kendall_tau == pytest.approx(-1 / 3)
    assert quality.topk_overlap == 0.5  # {3, 0} vs {0, 1}
    assert quality.max_promotion == 4
    assert quality.top_score == 0.95
    assert quality.score_margin == pytest.approx(0.05)


def test_k_larger_than_n_compares_what_there_is() -> None:
    given_ = cands(0.9, 0.8, 0.7)
    scored = [(0, 3.0), (1, 2.0), (2, 1.0)]

    quality = rerank_quality(given_, scored, top_k=10)

    assert quality.topk_overlap == 1.0
    assert quality.max_promotion == 3


def test_k_is_the_number_scored_without_top_k() -> None:
    given_ = cands(0.9, 0.8, 0.7)
    scored = [(2, 3.0), (1, 2.0), (0, 1.0)]  # reversed: every one is still in the top-3

    quality = rerank_quality(given_, scored)

    assert quality.topk_overlap == 1.0
    assert quality.max_promotion == 3
    assert quality.kendall_tau == -1.0


def test_a_provider_that_returned_only_its_top_n() -> None:
    # Five candidates, the provider scored and returned two (top_n=2): tau over those two.
    given_ = cands(0.9, 0.8, 0.7, 0.6, 0.5)
    scored = [(4, 2.0), (0, 1.0)]

    quality = rerank_quality(given_, scored, top_k=2)

    assert quality.kendall_tau == -1.0  # recall had 0 above 4; the reranker put 4 first
    assert quality.topk_overlap == 0.5  # {4, 0} vs {0, 1}
    assert quality.max_promotion == 5


def test_tau_absent_without_recall_scores_the_rest_still_measured() -> None:
    given_ = cands(None, None, None)  # recall order is the input order
    scored = [(2, 0.9), (0, 0.5), (1, 0.1)]

    quality = rerank_quality(given_, scored, top_k=2)

    assert quality.kendall_tau is None
    assert quality.topk_overlap == 0.5  # {2, 0} vs {0, 1}
    assert quality.max_promotion == 3
    assert ATTR_KENDALL_TAU not in quality.attributes()


def test_tau_absent_when_every_recall_score_is_equal() -> None:
    quality = rerank_quality(cands(0.5, 0.5, 0.5), [(1, 3.0), (0, 2.0), (2, 1.0)])
    assert quality.kendall_tau is None


def test_some_recall_scores_missing_rank_below_the_scored_ones() -> None:
    # d1 has no recall score: recall order 0, 2, 1. Keys (0.9, -inf, 0.1).
    given_ = cands(0.9, None, 0.1)
    scored = [(1, 3.0), (0, 2.0), (2, 1.0)]

    quality = rerank_quality(given_, scored, top_k=1)

    # Pairs by rerank: (1,0): recall -inf < 0.9 but rerank 3 > 2: D; (1,2): -inf < 0.1, 3 > 1: D;
    # (0,2): 0.9 > 0.1 and 2 > 1: C. (1 - 2) / 3.
    assert quality.kendall_tau == pytest.approx(-1 / 3)
    assert quality.topk_overlap == 0.0
    assert quality.max_promotion == 3


def test_collapsed_scores_leave_tau_undefined_and_margin_zero() -> None:
    quality = rerank_quality(cands(0.9, 0.8, 0.7), [(0, 0.5), (1, 0.5), (2, 0.5)])

    assert quality.kendall_tau is None
    assert quality.top_score == 0.5
    assert quality.score_margin == 0.0
    assert quality.topk_overlap == 1.0


def test_one_candidate_and_none() -> None:
    one = rerank_quality(cands(0.4), [(0, 2.5)], top_k=5)
    assert one == RerankQuality(
        kendall_tau=None, topk_overlap=1.0, max_promotion=1, top_score=2.5, score_margin=None
    )
    empty = rerank_quality([], [], top_k=5)
    assert empty == RerankQuality(None, None, None, None, None)
    assert empty.attributes() == {}


def test_attributes_name_every_signal() -> None:
    quality = RerankQuality(
        kendall_tau=0.5, topk_overlap=0.25, max_promotion=7, top_score=3.5, score_margin=0.0
    )

    assert quality.attributes() == {
        ATTR_KENDALL_TAU: 0.5,
        ATTR_TOPK_OVERLAP: 0.25,
        ATTR_MAX_PROMOTION: 7,
        ATTR_TOP_SCORE: 3.5,
        ATTR_SCORE_MARGIN: 0.0,
    }
    assert all(key.startswith("retrieval_stage.quality.") for key in quality.attributes())


def test_recall_order_breaks_recall_ties_so_an_echo_still_reads_tau_one() -> None:
    # BM25 often ties: d1 and d2 share a score. Recall order (the stage's) is 0, 1, 2, 3.
    given_ = cands(0.9, 0.5, 0.5, 0.1)
    echoed = [(0, 4.0), (1, 3.0), (2, 2.0), (3, 1.0)]
    swapped_tie = [(0, 4.0), (2, 3.0), (1, 2.0), (3, 1.0)]

    assert rerank_quality(given_, echoed).kendall_tau == 1.0
    # Swapping the tied pair is a change of the order the stage would have returned: 1 of 6
    # pairs reversed, (5 - 1) / 6.
    assert rerank_quality(given_, swapped_tie).kendall_tau == pytest.approx(4 / 6)


def _one_call(seed: int) -> tuple[list[float | None], list[tuple[int, float]], int | None]:
    """A random call from `seed`: recall scores with ties and unscored candidates, a reranker
    that scored some or all of them with tied or distinct scores, best first as the stage hands
    them over, and a top_k that may exceed n."""
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    ties = rng.choice([0.0, 0.3, 1.0])  # share of scores drawn from a handful of values

    def score() -> float:
        return float(rng.randint(0, 4)) if rng.random() < ties else rng.uniform(-1e6, 1e6)

    unscored = rng.choice([0.0, 0.2, 1.0])
    recall_given = [None if rng.random() < unscored else score() for _ in range(n)]
    positions = rng.sample(range(n), rng.randint(1, n))
    scored = sorted(((i, score()) for i in positions), key=lambda p: (-p[1], p[0]))
    top_k = rng.choice([None, rng.randint(1, 70)])
    return recall_given, scored, top_k


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**64))
def test_one_call_matches_scipy_and_the_plain_definitions(seed: int) -> None:
    # Any recall scores (ties, unscored ones), a reranker that scored some or all of the
    # candidates with any scores (ties), best first as the stage hands them over.
    recall_given, scored, top_k = _one_call(seed)
    given_ = cands(*recall_given)
    recall = recall_order(given_)

    quality = rerank_quality(given_, scored, top_k, recall=recall)

    ranked = [i for i, _ in scored]
    k = len(scored) if top_k is None else min(top_k, len(scored))
    assert quality.topk_overlap == topk_overlap(recall, ranked, k)
    assert quality.max_promotion == max_promotion(recall, ranked, k)
    assert quality.top_score == scored[0][1]
    if len(scored) < 2 or len({c.score for c in given_}) == 1:
        assert quality.kendall_tau is None
        return
    place = {position: -rank for rank, position in enumerate(recall)}
    expected = stats.kendalltau([place[i] for i in ranked], [s for _, s in scored]).statistic
    if math.isnan(expected):  # every rerank score equal
        assert quality.kendall_tau is None
    else:
        assert quality.kendall_tau == pytest.approx(expected, abs=1e-12)
