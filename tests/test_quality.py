"""The label-free quality signals (`retrieval_stage.quality`), exact on hand-computed cases.

Each expected value below was worked out by hand from the definitions in the module docstring;
a property test holds every signal of a random call (ties on both sides, unscored candidates,
collapsed scores, input in recall order or not, n from 0) to the plain definitions, tau-b
exactly (the same float) to a pair-by-pair count and to scipy's within rounding.
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
    RerankQuality,
    kendall_tau_b,
    max_promotion,
    rank_biased_overlap,
    rerank_quality,
    topk_overlap,
)
from retrieval_stage.spans.keys import (
    ATTR_KENDALL_TAU,
    ATTR_MAX_PROMOTION,
    ATTR_RBO,
    ATTR_SCORE_MARGIN,
    ATTR_SCORE_SPREAD,
    ATTR_TOP_SCORE,
    ATTR_TOPK_OVERLAP,
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
        kendall_tau=1.0,
        topk_overlap=1.0,
        max_promotion=2,
        top_score=4.0,
        score_margin=1.0,
        rbo=1.0,
        score_spread=1.0,
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
    # RBO of [3, 0] against [0, 1], p = 0.9: X_1 = 0, X_2 = 1, so
    # 0.1 / 0.9 * (0 + 1/2 * 0.81) + 1/2 * 0.81 = 0.045 + 0.405.
    assert quality.rbo == pytest.approx(0.45)
    assert quality.score_spread == pytest.approx(0.05)  # 0.95 - 0.9, the top 2


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
        kendall_tau=None,
        topk_overlap=1.0,
        max_promotion=1,
        top_score=2.5,
        score_margin=None,
        rbo=1.0,
        score_spread=None,
    )
    empty = rerank_quality([], [], top_k=5)
    assert empty == RerankQuality(None, None, None, None, None)
    assert empty.attributes() == {}


def test_attributes_name_every_signal() -> None:
    quality = RerankQuality(
        kendall_tau=0.5,
        topk_overlap=0.25,
        max_promotion=7,
        top_score=3.5,
        score_margin=0.0,
        rbo=0.125,
        score_spread=1.5,
    )

    assert quality.attributes() == {
        ATTR_KENDALL_TAU: 0.5,
        ATTR_TOPK_OVERLAP: 0.25,
        ATTR_MAX_PROMOTION: 7,
        ATTR_TOP_SCORE: 3.5,
        ATTR_SCORE_MARGIN: 0.0,
        ATTR_RBO: 0.125,
        ATTR_SCORE_SPREAD: 1.5,
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


def test_two_candidates_kept_swapped_and_tied() -> None:
    given_ = cands(0.9, 0.1)
    kept = rerank_quality(given_, [(0, 2.0), (1, 1.0)], top_k=1)
    swapped = rerank_quality(given_, [(1, 2.0), (0, 1.0)], top_k=1)
    tied = rerank_quality(given_, [(0, 1.5), (1, 1.5)], top_k=1)

    # k = 1: a single top-k score has no spread.
    assert kept == RerankQuality(1.0, 1.0, 1, 2.0, 1.0, rbo=1.0, score_spread=None)
    assert swapped == RerankQuality(-1.0, 0.0, 2, 2.0, 1.0, rbo=0.0, score_spread=None)
    assert tied == RerankQuality(None, 1.0, 1, 1.5, 0.0, rbo=1.0, score_spread=None)


def test_ties_in_recall_and_in_rerank_by_hand() -> None:
    # Recall 0.7 0.7 0.2 0.2 0.2 (ties broken by input position): ranks 0 1 2 3 4 for
    # positions 0 1 2 3 4, recall order the input order.
    given_ = cands(0.7, 0.7, 0.2, 0.2, 0.2)
    # Rerank runs {3, 1} at 2.0, {4} at 1.0, {0, 2} at 0.5; ranks in rerank order 3 1 4 0 2.
    scored = [(3, 2.0), (1, 2.0), (4, 1.0), (0, 0.5), (2, 0.5)]

    quality = rerank_quality(given_, scored, top_k=2)

    # 10 pairs, 2 tied in score ((3,1), (0,2)). Of the other 8, the one above has the better
    # (lower) rank in (3,4), (1,4), (1,2): concordant 3, discordant 5. -2 / sqrt(10 * 8).
    assert quality.kendall_tau == -2 / math.sqrt(80)
    assert quality.topk_overlap == 0.5  # {3, 1} vs {0, 1}
    assert quality.max_promotion == 4
    assert quality.score_margin == 0.0


def test_recall_not_in_input_order_with_rerank_ties_by_hand() -> None:
    # Recall order 2, 0, 3, 1: ranks of positions 0..3 are 1, 3, 0, 2.
    given_ = cands(0.5, 0.1, 0.9, 0.3)
    scored = [(1, 3.0), (0, 3.0), (3, 1.0), (2, 1.0)]  # ranks 3 1 2 0, runs {3, 1} {2, 0}

    quality = rerank_quality(given_, scored, top_k=3)

    # 6 pairs, 2 tied; across the runs, (3,2) (3,0) (1,0) discordant, (1,2) concordant:
    # (1 - 3) / sqrt(6 * 4).
    assert quality.kendall_tau == -2 / math.sqrt(24)
    assert quality.topk_overlap == pytest.approx(2 / 3)  # ranks {3, 1, 2} vs {0, 1, 2}
    assert quality.max_promotion == 4


def test_scores_not_best_first_are_still_compared_pair_by_pair() -> None:
    # A direct caller's order (the stage always hands scores best first): the pairs count
    # the same; top-k and top_score are the first of what was given.
    given_ = cands(0.9, 0.8, 0.7)
    quality = rerank_quality(given_, [(0, 2.0), (2, 3.0), (1, 1.0)], top_k=1)

    # By score 2 > 0 > 1: (0,2) D, (0,1) C, (2,1) D: (1 - 2) / 3.
    assert quality.kendall_tau == pytest.approx(-1 / 3)
    assert quality.top_score == 2.0
    assert quality.score_margin == -1.0
    assert quality.max_promotion == 1


@pytest.mark.parametrize("n", [65, 1500])
def test_more_candidates_than_the_bit_tables_hold(n: int) -> None:
    # Past the first table (64 ranks) and past the cached ones (1024): the same signals.
    rng = random.Random(n)
    given_ = cands(*(rng.random() for _ in range(n)))
    scored = sorted(((i, rng.random()) for i in range(n)), key=lambda p: (-p[1], p[0]))
    recall = recall_order(given_)

    quality = rerank_quality(given_, scored, top_k=n // 2, recall=recall)

    place = {position: -rank for rank, position in enumerate(recall)}
    expected = stats.kendalltau([place[i] for i, _ in scored], [s for _, s in scored])
    assert quality.kendall_tau == pytest.approx(expected.statistic, abs=1e-12)
    top = [i for i, _ in scored[: n // 2]]
    assert quality.topk_overlap == len(set(top) & set(recall[: n // 2])) / (n // 2)
    assert quality.max_promotion == max(1 - place[i] for i in top)


def _one_call(seed: int) -> tuple[list[float | None], list[tuple[int, float]], int | None]:
    """A random call from `seed`: recall scores with ties and unscored candidates (given in
    recall order or not, sometimes all equal), a reranker that scored none, some or all of
    them with distinct, tied or all-equal scores (duplicates drawn from as few as two values),
    best first as the stage hands them over or, now and then, in any order (a direct caller),
    and a top_k that may exceed n."""
    rng = random.Random(seed)
    n = rng.randint(0, 60)
    ties = rng.choice([0.0, 0.3, 1.0])  # share of scores drawn from a handful of values
    values = rng.randint(1, 4)

    def score() -> float:
        return float(rng.randint(0, values)) if rng.random() < ties else rng.uniform(-1e6, 1e6)

    unscored = rng.choice([0.0, 0.2, 1.0])
    recall_given = [None if rng.random() < unscored else score() for _ in range(n)]
    if rng.random() < 0.5:  # as a retriever hands them over: recall order is input order
        recall_given.sort(key=lambda s: (s is None, -(s or 0.0)))
    if n and rng.random() < 0.1:  # recall expressed no order
        recall_given = [recall_given[0]] * n
    positions = rng.sample(range(n), rng.randint(0, n))
    collapsed = rng.random() < 0.1
    scored = [(i, 0.5 if collapsed else score()) for i in positions]
    if rng.random() < 0.85:
        scored.sort(key=lambda p: (-p[1], p[0]))
    top_k = rng.choice([None, rng.randint(1, 70)])
    return recall_given, scored, top_k


def _plain_tau_b(x: list[float], y: list[float]) -> float | None:
    """tau-b by its definition, every pair in turn: (concordant - discordant) /
    sqrt((n0 - pairs tied in x) * (n0 - pairs tied in y)); None where that is 0/0."""
    n = len(x)
    n0 = n * (n - 1) // 2
    balance = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            sx = (x[i] > x[j]) - (x[i] < x[j])
            sy = (y[i] > y[j]) - (y[i] < y[j])
            ties_x += sx == 0
            ties_y += sy == 0
            balance += sx * sy
    if n0 in (ties_x, ties_y):
        return None
    if not (ties_x or ties_y):
        return balance / n0
    return balance / math.sqrt((n0 - ties_x) * (n0 - ties_y))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**64))
def test_one_call_matches_scipy_and_the_plain_definitions(seed: int) -> None:
    # Any recall scores (ties, unscored ones), a reranker that scored some or all of the
    # candidates with any scores (ties), best first as the stage hands them over or not.
    recall_given, scored, top_k = _one_call(seed)
    given_ = cands(*recall_given)
    recall = recall_order(given_)

    quality = rerank_quality(given_, scored, top_k, recall=recall)

    if not scored:
        assert quality == RerankQuality(None, None, None, None, None)
        return
    ranked = [i for i, _ in scored]
    k = len(scored) if top_k is None else min(top_k, len(scored))
    recall_rank = {position: rank for rank, position in enumerate(recall)}  # 0 best
    top = ranked[:k]
    assert quality.topk_overlap == len(set(top) & set(recall[:k])) / k
    assert quality.max_promotion == max(recall_rank[i] + 1 for i in top)
    assert quality.top_score == scored[0][1]
    assert quality.score_margin == (scored[0][1] - scored[1][1] if len(scored) > 1 else None)
    assert quality.rbo == pytest.approx(rank_biased_overlap(recall[:k], top), abs=1e-12)
    head = [s for _, s in scored[:k]]
    assert quality.score_spread == (max(head) - min(head) if k > 1 else None)
    if len(scored) < 2 or len({c.score for c in given_}) == 1:
        assert quality.kendall_tau is None
        return
    x = [-recall_rank[i] for i in ranked]  # higher is better, as the scores
    y = [s for _, s in scored]
    expected = stats.kendalltau(x, y).statistic
    if math.isnan(expected):  # every rerank score equal
        assert quality.kendall_tau is None
    else:
        assert quality.kendall_tau == pytest.approx(expected, abs=1e-12)
    # Exactly (the same float) as the definition computed pair by pair.
    assert quality.kendall_tau == _plain_tau_b(x, y)
