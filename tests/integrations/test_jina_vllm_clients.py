"""Clients written for vLLM's and Infinity's ``/rerank``, pointed at `retrieval-stage serve`'s root
the way their docs show, unchanged (issue 51).

LiteLLM's ``infinity/`` and ``hosted_vllm/`` rerank providers and LlamaIndex's ``JinaRerank``
with a root ``base_url`` post a Jina/vLLM body (``documents`` as strings, ``top_n``) to
``/rerank``; `serve` used to read it as the sidecar's ``documents: [{id, text}]`` and answer 422.
Each client here must get every result the server's own score for its own document, best
first. None of them needs a real key: LiteLLM sends ``Bearer None`` (``infinity/``) or ``Bearer
fake-api-key`` (``hosted_vllm/``) when given none, ``JinaRerank`` ``Bearer `` (an empty key), and
`serve` reads no key. Run in .venv-frameworks (tests/integrations/setup.sh pins ``litellm`` and
``llama-index-postprocessor-jinaai-rerank``); skipped where they are not installed. The server
is `serve` with the lexical reranker (no model to load: the HTTP behaviour is the same).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

# LiteLLM fetches its model price map from the network when imported unless told to use the
# copy it ships: test traffic stays on loopback.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytest.importorskip("uvicorn", reason="`serve` needs the [server] extra")

from ..server.served import Served, start_server

QUERY = "how do I parse json in python"
TOPICS = ["json", "parsing", "python", "rust", "bananas", "files", "http", "yaml"]
TEXTS = [f"note {i}: {TOPICS[i % 8]} and {TOPICS[(i * 3) % 8]} {i}" for i in range(50)]
TOP_N = 5


@pytest.fixture(scope="module")
def lexical(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`retrieval-stage serve --reranker lexical` with its default cap (128)."""
    with start_server(tmp_path_factory.mktemp("jina-vllm"), "--reranker", "lexical") as served:
        yield served


def model_of(served: Served) -> str:
    model: str = httpx.get(served.url + "/info", timeout=30.0).json()["model_id"]
    return model


def tei_scores(served: Served, texts: list[str]) -> dict[int, float]:
    """The server's own TEI answer for the same texts, by index."""
    reply = httpx.post(served.url + "/rerank", json={"query": QUERY, "texts": texts}, timeout=60)
    assert reply.status_code == 200, reply.text
    return {r["index"]: r["score"] for r in reply.json()}


def best(scores: dict[int, float], n: int) -> list[int]:
    return sorted(scores, key=lambda i: (-scores[i], i))[:n]


def check(results: list[Any], expected: dict[int, float], n: int) -> None:
    """`results` (index, score) pairs are the server's top `n`, each with its own score."""
    assert [i for i, _ in results] == best(expected, n)
    for index, score in results:
        assert score == pytest.approx(expected[index], abs=1e-9), index


@pytest.mark.parametrize("provider", ["infinity", "hosted_vllm"])
def test_litellms_provider_reranks_50_documents_against_serves_root_without_a_key(
    lexical: Served, provider: str
) -> None:
    litellm = pytest.importorskip("litellm", reason="litellm: tests/integrations/setup.sh")
    expected = tei_scores(lexical, TEXTS)
    response = litellm.rerank(
        model=f"{provider}/{model_of(lexical)}",
        query=QUERY,
        documents=TEXTS,
        top_n=TOP_N,
        api_base=lexical.url,
    )
    check([(r["index"], r["relevance_score"]) for r in response.results], expected, TOP_N)


@pytest.mark.parametrize("provider", ["infinity", "hosted_vllm"])
def test_litellms_async_rerank_gets_every_document_without_top_n(
    lexical: Served, provider: str
) -> None:
    litellm = pytest.importorskip("litellm", reason="litellm: tests/integrations/setup.sh")
    texts = TEXTS[:12]
    expected = tei_scores(lexical, texts)
    response = asyncio.run(
        litellm.arerank(
            model=f"{provider}/{model_of(lexical)}",
            query=QUERY,
            documents=texts,
            api_base=lexical.url,
        )
    )
    check([(r["index"], r["relevance_score"]) for r in response.results], expected, len(texts))


def test_litellm_with_a_model_serve_does_not_serve_is_told_which_it_does(lexical: Served) -> None:
    litellm = pytest.importorskip("litellm", reason="litellm: tests/integrations/setup.sh")
    with pytest.raises(litellm.NotFoundError) as caught:
        litellm.rerank(
            model="hosted_vllm/BAAI/bge-reranker-v2-m3",
            query=QUERY,
            documents=TEXTS[:3],
            api_base=lexical.url,
        )
    assert "BAAI/bge-reranker-v2-m3" in str(caught.value)
    assert model_of(lexical) in str(caught.value)


def _nodes(texts: list[str]) -> list[Any]:
    from llama_index.core.schema import NodeWithScore, TextNode

    return [
        NodeWithScore(node=TextNode(id_=f"n{i}", text=t), score=1.0 - i / len(texts))
        for i, t in enumerate(texts)
    ]


def test_llama_indexs_jina_rerank_with_a_root_base_url_reranks_50_nodes(lexical: Served) -> None:
    jinaai = pytest.importorskip(
        "llama_index.postprocessor.jinaai_rerank",
        reason="llama-index-postprocessor-jinaai-rerank: tests/integrations/setup.sh",
    )
    from llama_index.core.schema import QueryBundle

    expected = tei_scores(lexical, TEXTS)
    reranker = jinaai.JinaRerank(base_url=lexical.url, model=model_of(lexical), top_n=TOP_N)
    kept = reranker.postprocess_nodes(_nodes(TEXTS), query_bundle=QueryBundle(QUERY))
    assert [n.node.node_id for n in kept] == [f"n{i}" for i in best(expected, TOP_N)]
    for node in kept:
        index = int(node.node.node_id[1:])
        assert node.node.get_content() == TEXTS[index]
        assert node.score == pytest.approx(expected[index], abs=1e-9)


def test_llama_indexs_jina_rerank_with_its_default_model_reads_serves_refusal(
    lexical: Served,
) -> None:
    """Its default model is Jina's: serve's 404 comes in Jina's shape, whose ``detail``
    JinaRerank raises, naming the model to give instead."""
    jinaai = pytest.importorskip(
        "llama_index.postprocessor.jinaai_rerank",
        reason="llama-index-postprocessor-jinaai-rerank: tests/integrations/setup.sh",
    )
    from llama_index.core.schema import QueryBundle

    reranker = jinaai.JinaRerank(base_url=lexical.url, top_n=2)
    with pytest.raises(RuntimeError) as caught:
        reranker.postprocess_nodes(_nodes(TEXTS[:3]), query_bundle=QueryBundle(QUERY))
    assert model_of(lexical) in str(caught.value)
