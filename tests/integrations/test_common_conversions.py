"""What the framework adapters share (`integrations._common`): a framework's score becomes a
recall score only when it is a finite number, and a document with no id (None or "") is
labelled by its position."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest

from retrieval_stage.integrations._common import candidate_id, recall_score


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, float("nan"), Decimal("NaN"), 10**400]
)
def test_a_score_that_is_not_a_finite_number_is_no_recall_score(value: object) -> None:
    assert recall_score(value) is None


@pytest.mark.parametrize("value", [None, "0.5", True, b"1", [0.5]])
def test_a_score_that_is_not_a_number_is_no_recall_score(value: object) -> None:
    assert recall_score(value) is None


@pytest.mark.parametrize(
    ("value", "expected"), [(0.5, 0.5), (3, 3.0), (Fraction(1, 4), 0.25), (-2.5, -2.5)]
)
def test_a_finite_number_is_the_recall_score(value: object, expected: float) -> None:
    assert recall_score(value) == expected


@pytest.mark.parametrize(("value", "expected"), [(None, "7"), ("", "7"), (0, "0"), ("d1", "d1")])
def test_a_document_without_an_id_is_labelled_by_its_position(value: object, expected: str) -> None:
    assert candidate_id(value, 7) == expected
