"""What a span holds of a value that does not print as it looks (`spans.content`).

A str subclass (a str Enum member) is its characters, as the SDK's encoder and json write it;
anything else is its ``str``; a value whose ``str`` (or JSON) raises is a placeholder that says
so, ``<unprintable Row: RuntimeError>``, and costs that value only.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

import pytest

from retrieval_stage.spans.content import as_text, cap_content, capped, metadata_json


class Tier(str, Enum):
    GOLD = "gold"


class Row:
    """A lazy attribute of a detached ORM row: its ``str`` and its ``repr`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("Parent instance is not bound to a Session")

    __repr__ = __str__


class Shy(str):
    """A str subclass whose methods all raise: only its characters can be read."""

    def __str__(self) -> str:
        raise RuntimeError("__str__")

    def __len__(self) -> int:
        raise RuntimeError("__len__")

    def isascii(self) -> bool:
        raise RuntimeError("isascii")

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        raise RuntimeError("encode")


class Items(dict[str, Any]):
    """A mapping value json reads through ``items()``, which raises."""

    def items(self) -> Any:
        raise RuntimeError("items")


PLACEHOLDER = "<unprintable Row: RuntimeError>"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        (Tier.GOLD, "gold"),
        (Shy("shy é"), "shy é"),
        (7, "7"),
        (Row(), PLACEHOLDER),
    ],
    ids=["str", "str-enum", "str-whose-methods-raise", "int", "str-raises"],
)
def test_a_value_is_taken_as_its_text_and_exactly_a_str(value: object, expected: str) -> None:
    for taken in (as_text(value), cap_content(value, 100), capped(value, 100)):  # type: ignore[arg-type]
        assert (type(taken), taken) == (str, expected)


def test_a_long_str_subclass_is_capped_by_its_characters() -> None:
    taken = cap_content(Shy("é" * 100), 50)
    assert type(taken) is str
    assert taken.startswith("é" * 10)
    assert len(taken.encode()) <= 50


def test_an_unprintable_metadata_value_is_a_placeholder_and_the_rest_is_kept() -> None:
    text = metadata_json({"src": "wiki", "row": Row(), "n": 2, "when": object}, 2000)
    assert json.loads(text) == {"n": 2, "row": PLACEHOLDER, "src": "wiki", "when": str(object)}


def test_metadata_keys_are_their_text() -> None:
    text = metadata_json({Tier.GOLD: 1, Row(): 2, 3: "c"}, 2000)  # type: ignore[dict-item]
    assert json.loads(text) == {"gold": 1, PLACEHOLDER: 2, "3": "c"}


def test_a_value_json_cannot_read_is_a_placeholder_the_rest_as_json_writes_it() -> None:
    metadata = {"b": [1, "x"], "bad": Items(k=1), "a": {"z": None, "y": 0.5}, "t": Tier.GOLD}
    text = metadata_json(metadata, 2000)
    whole = dict(metadata, bad="<unprintable Items: RuntimeError>")
    assert text == json.dumps(whole, ensure_ascii=False, sort_keys=True)


def test_nan_beside_an_unprintable_value_keeps_the_repr_form_with_the_placeholder() -> None:
    text = metadata_json({"v": math.nan, "row": Row()}, 2000)
    assert json.loads(text) == {"_repr": f"{{'v': nan, 'row': {PLACEHOLDER}}}"}


def test_nan_beside_a_value_json_cannot_read_keeps_both_keys() -> None:
    text = metadata_json({"v": math.nan, "bad": Items(k=1), "ok": 1}, 2000)
    assert json.loads(text) == {"bad": "<unprintable Items: RuntimeError>", "ok": 1, "v": "nan"}
