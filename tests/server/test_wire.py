"""What goes over the wire, as pure functions: `parse_rerank_body`'s refusals (each says what
was wrong, never "not UTF-8" for something else; exactly the client cap is accepted) and
`render_scores` (TEI's order, best first; a score that is not finite never sent)."""

from __future__ import annotations

import json
import math

import pytest

from retrieval_stage.server.wire import ApiError, parse_rerank_body, render_scores


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


def tei_body(texts: int) -> bytes:
    return json.dumps({"query": "q", "texts": [f"t{i}" for i in range(texts)]}).encode()


def test_exactly_the_client_cap_is_accepted_and_one_more_refused() -> None:
    assert len(parse_rerank_body(tei_body(32), max_client_batch_size=32).texts) == 32
    error = refusal(tei_body(33))
    assert (error.status, error.message) == (422, "batch size 33 > maximum allowed batch size 32")


def test_teis_answer_is_sorted_best_first_ties_in_input_order() -> None:
    job = parse_rerank_body(tei_body(4), max_client_batch_size=32)
    ranks = json.loads(render_scores(job, [0.1, 0.9, 0.5, 0.9]))
    assert ranks == [
        {"index": 1, "score": 0.9},
        {"index": 3, "score": 0.9},
        {"index": 2, "score": 0.5},
        {"index": 0, "score": 0.1},
    ]


@pytest.mark.parametrize(
    ("bad", "says"), [(math.nan, "score is NaN"), (math.inf, "score is infinite")]
)
def test_a_score_that_is_not_finite_is_a_backend_failure_never_sent(bad: float, says: str) -> None:
    job = parse_rerank_body(tei_body(2), max_client_batch_size=32)
    with pytest.raises(ApiError) as refused:
        render_scores(job, [0.5, bad])
    assert (refused.value.status, refused.value.kind, refused.value.message) == (
        424,
        "Backend",
        says,
    )
