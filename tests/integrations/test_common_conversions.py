"""What the framework adapters share (`integrations._common`): a framework's score becomes a
recall score only when it is a finite number, and a document with no id (None or "") is
labelled by its position."""

from __future__ import annotations

import math
from decimal import Decimal
from enum import Enum
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


class Tier(str, Enum):
    GOLD = "gold"


class Detached:
    """A lazy attribute of a detached ORM row: asking for its text raises."""

    def __str__(self) -> str:
        raise RuntimeError("not bound to a Session")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Tier.GOLD, "gold"),  # its characters, as the framework's JSON has them: not Tier.GOLD
        (42, "42"),
        (Detached(), "<unprintable Detached: RuntimeError>"),
    ],
)
def test_a_document_id_is_its_text_and_one_that_cannot_print_is_a_placeholder(
    value: object, expected: str
) -> None:
    assert (candidate_id(value, 7), type(candidate_id(value, 7))) == (expected, str)
