"""`parse_rerank_body`'s refusals of bodies JSON cannot hold as Python values: each says what
was wrong, never "not UTF-8" for something else."""

from __future__ import annotations

import pytest

from retrieval_stage.server.wire import ApiError, parse_rerank_body


def refusal(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse_rerank_body(raw, max_client_batch_size=32)
    return refused.value


@pytest.mark.parametrize("where", ["query", "texts"])
def test_a_number_past_pythons_digit_limit_is_said_to_be_one(where: str) -> None:
    number = b"7" * 5000
    raw = (
        b'{"query": ' + number + b', "texts": ["a"]}'
        if where == "query"
        else b'{"query": "q", "texts": [' + number + b"]}"
    )
    error = refusal(raw)
    assert (error.status, error.kind) == (400, "Validation")
    assert error.message == "the body holds a number with too many digits"


def test_a_body_that_is_not_utf8_is_still_said_to_be_that() -> None:
    error = refusal(b'{"query": "\xff\xfe", "texts": ["a"]}')
    assert (error.status, error.message) == (400, "the body is not valid JSON (not UTF-8)")
