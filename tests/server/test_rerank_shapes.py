"""``POST /rerank`` reads three bodies, each answered in its caller's shape, against a real `serve`.

TEI's (``texts``) and the sidecar's (``documents: [{id, text}]``) as before, and, since issue 51,
Jina's/vLLM's (``documents`` as strings, ``top_n``), which LiteLLM's ``infinity/`` and
``hosted_vllm/`` providers and LlamaIndex's ``JinaRerank`` post to ``/rerank`` when pointed at
the root, as vLLM and Infinity take it there: answered as ``/v1/rerank`` answers (``results``
of ``{index, relevance_score}`` best first, ``model``, ``usage``), its errors in the same
FastAPI shape. Scores are checked against the same server's TEI answer, joined by ``index``.
Also here: a hosted route's 404 for a model it does not serve never quotes the caller's
string back (point 8), on every route that checks a model.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from retrieval_stage import RerankClient, RerankStatusError

from .served import Served

QUERY = "how do I delete a directory tree"
TEXTS = [
    "json.dumps serializes an object to a JSON string",
    "shutil.rmtree removes a directory and everything below it",
    "os.rmdir removes an empty directory",
    "pathlib.Path.unlink removes a file",
    "bananas are yellow",
]


def post(url: str, body: object, path: str = "/rerank") -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60.0)


def served_model(url: str) -> str:
    model: str = httpx.get(url + "/info", timeout=30.0).json()["model_id"]
    return model


def tei_scores(url: str, texts: list[str]) -> dict[int, float]:
    reply = post(url, {"query": QUERY, "texts": texts})
    assert reply.status_code == 200, reply.text
    return {r["index"]: r["score"] for r in reply.json()}


@pytest.mark.parametrize("model", ["served", None, "absent"])
@pytest.mark.parametrize("top_n", [None, 0, 3])
def test_a_jina_vllm_body_is_answered_in_jinas_shape_by_index_best_first(
    lexical_server: Served, model: str | None, top_n: int | None
) -> None:
    url = lexical_server.url
    expected = tei_scores(url, TEXTS)
    body: dict[str, Any] = {"query": QUERY, "documents": TEXTS, "return_documents": True}
    if model != "absent":
        body["model"] = served_model(url) if model == "served" else None
    if top_n is not None:
        body["top_n"] = top_n
    reply = post(url, body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert set(answer) == {"model", "usage", "results"}
    assert answer["model"] == served_model(url)
    assert answer["usage"]["total_tokens"] == int(reply.headers["x-compute-tokens"])
    results = answer["results"]
    best = sorted(expected, key=lambda i: (-expected[i], i))[: top_n or None]
    assert [r["index"] for r in results] == best
    for r in results:
        assert set(r) == {"index", "relevance_score"}, "no `document`: see jina.py"
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-9)


def test_teis_and_the_sidecars_answers_keep_their_exact_shapes(lexical_server: Served) -> None:
    url = lexical_server.url
    tei = post(url, {"query": QUERY, "texts": TEXTS[:2]}).json()
    assert isinstance(tei, list)
    assert all(set(r) == {"index", "score"} for r in tei)
    sidecar = post(url, {"query": QUERY, "documents": [{"id": "b", "text": TEXTS[1]}]}).json()
    assert list(sidecar) == ["scores"]
    assert [set(s) for s in sidecar["scores"]] == [{"id", "score"}]


def _detail(reply: httpx.Response, status: int) -> Any:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"detail"}, "a Jina/vLLM body's refusal is in its own (FastAPI) shape"
    return body["detail"]


def test_a_jina_vllm_bodys_refusals_are_in_fastapis_shape(lexical_server: Served) -> None:
    url = lexical_server.url
    wrong = _detail(post(url, {"model": "other-model", "query": QUERY, "documents": ["a"]}), 404)
    assert "`other-model`" in wrong
    assert served_model(url) in wrong
    many = _detail(post(url, {"query": QUERY, "documents": [f"t{i}" for i in range(129)]}), 422)
    assert many[0]["msg"] == "batch size 129 > maximum allowed batch size 128"
    no_query = _detail(post(url, {"documents": ["a"]}), 422)
    assert no_query[0]["msg"] == "missing field `query`"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"query": QUERY, "passages": ["a"]},
            "expected `texts` (TEI), `documents` as strings (Jina/vLLM) or as {id, text} "
            "objects (sidecar): the body has neither `texts` nor `documents`",
        ),
        (
            {"query": QUERY, "documents": ["a", {"id": "x", "text": "b"}]},
            "`documents[1]` must be a string like `documents[0]`, got an object: give every "
            "document as a string (Jina/vLLM) or every one as {id, text} (sidecar)",
        ),
    ],
)
def test_a_body_that_fits_no_shape_is_a_422_in_teis_shape_naming_what_it_lacks(
    lexical_server: Served, body: dict[str, Any], says: str
) -> None:
    reply = post(lexical_server.url, body)
    assert reply.status_code == 422
    assert reply.json() == {"error": says, "error_type": "Validation"}


def test_our_infinity_client_reranks_against_serves_rerank_in_one_request(
    lexical_server: Served,
) -> None:
    """``provider="infinity"`` posts Infinity's body to ``/rerank``: 50 documents, one request
    (the server's cap is 128), every score the server's own for its document."""
    texts = [f"{TEXTS[i % 5]} (note {i})" for i in range(50)]
    expected = tei_scores(lexical_server.url, texts)
    with RerankClient(lexical_server.url, provider="infinity") as client:
        response = client.rerank_response(QUERY, list(range(50)), text=lambda i: texts[i])
        top = client.rerank_response(QUERY, list(range(50)), text=lambda i: texts[i], top_k=4)
    assert (response.requests, top.requests) == (1, 1)
    assert sorted(i for i, _ in response.results) == list(range(50))
    for i, score in response.results:
        assert score == pytest.approx(expected[i], abs=1e-9)
    assert [i for i, _ in top.results] == [i for i, _ in response.results[:4]]
    assert response.model == served_model(lexical_server.url)


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v2/rerank", "message"), ("/v1/rerank", "detail"), ("/rerank", "detail")],
)
def test_a_huge_model_string_gets_a_small_404_that_does_not_contain_it(
    lexical_server: Served, path: str, shape: str
) -> None:
    """1.9 MB of model name in: the 404 names the served model and at most the first 40
    characters of the caller's, marked as cut (issue 51, point 8)."""
    huge = "m" * 1_900_000 + "TAILMARK"
    reply = post(lexical_server.url, {"model": huge, "query": QUERY, "documents": ["a"]}, path)
    assert reply.status_code == 404, reply.text[:300]
    assert len(reply.content) < 300
    assert b"TAILMARK" not in reply.content
    message = reply.json()[shape]
    assert f"`{'m' * 40}…`" in message
    assert served_model(lexical_server.url) in message


def test_our_jina_client_sees_the_cut_model_name_in_its_status_error(
    lexical_server: Served,
) -> None:
    huge = "n" * 10_000
    with (
        RerankClient(lexical_server.url, provider="jina", model=huge) as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank(QUERY, ["a", "b"])
    assert caught.value.status_code == 404
    assert len(str(caught.value)) < 400
    assert served_model(lexical_server.url) in str(caught.value)
