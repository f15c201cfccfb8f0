"""What goes over the wire, as pure functions: `parse_rerank_body`'s refusals (each says what
was wrong, never "not UTF-8" for something else; exactly the client cap is accepted),
`render_scores` (TEI's order, best first; a score that is not finite never sent), and
`rerank_shape` telling TEI's, the sidecar's and Jina's/vLLM's bodies apart by their fields."""

from __future__ import annotations

import json
import math

import pytest

from retrieval_stage.server.wire import (
    ApiError,
    RerankJob,
    parse_rerank_body,
    render_scores,
    rerank_shape,
)


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


# -- POST /rerank's three shapes, told apart by their fields (issue 51) ------------------------


def shape_of(body: dict[str, object]) -> str:
    return rerank_shape(body)


def shape_refusal(body: dict[str, object]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        rerank_shape(body)
    return refused.value


def test_the_three_shapes_are_told_apart_by_their_fields() -> None:
    assert shape_of({"query": "q", "texts": ["a", "b"]}) == "tei"
    assert shape_of({"query": "q", "documents": [{"id": "x", "text": "a"}]}) == "sidecar"
    assert shape_of({"query": "q", "documents": ["a", "b"], "top_n": 1}) == "jina"


def test_a_jina_vllm_body_reads_into_its_query_and_texts_in_input_order() -> None:
    raw = json.dumps({"model": "m", "query": "q", "documents": ["a", "b", "c"], "top_n": 2})
    job = parse_rerank_body(raw.encode(), max_client_batch_size=32)
    assert (job.shape, job.query, job.texts, job.ids) == ("jina", "q", ("a", "b", "c"), None)


def test_teis_and_the_sidecars_bodies_read_exactly_as_before() -> None:
    tei = parse_rerank_body(
        json.dumps({"query": "q", "texts": ["a", "b"], "raw_scores": True}).encode(),
        max_client_batch_size=32,
    )
    assert tei == RerankJob(shape="tei", query="q", texts=("a", "b"), raw_scores=True)
    sidecar = parse_rerank_body(
        json.dumps({"query": "q", "documents": [{"id": "x", "text": "a"}]}).encode(),
        max_client_batch_size=32,
    )
    assert sidecar == RerankJob(shape="sidecar", query="q", texts=("a",), ids=("x",))
    assert json.loads(render_scores(sidecar, [0.5])) == {"scores": [{"id": "x", "score": 0.5}]}


EXPECTED = (
    "expected `texts` (TEI), `documents` as strings (Jina/vLLM) or as {id, text} objects (sidecar)"
)


def test_a_body_that_fits_no_shape_is_refused_naming_the_three() -> None:
    error = shape_refusal({"query": "q", "passages": ["a"]})
    assert (error.status, error.kind) == (422, "Validation")
    assert error.message == f"{EXPECTED}: the body has neither `texts` nor `documents`"
    both = shape_refusal({"query": "q", "texts": ["a"], "documents": ["a"]})
    assert both.message == f"{EXPECTED}: give one, not both"


@pytest.mark.parametrize(
    ("documents", "says"),
    [
        (
            ["a", "b", {"id": "x", "text": "c"}],
            "`documents[2]` must be a string like `documents[0]`, got an object",
        ),
        (
            [{"id": "x", "text": "a"}, "b"],
            "`documents[1]` must be an object like `documents[0]`, got a string",
        ),
        (["a", 7], "`documents[1]` must be a string like `documents[0]`, got a number"),
    ],
)
def test_a_mixed_documents_list_is_refused_naming_the_position(
    documents: list[object], says: str
) -> None:
    error = shape_refusal({"query": "q", "documents": documents})
    assert (error.status, error.kind) == (422, "Validation")
    assert error.message.startswith(says)
    assert error.message.endswith(
        "give every document as a string (Jina/vLLM) or every one as {id, text} (sidecar)"
    )


def test_a_first_document_of_neither_kind_is_refused_naming_both_kinds() -> None:
    error = shape_refusal({"query": "q", "documents": [3, "a"]})
    assert error.message == (
        "`documents[0]` must be a string (Jina/vLLM) or an {id, text} object (sidecar), "
        "got a number"
    )


def test_a_jina_style_text_object_on_rerank_is_told_where_it_is_read() -> None:
    error = refusal(json.dumps({"query": "q", "documents": [{"text": "a"}]}).encode())
    assert error.message == (
        "`documents[0]` has no `id` (the sidecar's {id, text}; Jina's {text} objects go to "
        "/v1/rerank)"
    )
