"""The numpy sign-flip test against ``scipy.stats.permutation_test``, which it replaced.

The eval command no longer needs scipy (the [cli] extra does not install it); the test extra
keeps it, so here the p-values are held to scipy's: equal when both enumerate every sign pattern,
and within Monte Carlo error of the exact value when either draws resamples.
"""

from __future__ import annotations

import inspect
import itertools
import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage.evaluation import paired_permutation_test

stats = pytest.importorskip("scipy.stats", reason="scipy (the test extra) is the reference")
np = pytest.importorskip("numpy")

# Per-query rank metrics take few values: reciprocal ranks, recall shares, 0/1 accuracy.
METRIC_VALUES = (0.0, 1.0, 0.5, 1 / 3, 0.25, 0.2, 1 / 6, 1 / 7, 0.1, 2 / 3, 0.6309297535714574)


def scipy_p(a: list[float], b: list[float], resamples: int, seed: int = 0) -> float:
    """The p-value as the eval computed it before: scipy's paired permutation test."""
    generator = np.random.default_rng(seed)
    seeded = (
        {"rng": generator}
        if "rng" in inspect.signature(stats.permutation_test).parameters
        else {"random_state": generator}
    )

    def mean_difference(x: Any, y: Any, axis: int) -> Any:
        return np.mean(x - y, axis=axis)

    result = stats.permutation_test(
        (np.asarray(a, dtype=float), np.asarray(b, dtype=float)),
        mean_difference,
        permutation_type="samples",
        vectorized=True,
        n_resamples=resamples,
        alternative="two-sided",
        **seeded,
    )
    return min(1.0, float(result.pvalue))


DYADIC_VALUES = (0.0, 1.0, 0.5, 0.25, 0.75, 0.125, 0.375)
"""Metric values whose sums and means of up to 10 are exact in floats: no rounding anywhere."""


def pairs(values: tuple[float, ...]) -> st.SearchStrategy[tuple[list[float], list[float]]]:
    return st.integers(min_value=2, max_value=10).flatmap(
        lambda n: st.tuples(
            st.lists(st.sampled_from(values), min_size=n, max_size=n),
            st.lists(st.sampled_from(values), min_size=n, max_size=n),
        )
    )


def intended(value: float) -> Fraction:
    """The metric value a float stands for: 1/3 for 0.333..., a float with no small-fraction
    meaning (1/log2(3)) as itself."""
    rational = Fraction(value).limit_denominator(1000)
    return rational if abs(rational - Fraction(value)) < Fraction(1, 10**15) else Fraction(value)


def exact_p(a: list[float], b: list[float]) -> float:
    """The exact two-sided p-value in rational arithmetic over the values the floats stand
    for: every sign pattern, ties decided exactly."""
    differences = [intended(x) - intended(y) for x, y in zip(a, b, strict=True)]
    observed = sum(differences)
    below = above = 0
    for pattern in itertools.product((1, -1), repeat=len(differences)):
        total = sum(s * d for s, d in zip(pattern, differences, strict=True))
        below += total <= observed
        above += total >= observed
    return min(1.0, 2 * min(below, above) / 2 ** len(differences))


@settings(max_examples=40, deadline=None)
@given(pairs(DYADIC_VALUES))
def test_exact_p_values_equal_scipys(samples: tuple[list[float], list[float]]) -> None:
    a, b = samples
    # 2**n <= resamples: scipy enumerates every pattern, and so does ours.
    assert paired_permutation_test(a, b, resamples=1024) == scipy_p(a, b, resamples=1024)


@settings(max_examples=60, deadline=None)
@given(pairs(METRIC_VALUES))
def test_exact_p_values_equal_exact_arithmetic(samples: tuple[list[float], list[float]]) -> None:
    """With thirds and sevenths the means carry rounding: a tie in exact arithmetic is still
    a tie here (scipy's, relative to the observed mean alone, can split it)."""
    a, b = samples
    assert paired_permutation_test(a, b, resamples=1024) == pytest.approx(exact_p(a, b))


def test_a_tie_that_rounding_would_split_is_counted_on_both_sides() -> None:
    # Found by hypothesis against scipy: the differences sum to 0 exactly (1 - 1/3 is one
    # float, used twice each way), but computed means land at +-1e-17, and scipy, whose
    # tolerance is relative to that observed mean, gave 0.8125 where the answer is 1.
    a = [0.0, 1.0, 0.0, 1.0, 1.0, 1 / 3, 1 / 3, 1 / 3]
    b = [0.0, 1.0, 1 / 3, 1 / 3, 1 / 3, 0.0, 1.0, 1.0]
    assert exact_p(a, b) == 1.0
    assert paired_permutation_test(a, b, resamples=1024) == 1.0


def test_exact_p_values_equal_scipys_on_real_valued_differences() -> None:
    generator = np.random.default_rng(7)
    for n in (2, 3, 5, 8, 10):
        for _ in range(3):
            a = generator.random(n).tolist()
            b = (np.asarray(a) + generator.normal(0.1, 0.3, n)).tolist()
            assert paired_permutation_test(a, b, resamples=1024) == scipy_p(a, b, 1024)


def test_zero_differences_do_not_force_monte_carlo() -> None:
    # 20 pairs, only 4 differ: scipy samples (2**20 > 9999), ours enumerates the 16 patterns.
    a = [0.5, 1.0, 1.0, 0.25] + [1.0] * 16
    b = [1.0, 0.5, 1 / 3, 1.0] + [1.0] * 16
    exact = scipy_p(a[:4], b[:4], resamples=16)  # the same test on the differing pairs
    assert paired_permutation_test(a, b) == pytest.approx(exact, abs=1e-12)
    assert scipy_p(a, b, resamples=9999) == pytest.approx(exact, abs=monte_carlo_error(exact, 9999))


def monte_carlo_error(p: float, resamples: int) -> float:
    """Five standard errors of a two-sided Monte Carlo p-value (twice a tail share), plus
    the add-one term."""
    tail = p / 2
    return 5 * 2 * math.sqrt(tail * (1 - tail) / resamples) + 2 / resamples


@pytest.mark.parametrize("seed", [0, 1])
def test_monte_carlo_p_values_agree_with_the_exact_one(seed: int) -> None:
    generator = np.random.default_rng(100 + seed)
    n = 12  # 4,096 patterns: exact with that many resamples, Monte Carlo with 2,000
    a = generator.choice(METRIC_VALUES, n).tolist()
    b = generator.choice(METRIC_VALUES, n).tolist()
    a[0], b[0] = 1.0, 0.0  # at least one difference, however the draw fell
    exact = scipy_p(a, b, resamples=2**n)
    assert paired_permutation_test(a, b, resamples=2**n) == exact
    ours = paired_permutation_test(a, b, resamples=2000, seed=seed)
    theirs = scipy_p(a, b, resamples=2000, seed=seed)
    tolerance = monte_carlo_error(exact, 2000)
    assert ours == pytest.approx(exact, abs=tolerance)
    assert theirs == pytest.approx(exact, abs=tolerance)
    assert ours >= 2 / 2001  # add-one: a Monte Carlo p-value is never 0


def test_a_monte_carlo_p_value_counts_the_observed_flips_once_more() -> None:
    # Every one of 15 queries improves: of 32,768 patterns only the observed one and its
    # mirror are as extreme, so 2,000 random flips almost surely draw neither and the p-value
    # is its add-one floor, 2/2001, in scipy and here alike (never 0).
    a, b = [1.0] * 15, [0.5, 1 / 3, 0.25, 0.2, 0.0] * 3
    assert paired_permutation_test(a, b, resamples=2000) == pytest.approx(2 / 2001)
    assert scipy_p(a, b, resamples=2000) == pytest.approx(2 / 2001)
