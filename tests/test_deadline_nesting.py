"""`_deadline.sharing` nested: the inner block can only shorten what the outer one left."""

from __future__ import annotations

import pytest

from retrieval_stage import _deadline


@pytest.mark.parametrize(("outer", "inner"), [(1.0, 10.0), (10.0, 1.0)])
def test_a_nested_shared_deadline_takes_the_sooner_of_the_two(outer: float, inner: float) -> None:
    assert _deadline.remaining() is None
    with _deadline.sharing(lambda: outer):
        assert _deadline.remaining() == outer
        with _deadline.sharing(lambda: inner):
            assert _deadline.remaining() == min(outer, inner)
        assert _deadline.remaining() == outer
    assert _deadline.remaining() is None
