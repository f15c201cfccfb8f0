"""Cohere's v2 shape for ``POST /v2/rerank`` as pure functions: bodies read, answers and errors
rendered, each checked against the documented contract (tests/client/contracts/schemas/cohere.json).

Scores are made distinct and out of input order, so a result whose ``index`` does not name its
own document, or an answer in input order, fails here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage.client.error_bodies import batch_cap, error_message
from retrieval_stage.server import cohere
from retrieval_stage.server.wire import Answer, ApiError, ServedModel

from ..client.contracts import contract

SERVING = ServedModel(model="served/model-a", max_client_batch_size=32, max_input_length=256)
QUERY = "how do I delete a directory tree"
TEXTS = ["json strings", "shutil.rmtree removes a tree", "os.rmdir", "bananas", "pathlib"]
# Index 1 best, then 3, 0, 4, 2: neither input order nor its reverse.
SCORES = [0.5, 0.9, 0.1, 0.7, 0.3]


def body(**fields: Any) -> bytes:
    return json.dumps(
        {"model": SERVING.model, "query": QUERY, "documents": TEXTS, **fields}
    ).encode()


def refusal(raw: bytes, serving: ServedModel = SERVING) -> ApiError:
    with pytest.raises(ApiError) as caught:
        cohere.parse(raw, serving)
    return caught.value


def answer(raw: bytes, scores: list[float] = SCORES, tokens: int = 40) -> dict[str, Any]:
    request = cohere.parse(raw, SERVING)
    out: dict[str, Any] = json.loads(cohere.render(Answer(request, scores, tokens)))
    return out


def test_a_v2_body_reads_into_the_servers_job() -> None:
    request = cohere.parse(body(top_n=3, max_tokens_per_doc=4096, priority=5), SERVING)
    assert request.job.shape == "cohere"
    assert request.job.query == QUERY
    assert request.job.texts == tuple(TEXTS)
    assert request.model == SERVING.model
    assert request.top_n == 3
    assert request.return_documents is False


def test_the_answer_is_sorted_by_score_and_each_index_names_its_own_document() -> None:
    reply = answer(body())
    contract.validate(contract.response_schema("cohere"), reply)
    results = reply["results"]
    assert [r["index"] for r in results] == [1, 3, 0, 4, 2]
    for r in results:
        assert set(r) == {"index", "relevance_score"}
        assert r["relevance_score"] == SCORES[r["index"]]
    assert isinstance(reply["id"], str)
    assert reply["id"]
    assert reply["meta"]["api_version"] == {"version": "2"}
    assert reply["meta"]["tokens"]["input_tokens"] == 40


def test_top_n_keeps_the_best_n_and_more_than_there_are_keeps_all() -> None:
    assert [r["index"] for r in answer(body(top_n=2))["results"]] == [1, 3]
    assert [r["index"] for r in answer(body(top_n=50))["results"]] == [1, 3, 0, 4, 2]
    assert len(answer(body(top_n=None))["results"]) == len(TEXTS), "null: every document"


def test_ties_keep_input_order() -> None:
    reply = answer(body(), scores=[0.2, 0.5, 0.5, 0.2, 0.5])
    assert [r["index"] for r in reply["results"]] == [1, 2, 4, 0, 3]


@pytest.mark.parametrize(("documents", "units"), [(1, 1), (100, 1), (101, 2), (250, 3)])
def test_search_units_count_a_hundred_documents_each(documents: int, units: int) -> None:
    texts = [f"t{i}" for i in range(documents)]
    serving = ServedModel(SERVING.model, max_client_batch_size=1000, max_input_length=256)
    request = cohere.parse(body(documents=texts), serving)
    reply = json.loads(cohere.render(Answer(request, [0.0] * documents, 1)))
    assert reply["meta"]["billed_units"] == {"search_units": units}


def test_a_model_not_served_is_a_404_naming_both_models_in_cohere_error_shape() -> None:
    error = refusal(body(model="rerank-v3.5"))
    assert error.status == 404
    assert "rerank-v3.5" in error.message
    assert SERVING.model in error.message
    reply = json.loads(cohere.error_body(error))
    assert reply == {"message": error.message}
    contract.validate(contract.error("cohere", "404")["body"], reply)


@pytest.mark.parametrize(
    ("fields", "status", "named"),
    [
        ({"model": None}, 422, "model"),
        ({"query": 3}, 422, "query"),
        ({"documents": []}, 400, "documents"),
        ({"documents": "one text"}, 422, "documents"),
        ({"documents": ["a", {"text": "b"}]}, 422, "documents[1]"),
        ({"top_n": 0}, 422, "top_n"),
        ({"top_n": True}, 422, "top_n"),
        ({"top_n": "2"}, 422, "top_n"),
        ({"max_tokens_per_doc": 0}, 422, "max_tokens_per_doc"),
        ({"max_tokens_per_doc": 100}, 422, "max_tokens_per_doc"),
        ({"priority": 1000}, 422, "priority"),
        ({"priority": -1}, 422, "priority"),  # the lower bound (issue 51, point 9)
    ],
)
def test_a_malformed_body_is_refused_naming_the_field(
    fields: dict[str, Any], status: int, named: str
) -> None:
    error = refusal(body(**fields))
    assert error.status == status
    assert f"`{named}`" in error.message
    assert QUERY not in error.message, "never echoed"
    assert "one text" not in error.message, "never echoed"
    contract.validate(
        contract.error("cohere", str(status))["body"], json.loads(cohere.error_body(error))
    )


def test_missing_fields_are_named() -> None:
    for name in ("model", "query", "documents"):
        raw = json.loads(body())
        del raw[name]
        error = refusal(json.dumps(raw).encode())
        assert error.status == 422
        assert f"missing field `{name}`" in error.message


def test_not_json_is_a_400_in_cohere_shape() -> None:
    error = refusal(b"{not json")
    assert error.status == 400
    assert set(json.loads(cohere.error_body(error))) == {"message"}


def test_more_documents_than_the_cap_are_refused_in_words_our_client_learns_the_cap_from() -> None:
    error = refusal(body(documents=[f"t{i}" for i in range(40)]))
    assert error.status == 422
    content = cohere.error_body(error)
    assert batch_cap(content, 40) == 32
    assert error_message(content) == "batch size 40 > maximum allowed batch size 32"


def test_a_non_finite_score_is_a_model_failure_never_sent() -> None:
    request = cohere.parse(body(), SERVING)
    with pytest.raises(ApiError) as caught:
        cohere.render(Answer(request, [0.1, math.nan, 0.2, 0.3, 0.4], 1))
    assert caught.value.status == 424


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.data())
def test_every_documented_request_is_read_as_sent(data: st.DataObject) -> None:
    """Bodies drawn from the documented request schema, naming the served model: each is read
    with its own documents in order and its own top_n, or refused for the one documented value
    this server cannot honour (an empty list, a cut below the model's input length)."""
    raw = data.draw(contract.strategy(contract.request_schema("cohere")))
    raw["model"] = SERVING.model
    contract.validate(contract.request_schema("cohere"), raw)
    documents, cut = raw["documents"], raw.get("max_tokens_per_doc")
    if len(documents) > SERVING.max_client_batch_size:
        return
    if not documents or (cut is not None and cut < SERVING.max_input_length):
        assert refusal(json.dumps(raw).encode()).status in (400, 422)
        return
    request = cohere.parse(json.dumps(raw).encode(), SERVING)
    assert request.job.texts == tuple(documents)
    assert request.top_n == raw.get("top_n")


def test_a_huge_model_string_is_never_quoted_back_only_a_short_marked_prefix() -> None:
    """1.9 MB of model name in, a short refusal out (issue 51, point 8)."""
    huge = "rerank-" + "x" * 1_900_000 + "TAILMARK"
    error = refusal(body(model=huge))
    assert error.status == 404
    assert error.message == (
        f"the model `{huge[:40]}…` is not served here: this server serves `{SERVING.model}`"
    )
    assert len(cohere.error_body(error)) < 200
