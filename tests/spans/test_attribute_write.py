"""`_otel_private.set_span_attributes`: the SDK's result, without the SDK's re-cleaning.

The stage writes a RERANKER span's ~300 outcome attributes in one call; the SDK's
``set_attributes`` re-validates every value and locks per key, the largest single cost a traced
async call added (issue 26). These pin that the shortcut leaves a span exactly as the SDK
would (same keys, values, order, drop count), that it is taken where it should be, and that
everything it cannot vouch for goes through the SDK.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider

from retrieval_stage.spans.otel_private import set_span_attributes

KEYS = st.sampled_from([f"key.{i}" for i in range(10)])  # small, so calls overlap
VALUES = st.one_of(st.text(max_size=8), st.booleans(), st.integers(), st.floats(allow_nan=False))


def span(limit: int | None = 10_000, value_limit: int | None = None) -> Any:
    limits = SpanLimits(
        max_span_attributes=limit if limit is not None else SpanLimits.UNSET,
        max_attribute_length=value_limit,
    )
    return TracerProvider(span_limits=limits).get_tracer("t").start_span("s")


def stored(s: ReadableSpan) -> tuple[list[tuple[str, Any]], int]:
    """The span's attributes in order, and how many were dropped."""
    assert s.attributes is not None
    return list(s.attributes.items()), s.dropped_attributes


@settings(max_examples=200, deadline=None)
@given(
    first=st.dictionaries(KEYS, VALUES, max_size=12),
    second=st.dictionaries(KEYS, VALUES, max_size=12),
    limit=st.sampled_from([None, 5, 30]),
)
def test_the_span_ends_up_as_the_sdk_leaves_it(
    first: dict[str, Any], second: dict[str, Any], limit: int | None
) -> None:
    ours, theirs = span(limit), span(limit)
    for attributes in (first, second):
        set_span_attributes(ours, attributes)
        theirs.set_attributes(attributes)
    assert stored(ours) == stored(theirs)
    ours.end()
    theirs.end()


def test_plain_values_skip_the_sdk_cleaning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise AssertionError("went through the SDK's _set_items")

    s = span()
    monkeypatch.setattr(BoundedAttributes, "_set_items", refuse)
    attributes = {f"reranker.input_documents.{i}.document.score": i / 10 for i in range(300)}
    set_span_attributes(s, {**attributes, "model": "m", "flag": True, "n": 3})
    assert len(s.attributes) == 303
    s.end()


@pytest.mark.parametrize(
    ("case", "attributes"),
    [
        ("a list value", {"tags": ["a", "b"]}),
        ("a value of another type", {"x": 1.5, "y": object()}),
        ("an empty key", {"": "v"}),
    ],
)
def test_what_the_sdk_must_clean_goes_through_the_sdk(
    case: str, attributes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = span(), span()
    set_span_attributes(ours, attributes)
    theirs.set_attributes(attributes)
    assert stored(ours) == stored(theirs)


def test_a_full_span_evicts_as_the_sdk_does() -> None:
    ours, theirs = span(limit=3), span(limit=3)
    for s in (ours, theirs):
        s.set_attributes({"a": 1, "b": 2})
    set_span_attributes(ours, {"c": 3, "d": 4})
    theirs.set_attributes({"c": 3, "d": 4})
    assert stored(ours) == stored(theirs) == ([("b", 2), ("c", 3), ("d", 4)], 1)


def test_a_value_length_limit_is_applied_by_the_sdk() -> None:
    s = span(value_limit=3)
    set_span_attributes(s, {"k": "abcdef"})
    assert s.attributes["k"] == "abc"


def test_an_ended_span_is_left_alone() -> None:
    s = span()
    s.end()
    set_span_attributes(s, {"k": "v"})
    assert "k" not in s.attributes
