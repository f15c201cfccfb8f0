"""Jina's shape for ``POST /v1/rerank`` as pure functions: bodies read (strings or objects with
``text``), answers and errors rendered, checked against the documented contract
(tests/client/contracts/schemas/jina.json).

Scores are distinct and out of input order, and every document's text is different, so a
result that carries another document's index or text fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from retrieval_stage.client.error_bodies import batch_cap, error_message
from retrieval_stage.server import jina
from retrieval_stage.server.wire import Answer, ApiError, ServedModel

from ..client.contracts import contract

SERVING = ServedModel(model="served/model-a", max_client_batch_size=32, max_input_length=256)
QUERY = "how do I delete a directory tree"
TEXTS = ["json strings", "shutil.rmtree removes a tree", "os.rmdir", "bananas", "pathlib"]
SCORES = [0.5, 0.9, 0.1, 0.7, 0.3]


def body(**fields: Any) -> bytes:
    return json.dumps(
        {"model": SERVING.model, "query": QUERY, "documents": TEXTS, **fields}
    ).encode()


def refusal(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        jina.parse(raw, SERVING)
    return caught.value


def answer(raw: bytes, tokens: int = 40) -> dict[str, Any]:
    request = jina.parse(raw, SERVING)
    out: dict[str, Any] = json.loads(jina.render(Answer(request, SCORES, tokens)))
    return out


def test_strings_and_objects_with_text_read_into_one_job_in_input_order() -> None:
    documents: list[Any] = [{"text": TEXTS[0]}, TEXTS[1], {"text": TEXTS[2]}, *TEXTS[3:]]
    request = jina.parse(body(documents=documents, top_n=2), SERVING)
    assert request.job.shape == "jina"
    assert request.job.texts == tuple(TEXTS)
    assert request.top_n == 2
    assert request.return_documents is True, "Jina's default"


def test_the_answer_is_sorted_and_each_result_carries_its_own_index_and_text() -> None:
    reply = answer(body())
    contract.validate(contract.response_schema("jina"), reply)
    assert reply["model"] == SERVING.model
    assert reply["usage"] == {"total_tokens": 40, "prompt_tokens": 40}
    assert [r["index"] for r in reply["results"]] == [1, 3, 0, 4, 2]
    for r in reply["results"]:
        assert set(r) == {"index", "relevance_score", "document"}
        assert r["relevance_score"] == SCORES[r["index"]]
        assert r["document"] == {"text": TEXTS[r["index"]]}


def test_return_documents_false_leaves_the_texts_out_and_top_n_cuts() -> None:
    reply = answer(body(return_documents=False, top_n=3))
    assert reply["results"] == [
        {"index": 1, "relevance_score": 0.9},
        {"index": 3, "relevance_score": 0.7},
        {"index": 0, "relevance_score": 0.5},
    ]


def test_a_model_not_served_is_a_404_naming_both_in_fastapis_shape() -> None:
    error = refusal(body(model="jina-reranker-v2-base-multilingual"))
    assert error.status == 404
    assert "jina-reranker-v2-base-multilingual" in error.message
    assert SERVING.model in error.message
    assert json.loads(jina.error_body(error)) == {"detail": error.message}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"documents": [TEXTS[0], 7]}, "documents[1]"),
        ({"documents": [{"image": "https://example.invalid/a.png"}]}, "documents[0]"),
        ({"documents": [{"text": None}]}, "documents[0].text"),
        ({"return_documents": "yes"}, "return_documents"),
        ({"top_n": -1}, "top_n"),
        ({"model": 1}, "model"),
    ],
)
def test_a_malformed_body_is_a_422_in_fastapis_validation_list(
    fields: dict[str, Any], named: str
) -> None:
    error = refusal(body(**fields))
    assert error.status == 422
    assert f"`{named}`" in error.message
    reply = json.loads(jina.error_body(error))
    contract.validate(contract.error("jina", "422")["body"], reply)
    assert reply["detail"][0]["msg"] == error.message


def test_an_image_document_is_refused_as_such() -> None:
    error = refusal(body(documents=[{"image": "https://example.invalid/a.png"}]))
    assert "image" in error.message


def test_more_documents_than_the_cap_are_refused_in_words_our_client_learns_the_cap_from() -> None:
    error = refusal(body(documents=[f"t{i}" for i in range(33)]))
    content = jina.error_body(error)
    assert batch_cap(content, 33) == 32
    assert "batch size 33 > maximum allowed batch size 32" in error_message(content)


def test_an_empty_list_is_a_400_with_its_detail_as_text() -> None:
    error = refusal(body(documents=[]))
    assert error.status == 400
    assert json.loads(jina.error_body(error)) == {"detail": "`documents` cannot be empty"}


# -- the same body posted to POST /rerank, as vLLM and Infinity take it (issue 51) -------------


def plain(**fields: Any) -> dict[str, Any]:
    return {"query": QUERY, "documents": TEXTS, **fields}


def plain_refusal(fields: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        jina.read_plain(fields, SERVING)
    return caught.value


def test_on_rerank_the_model_may_be_left_out_and_the_served_one_answers() -> None:
    for fields in (plain(), plain(model=None), plain(model=SERVING.model)):
        request = jina.read_plain(fields, SERVING)
        assert request.model == SERVING.model
        assert request.job.texts == tuple(TEXTS)
        assert request.job.shape == "jina"


def test_on_rerank_top_n_zero_is_every_document_as_vllm_reads_it() -> None:
    assert jina.read_plain(plain(top_n=0), SERVING).top_n is None
    assert jina.read_plain(plain(top_n=2), SERVING).top_n == 2
    assert "`top_n` must be at least 0" in plain_refusal(plain(top_n=-1)).message


def test_on_rerank_the_answer_is_jinas_without_documents_whatever_return_documents_says() -> None:
    for flag in (True, False, None):
        request = jina.read_plain(plain(return_documents=flag, top_n=3), SERVING)
        reply = json.loads(jina.PLAIN.render(Answer(request, SCORES, 40)))
        assert reply == {
            "model": SERVING.model,
            "usage": {"total_tokens": 40, "prompt_tokens": 40},
            "results": [
                {"index": 1, "relevance_score": 0.9},
                {"index": 3, "relevance_score": 0.7},
                {"index": 0, "relevance_score": 0.5},
            ],
        }
    assert (
        "`return_documents` must be a boolean"
        in plain_refusal(plain(return_documents="yes")).message
    )


@pytest.mark.parametrize(
    ("fields", "status", "named"),
    [
        (plain(model="other/model"), 404, "other/model"),
        (plain(model=7), 422, "`model`"),
        ({"documents": TEXTS}, 422, "`query`"),
        (plain(documents=[f"t{i}" for i in range(33)]), 422, "maximum allowed batch size 32"),
        (plain(documents=["a", "\ud800"]), 422, "`documents[1]`"),
    ],
)
def test_on_rerank_a_bad_body_is_refused_in_fastapis_shape_naming_the_field(
    fields: dict[str, Any], status: int, named: str
) -> None:
    error = plain_refusal(fields)
    assert error.status == status
    assert named in error.message
    detail = json.loads(jina.PLAIN.error_body(error))["detail"]
    assert (detail[0]["msg"] if status == 422 else detail) == error.message


def test_a_huge_model_string_is_never_quoted_back_only_a_short_marked_prefix() -> None:
    """1.9 MB of model name in, a short refusal out (issue 51, point 8)."""
    huge = "x" * 1_900_000 + "TAILMARK"
    for error in (refusal(body(model=huge)), plain_refusal(plain(model=huge))):
        assert error.status == 404
        assert len(error.message) < 200
        assert f"`{'x' * 40}…`" in error.message
        assert "TAILMARK" not in error.message
        assert SERVING.model in error.message
        assert len(jina.error_body(error)) < 300
